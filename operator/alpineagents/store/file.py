"""FileStore: the embedded default, one folder on local disk.

Layout: ``<folder>/<encoded id>/history.jsonl`` and ``info.json``.

- ``history.jsonl`` is append-only. Each save appends its new entries, one JSON line each
  (``seq`` first), and fsyncs once: one write and one fsync in the common case, whatever
  the history's length. A FileStore keeps open the histories it saved last, with what it
  knows of their end; a save checks with a stat of the path that the file is still the one
  it wrote, at the size it left it (otherwise it opens it again and reads its end back). Two other kinds of line carry the State's info, so that a save
  need not rewrite a second file:

  - ``{"info": {...}, "unset": [...]}``: the keys of the info that changed otherwise than
    the entries say. A save's info is taken to have ``updated_at`` = the time of its last
    entry and ``entries`` = its last seq + 1 (when the info has those keys); only what
    differs from that is written (in a run: the turns and token counts after a reply, the
    answer, ``stopped``).
  - ``{"store": "info.json"}``: ``info.json`` holds the info as of this line.

- ``info.json`` is the info as a save gave it, rewritten atomically (fsynced, renamed) when
  the State is created and whenever the lines since the last ``{"store": "info.json"}``
  pass 64 KiB, then marked with such a line. So ``list()`` reads ``info.json`` and at most
  that much of the history's end, and a load reads the history once.

The info of a State is ``info.json`` with the lines after the last mark applied in order
(an entry sets the two keys above; an info line sets and unsets its keys). Every step sets
a value, so applying lines that ``info.json`` already holds changes nothing: a crash
between rewriting ``info.json`` and appending its mark is harmless. A crash mid-append
leaves a torn last line: it is cut on the next save and ignored on load; what an fsync
acknowledged is never lost. A new State is written in a temporary folder and renamed into
place, which is all-or-nothing and refuses an existing id. Folders written before info
lines existed (``info.json`` replaced on every save, no marks) read the same way.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import secrets
import shutil
import threading
import weakref
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from .. import collection
from ..errors import StateFormatError
from . import jsonl
from .base import Record, StateInfo, Store, encode_id, exists_error, not_found_error

_HISTORY = "history.jsonl"
_INFO = "info.json"
_MARK = b'{"store":"info.json"}'
_CHECKPOINT_AFTER = 1 << 16  # bytes of lines after the last mark that make info.json rewritten
_CHUNK = 1 << 16  # bytes read at a time from a history's end
_DERIVED = ("updated_at", "entries")  # info keys an entry sets (see the module docstring)
_KEPT_OPEN = 16  # histories a FileStore keeps open between saves (one a State it saves)
_sync = getattr(os, "fdatasync", os.fsync)  # an append needs the data and the size, not mtime


@dataclass
class _Tail:
    """What a FileStore knows of a history's end after its own last write."""

    folder: Path  # the State's
    history: str  # its history's path
    fd: int  # the history, kept open for the next save (see FileStore._open)
    inode: int
    size: int  # bytes, all complete lines
    have: int  # entries (the last seq + 1)
    info: dict[str, Any]  # the info as of ``size``
    since_mark: int  # bytes after the last mark (or from the start, with none)


