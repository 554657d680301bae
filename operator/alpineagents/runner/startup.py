"""When this process started and reached each step of its start (:class:`StartupMarks`).

A resume's wait is mostly the pod's start; these marks say which part of it is the
runner's own. They go into the ``start`` or ``resume`` line of the JSON log only (the
text log stays as it is), as wall-clock seconds since the epoch, so they line up with
the pod's events and the saved entries' times.
"""

from __future__ import annotations

import os
import time

__all__ = ["StartupMarks", "process_start"]


def process_start() -> float | None:
    """The wall-clock time the kernel started this process (to its clock tick, 10 ms on
    Linux), or None where ``/proc`` does not say."""
    try:
        with open("/proc/self/stat", "rb") as stat:
            raw = stat.read()
        # Field 22, starttime, in clock ticks since boot; the name in field 2 may hold
        # spaces and parentheses, so count from its closing one (field 3 comes next).
        ticks = int(raw.rsplit(b")", 1)[1].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return time.time() - age


class StartupMarks:
    """Named wall-clock moments of one start, in the order they were reached."""

    def __init__(self) -> None:
        started = process_start()
        self.moments: dict[str, float] = {} if started is None else {"process": started}

    def mark(self, name: str) -> None:
        """Note that the start reached ``name`` now."""
        self.moments[name] = time.time()

    def fields(self) -> dict[str, float]:
        """The moments, rounded to the millisecond, for a log line."""
        return {name: round(moment, 3) for name, moment in self.moments.items()}
