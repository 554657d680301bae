"""History entries as JSON lines: how FileStore and MinioStore write and read them.

One entry a line, compact, with ``seq`` as its first key, so a reader can find an
entry's seq without parsing the entry (:func:`seq_of`). Only complete lines count: the
bytes after the last newline are a write that a crash cut short.

With the ``fast`` extra installed, lines are written and read with orjson, some ten times
faster than the standard library's ``json`` (a load of a long history is mostly parsing,
a save mostly its page cache write and fsync, and the rest mostly encoding). It handles
what ``json`` handles the same way, except for what it cannot do exactly as ``json`` does:
then ``json`` does it (NaN and infinities, which orjson would write as ``null``; integers
past 64 bits; lone surrogates; keys that are not strings; subclasses of ``str``, ``int``,
``dict`` and ``list``; datetimes and dataclasses, which ``json`` refuses). Both read the
other's lines: orjson writes non-ASCII text as UTF-8, ``json`` as escapes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

try:
    import orjson
except ImportError:  # without the fast extra: json does it all
    orjson = None  # type: ignore[assignment]

_SEQ_FIRST = re.compile(rb'\{"seq":(\d+)[,}]')
_ENCODER = json.JSONEncoder(separators=(",", ":"))  # one for all: a save makes no new one
_OPTIONS = (
    0
    if orjson is None
    else orjson.OPT_PASSTHROUGH_SUBCLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_DATACLASS
)


def encode_line(entry: dict[str, Any]) -> bytes:
    """One entry as a JSON line (without its newline), ``seq`` first."""
    seq = entry["seq"]
    if type(seq) is not int or next(iter(entry)) != "seq":  # Entry.to_dict's is as it should be
        entry = {"seq": int(seq), **{k: v for k, v in entry.items() if k != "seq"}}
    return dumps(entry)


def dumps(value: Any) -> bytes:
    """``value`` as compact JSON, the same as ``json.dumps`` gives (see the module's text)."""
    if orjson is not None:
        try:
            line = orjson.dumps(value, default=_refuse, option=_OPTIONS)
        except TypeError:  # orjson.JSONEncodeError is one: json decides
            pass
        else:
            if b"null" not in line:  # NaN and infinities would be null too: json writes those
                return line
    return _ENCODER.encode(value).encode()


def loads(line: bytes | memoryview) -> Any:
    """One JSON value, as ``json.loads`` reads it (``ValueError`` when it is not JSON)."""
    if orjson is not None:
        try:
            return orjson.loads(line)
        except orjson.JSONDecodeError:  # NaN, a big integer, a lone surrogate, or not JSON
            pass
    return json.loads(bytes(line) if isinstance(line, memoryview) else line)


def _refuse(value: Any) -> Any:
    raise TypeError(f"{type(value).__name__} is left to json")


def encode(entries: Iterable[dict[str, Any]]) -> bytes:
    """Entries as JSON lines, each ending in a newline."""
    return b"".join(encode_line(entry) + b"\n" for entry in entries)


def complete_lines(raw: bytes) -> list[bytes]:
    """The non-blank lines of ``raw`` that end in a newline (the rest is a torn write)."""
    return [line for line in raw.split(b"\n")[:-1] if line.strip()]


def decode(raw: bytes, where: str = "the history") -> list[dict[str, Any]]:
    """The entries of the complete lines of ``raw``; ``ValueError`` naming the line (of
    ``where``) that is not a JSON entry."""
    entries = []
    for number, line in enumerate(raw.split(b"\n")[:-1], 1):
        if line.strip():
            try:
                entry = loads(line)
                int(entry["seq"])
            except (ValueError, TypeError, KeyError) as error:
                raise ValueError(
                    f"line {number} of {where} is not a JSON entry ({type(error).__name__}: "
                    f"{error})"
                ) from None
            entries.append(entry)
    return entries


def seq_of(line: bytes) -> int:
    """The seq of an entry's line, read without parsing the entry when it comes first."""
    found = _SEQ_FIRST.match(line)
    return int(found.group(1)) if found else int(json.loads(line)["seq"])
