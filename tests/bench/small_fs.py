"""A small filesystem of the test's own, to run out of space for real.

Fixture ``small_filesystem``: a :class:`SmallFilesystem`, a 1 MiB tmpfs the test mounts
(as root) in its ``tmp_path`` and unmounts afterwards. ``fill(leave)`` takes all its free
space but ``leave`` bytes with a filler file; ``free()`` removes the filler. Without the
right to mount it skips, or fails under ``ALPINEAGENTS_REQUIRE_INFRA=1``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.bench.infra import missing

SIZE = 1 << 20
_PAGE = 4096


class SmallFilesystem:
    """A mounted tmpfs of :data:`SIZE` bytes at ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.filler = path / ".filler"

    def free_bytes(self) -> int:
        stats = os.statvfs(self.path)
        return stats.f_bavail * stats.f_frsize

    def fill(self, leave: int = 0) -> None:
        """Take the free space but ``leave`` bytes (rounded to pages, as tmpfs counts)."""
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            while os.write(fd, b"\0" * _PAGE) == _PAGE:
                pass
        except OSError as error:
            if error.errno != errno.ENOSPC:
                raise
        finally:
            os.close(fd)
        size = self.filler.stat().st_size
        pages = -(-leave // _PAGE)
        os.truncate(self.filler, max(0, size - size % _PAGE - pages * _PAGE))

    def free(self) -> None:
        """Give the space back."""
        with contextlib.suppress(FileNotFoundError):
            self.filler.unlink()


@pytest.fixture
def small_filesystem(tmp_path: Path) -> Iterator[SmallFilesystem]:
    """A 1 MiB tmpfs of this test's own (see the module docstring)."""
    mountpoint = tmp_path / "small"
    mountpoint.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={SIZE},mode=0700", "tmpfs", str(mountpoint)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        missing(
            "a small filesystem of the test's own",
            f"mounting a tmpfs failed ({mounted.stderr.strip() or mounted.returncode}): run "
            "the tests as root, or in a container with CAP_SYS_ADMIN",
        )
    try:
        yield SmallFilesystem(mountpoint)
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=False)