class FileStore(Store):
    """Saves each State in a folder of its own under ``folder``, readable only by its owner."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        # The histories this store saved last, each kept open with what is known of its
        # end, so that a save costs a stat, one write and one fsync (see _open).
        self._tails: dict[str, _Tail] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        weakref.finalize(self, _close_all, self._tails)

    def __repr__(self) -> str:
        return f"FileStore({str(self.folder)!r})"

    def same_as(self, other: Store) -> bool:
        return isinstance(other, FileStore) and _real(self.folder) == _real(other.folder)

    # ------------------------------------------------------------ Store interface
    def write(
        self,
        state_id: str,
        entries: list[dict[str, Any]],
        info: dict[str, Any],
        *,
        create: bool = False,
    ) -> None:
        if create:
            self._create(state_id, self._path(state_id), entries, info)
            return
        with self._lock_of(state_id):
            tail = self._open(state_id)
            try:
                self._append(tail, entries, info)
            except BaseException:
                self._forget(state_id)  # unknown how much landed: look next time
                raise

    def read(self, state_id: str) -> Record | None:
        path = self._path(state_id)
        try:
            raw = (path / _HISTORY).read_bytes()
            raw_info = (path / _INFO).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        damaged = f"State {state_id!r} in {self!r} is damaged"
        try:
            base = json.loads(raw_info)
        except ValueError:
            base = None
        if not isinstance(base, dict):
            raise StateFormatError(f"{damaged}: {path / _INFO} is not a JSON object")
        end = raw.rfind(b"\n") + 1  # the rest is a torn write
        mark = max(0, _last_mark(raw, 0, end))
        entries: builtins.list[dict[str, Any]] = []
        after: builtins.list[dict[str, Any]] = []  # the lines after the mark, for the info
        start = 0
        loads, find, view = jsonl.loads, raw.find, memoryview(raw)
        with collection.paused():  # every object made here stays alive
            # Each line parsed once, in place: no copy of the history is made to parse it.
            while start < end:
                stop = find(b"\n", start)
                try:
                    item = loads(view[start:stop])
                except ValueError:
                    if raw[start:stop].strip():
                        raise StateFormatError(
                            f"{damaged}: {_bad_line(raw[:end], path / _HISTORY)}"
                        ) from None
                    item = {}  # a blank line
                if type(item) is not dict:
                    raise StateFormatError(f"{damaged}: {_bad_line(raw[:end], path / _HISTORY)}")
                if "seq" in item:
                    entries.append(item)
                if start >= mark:
                    after.append(item)
                start = stop + 1
        return Record(entries, _apply(base, after))

    def read_since(self, state_id: str, seq: int) -> Record | None:
        if seq <= 0:
            return self.read(state_id)
        path = self._path(state_id)
        try:
            with open(path / _HISTORY, "rb") as file:
                tail = _tail_from(file.fileno(), seq)
            base = json.loads((path / _INFO).read_bytes())  # after the history, as read() does
        except (FileNotFoundError, NotADirectoryError):
            return None
        lines = _lines(tail)
        mark = max((i + 1 for i, line in enumerate(lines) if line == _MARK), default=0)
        entries, after = [], []
        for index, line in enumerate(lines):
            is_entry = line.startswith(b'{"seq":')
            if index < mark:  # info.json holds what these lines say of the info
                if is_entry and jsonl.seq_of(line) >= seq:
                    entries.append(jsonl.loads(line))
                continue
            parsed = jsonl.loads(line)
            after.append(parsed)
            if is_entry and int(parsed["seq"]) >= seq:
                entries.append(parsed)
        return Record(entries, _apply(base, after))

    def list(self) -> builtins.list[StateInfo]:
        infos = []
        if self.folder.is_dir():
            for child in self.folder.iterdir():
                if child.name.startswith("."):
                    continue
                try:
                    info = self._info_of(child)
                    infos.append(StateInfo.from_info(unquote(child.name), info))
                except (OSError, ValueError, TypeError, AttributeError):
                    continue  # not a State, or a damaged one: it does not hide the others
        oldest = datetime.min.replace(tzinfo=UTC)
        return sorted(infos, key=lambda i: i.updated_at or oldest, reverse=True)

    def delete(self, state_id: str) -> None:
        path = self._path(state_id)
        if path.is_dir():
            # Rename first so a crash mid-delete never leaves a half State under its id.
            trash = self.folder / f".deleting-{secrets.token_hex(8)}"
            path.rename(trash)
            with self._lock_of(state_id):
                self._forget(state_id)
            shutil.rmtree(trash)

    # ------------------------------------------------------------ saving
    def _open(self, state_id: str) -> _Tail:
        """The history of ``state_id``, open, with what is known of its end (its lock held).

        In the common case (this store wrote the history last) that is a stat: the file at
        the path is the one kept open and has the size this store left it at. Otherwise
        (another writer or process, a crash, a State deleted and created again) the
        history is opened afresh and its end read back (:func:`_scan`).
        """
        tail = self._tails.get(state_id)
        path = tail.folder if tail is not None else self._path(state_id)
        history = tail.history if tail is not None else str(path / _HISTORY)
        try:
            stat = os.stat(history)
        except (FileNotFoundError, NotADirectoryError):
            self._forget(state_id)
            raise not_found_error(state_id, self) from None
        if tail is not None and (tail.inode, tail.size) == (stat.st_ino, stat.st_size):
            return tail
        self._forget(state_id)
        try:
            fd = os.open(history, os.O_RDWR)
        except (FileNotFoundError, NotADirectoryError):
            raise not_found_error(state_id, self) from None
        try:
            stat = os.fstat(fd)
            tail = _scan(path, fd, stat.st_ino, stat.st_size)  # another writer, or a crash
        except BaseException:
            os.close(fd)
            raise
        self._keep(state_id, tail)
        return tail

    def _keep(self, state_id: str, tail: _Tail) -> None:
        """Keep ``tail`` open, closing the least recently saved histories past a few."""
        with self._guard:
            self._tails[state_id] = tail
            for other in builtins.list(self._tails)[: max(0, len(self._tails) - _KEPT_OPEN)]:
                lock = self._locks.get(other)
                if other != state_id and lock is not None and lock.acquire(blocking=False):
                    try:  # one being saved right now stays open until the next time
                        _close(self._tails.pop(other, None))
                    finally:
                        lock.release()

    def _forget(self, state_id: str) -> None:
        """Close and forget the history kept open for ``state_id`` (its lock held)."""
        with self._guard:
            _close(self._tails.pop(state_id, None))

    def _append(
        self, tail: _Tail, entries: builtins.list[dict[str, Any]], info: dict[str, Any]
    ) -> None:
        fd = tail.fd
        new = [e for e in entries if int(e["seq"]) >= tail.have]
        expected = _derive(tail.info, new[-1]) if new else tail.info
        body = jsonl.encode(new) + _info_line(expected, info)
        if body:
            _write_all(fd, body, tail.size)
            _sync(fd)
        size = tail.size + len(body)
        since = tail.since_mark + len(body)
        if since > _CHECKPOINT_AFTER:
            _write_atomic(tail.folder / _INFO, json.dumps(info).encode())
            # The mark rides on the next save's fsync: lost, an older mark serves as well.
            _write_all(fd, _MARK + b"\n", size)
            size, since = size + len(_MARK) + 1, 0
        tail.have = int(new[-1]["seq"]) + 1 if new else tail.have
        tail.size, tail.info, tail.since_mark = size, dict(info), since

    def _create(
        self,
        state_id: str,
        path: Path,
        entries: builtins.list[dict[str, Any]],
        info: dict[str, Any],
    ) -> None:
        _make_private_dir(self.folder)
        if path.exists():
            raise exists_error(state_id, self)
        staging = self.folder / f".creating-{secrets.token_hex(8)}"
        _make_private_dir(staging)
        try:
            _write_new(staging / _HISTORY, jsonl.encode(entries) + _MARK + b"\n")
            _write_new(staging / _INFO, json.dumps(info).encode())
            _fsync_dir(staging)
            try:
                # rename() onto an existing non-empty folder fails: the atomic "create if absent".
                staging.rename(path)
            except OSError as error:
                raise exists_error(state_id, self) from error
            _fsync_dir(self.folder)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
        have = int(entries[-1]["seq"]) + 1 if entries else 0
        with self._lock_of(state_id):
            self._forget(state_id)
            history = str(path / _HISTORY)
            fd = os.open(history, os.O_RDWR)
            stat = os.fstat(fd)
            tail = _Tail(path, history, fd, stat.st_ino, stat.st_size, have, dict(info), 0)
            self._keep(state_id, tail)

    # ------------------------------------------------------------ internals
    def _info_of(self, folder: Path) -> dict[str, Any]:
        base = json.loads((folder / _INFO).read_bytes())
        with open(folder / _HISTORY, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            after, _, _, _ = _read_back(file.fileno(), size, need_entry=False)
        return _apply(base, after)

    def _path(self, state_id: str) -> Path:
        return self.folder / encode_id(state_id)

    def _lock_of(self, state_id: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(state_id, threading.Lock())


def _tail_from(fd: int, seq: int) -> bytes:
    """The complete lines at a history's end that hold its entries from ``seq`` on and its
    last mark (or the whole history, when it has neither before them).

    Read backwards in doubling chunks: entries are appended in seq order, so once a
    window's first entry line is at or before ``seq`` and the window has a mark, it holds
    all a reader needs. Following a run costs the lines since the last mark (some
    64 KiB at most) and what is new, whatever the history's length.
    """
    size = os.fstat(fd).st_size
    data, start = b"", size
    while True:
        if start > 0:
            step = min(max(_CHUNK, len(data)), start)
            start -= step
            data = os.pread(fd, step, start) + data
        end = data.rfind(b"\n") + 1  # the rest is a torn write
        if start == 0:
            return data[:end]
        first = data.find(b"\n") + 1  # a partial first line is not looked at
        if first == 0:
            continue
        oldest = _first_seq(data[first:end])
        if 0 <= oldest <= seq and _last_mark(data, first, end) >= 0:
            return data[first:end]


def _first_seq(raw: bytes) -> int:
    """The seq of the first entry line of ``raw``, or -1."""
    for line in _lines(raw):
        if line.startswith(b'{"seq":'):
            return jsonl.seq_of(line)
    return -1


def _scan(path: Path, fd: int, inode: int, size: int) -> _Tail:
    """Look at a history's end: cut a torn last line, find the last seq and the info."""
    after, have, since, complete = _read_back(fd, size, need_entry=True)
    if complete != size:
        os.ftruncate(fd, complete)
    base = json.loads((path / _INFO).read_bytes())
    return _Tail(path, str(path / _HISTORY), fd, inode, complete, have, _apply(base, after), since)


