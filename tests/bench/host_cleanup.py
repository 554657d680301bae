"""Undoing what a real node leaves on the machine: cgroups, mounts, kernel settings.

Each function touches only what is under a path (or a name) the caller owns, so it never
reaches anything another program on the machine set up.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_hierarchies() -> list[Path]:
    """The mounted cgroup hierarchies (v1 controllers, and the unified one)."""
    if (CGROUP_ROOT / "cgroup.controllers").exists():  # pure cgroup v2
        return [CGROUP_ROOT]
    return sorted(path for path in CGROUP_ROOT.iterdir() if path.is_dir() and os.path.ismount(path))


def make_cgroup(name: str) -> None:
    """Create the top-level cgroup ``name`` in every hierarchy (cpuset filled in from
    the root, or no task could join it)."""
    for hierarchy in cgroup_hierarchies():
        path = hierarchy / name
        path.mkdir(exist_ok=True)
        for setting in ("cpuset.cpus", "cpuset.mems"):
            if (path / setting).exists() and not (path / setting).read_text().strip():
                (path / setting).write_text((hierarchy / setting).read_text())


def cgroup_pids(name: str) -> set[int]:
    """Every process in the cgroup ``name`` or below it, in any hierarchy."""
    pids: set[int] = set()
    for hierarchy in cgroup_hierarchies():
        top = hierarchy / name
        if not top.is_dir():
            continue
        for procs in top.rglob("cgroup.procs"):
            with contextlib.suppress(OSError):
                pids.update(int(line) for line in procs.read_text().split())
    return pids


def kill_cgroup(name: str) -> set[int]:
    """SIGKILL every process in the cgroup ``name`` (what a node's power loss does to
    its containers); returns the pids signalled."""
    pids = cgroup_pids(name)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids


def remove_cgroup(name: str) -> None:
    """Remove the cgroup ``name`` and everything below it (they must have no tasks)."""
    for hierarchy in cgroup_hierarchies():
        top = hierarchy / name
        if not top.is_dir():
            continue
        for path in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                path.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()


def unmount_below(*roots: Path) -> list[str]:
    """Unmount (lazily, deepest first) every mount point at or below ``roots``; returns them."""
    prefixes = [str(root.resolve()) for root in roots]
    points = []
    with open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            point = line.split()[4].replace("\\040", " ")
            if any(point == p or point.startswith(p + "/") for p in prefixes):
                points.append(point)
    for point in sorted(set(points), key=lambda p: -p.count("/")):
        subprocess.run(["umount", "--lazy", point], capture_output=True, check=False)
    return points


class Sysctls:
    """Kernel settings to give back as they were: :meth:`save` before a program changes
    them (the kubelet sets several at start), :meth:`restore` after it stopped."""

    def __init__(self, *names: str) -> None:
        self._paths = [Path("/proc/sys") / name.replace(".", "/") for name in names]
        self._saved: dict[Path, str] = {}

    def save(self) -> None:
        self._saved = {path: path.read_text() for path in self._paths if path.exists()}

    def restore(self) -> None:
        for path, value in self._saved.items():
            with contextlib.suppress(OSError):
                if path.read_text() != value:
                    path.write_text(value)
        self._saved = {}
