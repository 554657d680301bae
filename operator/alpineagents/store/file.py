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
from urllib.parse import unquote

from ..errors import StateFormatError
from . import jsonl
from .base import Record, StateInfo, Store, encode_id, exists_error, not_found_error

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
            raise not_found_error(state_id, self)
        history = path / _HISTORY
        with open(history, "r+b") as file:
            have = _repair_tail(file)
            new = [e for e in entries if int(e["seq"]) >= have]
            if new:
                file.seek(0, os.SEEK_END)
                file.write(jsonl.encode(new))
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
            raise StateFormatError(f"{damaged}: {path / _INFO} is not a JSON object")
        try:
            return Record(jsonl.decode(raw, str(path / _HISTORY)), info)
        except ValueError as error:
            raise StateFormatError(f"{damaged}: {error}") from None

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
            raise exists_error(state_id, self)
        staging = self.folder / f".creating-{secrets.token_hex(8)}"
        _make_private_dir(staging)
        try:
            _write_new(staging / _HISTORY, jsonl.encode(entries))
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
    return jsonl.seq_of(complete.rsplit(b"\n", 1)[-1]) + 1


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