def _read_back(
    fd: int, size: int, *, need_entry: bool
) -> tuple[builtins.list[dict[str, Any]], int, int, int]:
    """Read a history from its end back to its last mark (and, with ``need_entry``, to its
    last entry too). Returns the parsed lines after the mark, the entry count, how many
    bytes of complete lines follow the mark, and the size without a torn last line."""
    data, start = b"", size
    while True:
        if start > 0:
            step = min(max(_CHUNK, len(data)), start)  # doubling: few reads, little waste
            start -= step
            data = os.pread(fd, step, start) + data
        whole = start == 0
        first = 0 if whole else data.find(b"\n") + 1  # a partial first line is not looked at
        end = data.rfind(b"\n") + 1
        if not whole and first == 0:
            continue  # not one whole line yet
        mark = _last_mark(data, first, end)
        have = _last_seq(data[first:end]) if need_entry else 0
        if (mark >= 0 and (have >= 0 or not need_entry)) or whole:
            mark = max(mark, 0)
            after = [jsonl.loads(line) for line in _lines(data[mark:end])]
            return after, max(have, 0), end - mark, start + end


def _last_mark(raw: bytes, first: int, end: int) -> int:
    """Where the lines after the last mark in ``raw[first:end]`` begin; with no mark, 0 if
    ``raw`` starts the file (``first == 0``: everything is after), else -1."""
    found = raw.rfind(b"\n" + _MARK + b"\n", max(0, first - 1), end)
    if found >= 0:
        return found + len(_MARK) + 2
    if first == 0 and raw.startswith(_MARK + b"\n"):
        return len(_MARK) + 1
    return 0 if first == 0 else -1


