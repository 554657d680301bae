"""Whether a process still runs a State: a lock the running process holds, readers check.

``alpineagents run`` holds an exclusive ``flock`` on ``<store folder>/.running/<id>.lock``
(a FileStore's; the folder's dot keeps it out of ``list``) from before it loads the State
until after its last save. The kernel drops the lock when the process ends, however it
ends (SIGKILL too), so a reader that finds the file but no holder knows nobody runs the
State: a State left open is then lost, not running. A State no runner ever ran (a library
``agent.run``) has no lock file: nothing is known. Other stores have no lock (in a
cluster the AgentRun's pod says whether it runs).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from .store.base import Store, encode_id
from .store.file import FileStore

__all__ = ["RunningElsewhere", "holding_run", "is_running", "open_status"]


class RunningElsewhere(Exception):
    """Another process runs this State right now."""


def _lock_path(store: Store, state_id: str) -> Path | None:
    if not isinstance(store, FileStore):
        return None
    return store.folder / ".running" / f"{encode_id(state_id)}.lock"


@contextlib.contextmanager
def holding_run(store: Store, state_id: str) -> Iterator[None]:
    """Hold the lock that says this process runs ``state_id``, for the block.

    Raises :class:`RunningElsewhere` when another process holds it (two runs of one
    State would write over each other's history).
    """
    path = _lock_path(store, state_id)
    if path is None:
        yield
        return
    try:
        # Owner-only, as every other file of a FileStore: a lock names the State's id.
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(path.parent, 0o700)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        os.fchmod(fd, 0o600)
    except OSError:
        # The store's folder cannot be written: the run's first read or save says so.
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise RunningElsewhere(
                f"{state_id} is being run by another process (pid {holder}): wait for it "
                f"to end, or stop it"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # drops the lock


def open_status(store: Store, state_id: str) -> str:
    """The status of a State without a stop: ``running`` while a process holds its run
    lock, ``lost`` when the process that ran it is gone (killed), ``open`` when the store
    cannot tell."""
    running = is_running(store, state_id)
    return "open" if running is None else ("running" if running else "lost")


def is_running(store: Store, state_id: str) -> bool | None:
    """True while a process holds ``state_id``'s run lock, False when a runner ran it and
    none holds the lock now, None when nothing is known (no lock file, another store)."""
    path = _lock_path(store, state_id)
    if path is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as error:
        if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return True
        raise
    finally:
        os.close(fd)
    return False
