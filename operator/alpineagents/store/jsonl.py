"""History entries as JSON lines: how FileStore and MinioStore write and read them.

One entry a line, compact, with ``seq`` as its first key, so a reader can find an
entry's seq without parsing the entry (:func:`seq_of`). Only complete lines count: the
bytes after the last newline are a write that a crash cut short.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

_SEQ_FIRST = re.compile(rb'\{"seq":(\d+)[,}]')


def encode_line(entry: dict[str, Any]) -> bytes:
    """One entry as a JSON line (without its newline), ``seq`` first."""
    seq = int(entry["seq"])
    ordered = {"seq": seq, **{k: v for k, v in entry.items() if k != "seq"}}
    return json.dumps(ordered, separators=(",", ":")).encode()


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
                entry = json.loads(line)
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