def _last_seq(raw: bytes) -> int:
    """The entry count (last seq + 1) from the last entry line of ``raw``, or -1."""
    for line in reversed(_lines(raw)):
        if line.startswith(b'{"seq":'):
            return jsonl.seq_of(line) + 1
    return -1


def _bad_line(raw: bytes, where: Path) -> str:
    """What is wrong with the first line of ``raw`` that is not a JSON object (the slow
    path, taken only when the whole history did not parse)."""
    for number, line in enumerate(raw.split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            parsed = json.loads(line)
        except ValueError as error:
            return f"line {number} of {where} is not a JSON entry ({type(error).__name__}: {error})"
        if not isinstance(parsed, dict):
            return f"line {number} of {where} is not a JSON entry (a {type(parsed).__name__})"
    return f"{where} is not JSON lines"


def _lines(raw: bytes) -> builtins.list[bytes]:
    return [line for line in raw.split(b"\n") if line.strip()]


def _derive(info: dict[str, Any], last: dict[str, Any]) -> dict[str, Any]:
    """The info after an entry, as far as the entry tells."""
    derived = dict(info)
    # A wrapper may hand us entries whose time is not readable (EncryptedStore seals it):
    # then the info line carries updated_at.
    if "updated_at" in info and "time" in last:
        derived["updated_at"] = last["time"]
    if "entries" in info:
        derived["entries"] = int(last["seq"]) + 1
    return derived


def _info_line(expected: dict[str, Any], info: dict[str, Any]) -> bytes:
    """The info line for ``info`` where ``expected`` is what the entries already say."""
    if info == expected:
        return b""
    line: dict[str, Any] = {"info": {k: v for k, v in info.items() if expected.get(k, _NONE) != v}}
    unset = [k for k in expected if k not in info]
    if unset:
        line["unset"] = unset
    return json.dumps(line, separators=(",", ":")).encode() + b"\n"


_NONE = object()


def _apply(base: dict[str, Any], lines: builtins.list[dict[str, Any]]) -> dict[str, Any]:
    """``base`` with ``lines`` (entries, info lines, marks) applied in order."""
    info = dict(base)
    for line in lines:
        if "seq" in line:
            info = _derive(info, line)
        elif "info" in line:
            info.update(line["info"])
            for key in line.get("unset", ()):
                info.pop(key, None)
    return info


def _close(tail: _Tail | None) -> None:
    if tail is not None:
        os.close(tail.fd)


def _close_all(tails: dict[str, _Tail]) -> None:
    """Close what a FileStore kept open (when it is garbage collected)."""
    while tails:
        _close(tails.popitem()[1])


def _write_all(fd: int, data: bytes, offset: int) -> None:
    while data:
        written = os.pwrite(fd, data, offset)
        data, offset = data[written:], offset + written


def _make_private_dir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)


def _write_new(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as file:
        os.fchmod(file.fileno(), 0o600)
        file.write(data)
        file.flush()
        os.fsync(file.fileno())


def _write_atomic(path: Path, data: bytes) -> None:
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    try:
        _write_new(temporary, data)
        os.replace(temporary, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
    _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _real(path: Path) -> str:
    return os.path.realpath(path)
