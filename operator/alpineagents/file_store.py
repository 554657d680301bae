"""FileStore: the embedded default, one folder on local disk.

Layout: ``<folder>/<encoded id>/history.jsonl`` (one entry a line, appended and fsynced
per save) and ``info.json`` (replaced atomically). A new State is written in a temporary
folder and renamed into place, which is all-or-nothing and refuses an existing id.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import secrets
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import quote, unquote

from .state import check_id, error_text
from .store import Record, StateInfo, Store

_HISTORY = "history.jsonl"
_INFO = "info.json"
_TAIL = 1 << 16  # bytes read from the end of a history to find its last entry


class FileStore(Store):
    """Saves each State in a folder of its own under ``folder``, readable only by its owner."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)

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
        path = self._path(state_id)
        if create:
            self._create(state_id, path, entries, info)
            return
        if not path.is_dir():
            raise LookupError(f"no saved State with id {state_id!r} in {self!r}")
        history = path / _HISTORY
        with open(history, "r+b") as file:
            have = _repair_tail(file)
            new = [e for e in entries if int(e["seq"]) >= have]
            if new:
                file.seek(0, os.SEEK_END)
                file.write(_lines(new))
                file.flush()
                os.fsync(file.fileno())
        _write_atomic(path / _INFO, json.dumps(info).encode())

    def read(self, state_id: str) -> Record | None:
        path = self._path(state_id)
        try:
            raw = (path / _HISTORY).read_bytes()
            raw_info = (path / _INFO).read_bytes()
        except FileNotFoundError:
            return None
        damaged = f"State {state_id!r} in {self!r} is damaged"
        try:
            info = json.loads(raw_info)
        except ValueError:
            info = None
        if not isinstance(info, dict):
            raise ValueError(f"{damaged}: {path / _INFO} is not a JSON object")
        return Record(_parse(raw, damaged, path / _HISTORY), info)

    def list(self) -> builtins.list[StateInfo]:
        infos = []
        if self.folder.is_dir():
            for child in self.folder.iterdir():
                if child.name.startswith("."):
                    continue
                try:
                    info = json.loads((child / _INFO).read_bytes())
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
            shutil.rmtree(trash)

    # ------------------------------------------------------------ internals
    def _path(self, state_id: str) -> Path:
        return self.folder / encode_id(state_id)

    def _create(
        self,
        state_id: str,
        path: Path,
        entries: builtins.list[dict[str, Any]],
        info: dict[str, Any],
    ) -> None:
        _make_private_dir(self.folder)
        if path.exists():
            raise ValueError(_exists(state_id, self))
        staging = self.folder / f".creating-{secrets.token_hex(8)}"
        _make_private_dir(staging)
        try:
            _write_new(staging / _HISTORY, _lines(entries))
            _write_new(staging / _INFO, json.dumps(info).encode())
            _fsync_dir(staging)
            try:
                # rename() onto an existing non-empty folder fails: the atomic "create if absent".
                staging.rename(path)
            except OSError as error:
                raise ValueError(_exists(state_id, self)) from error
            _fsync_dir(self.folder)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)


def encode_id(state_id: str) -> str:
    """A file name for ``state_id`` that cannot escape its folder (no ``/``, ``..`` or NUL)."""
    check_id(state_id)
    name = quote(state_id, safe="-_").replace(".", "%2E")
    if len(name.encode()) > 255:
        raise ValueError(
            f"State id {state_id[:40]!r}... is too long for a FileStore (255 bytes encoded)"
        )
    return name


def _exists(state_id: str, store: Store) -> str:
    return (
        f"a State with id {state_id!r} already exists in {store!r}: continue it with "
        f"store.load({state_id!r}), or pick another id"
    )


def _lines(entries: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(e, separators=(",", ":")).encode() + b"\n" for e in entries)


def _parse(raw: bytes, damaged: str, path: Path) -> list[dict[str, Any]]:
    """The entries of the history file at ``path``; a line that is not a JSON entry raises
    ``ValueError`` starting with ``damaged``."""
    entries = []
    for number, line in enumerate(raw.split(b"\n")[:-1], 1):  # after the last newline: torn
        if line.strip():
            try:
                entry = json.loads(line)
                int(entry["seq"])
            except (ValueError, TypeError, KeyError) as error:
                raise ValueError(
                    f"{damaged}: line {number} of {path} is not a JSON entry ({error_text(error)})"
                ) from None
            entries.append(entry)
    return entries


def _repair_tail(file: BinaryIO) -> int:
    """Cut a torn last line left by a crash mid-write; return how many entries the file has."""
    size = file.seek(0, os.SEEK_END)
    start = max(0, size - _TAIL)
    file.seek(start)
    tail = file.read()
    if start and tail.count(b"\n") < 2:  # the last complete line may begin before the tail
        start = 0
        file.seek(0)
        tail = file.read()
    end = start + tail.rfind(b"\n") + 1
    if end != size:
        file.truncate(end)
    complete = tail[: end - start].rstrip(b"\n")
    if not complete:
        return 0
    # Entries are appended in seq order, so the last complete line holds the highest.
    return int(json.loads(complete.rsplit(b"\n", 1)[-1])["seq"]) + 1


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
