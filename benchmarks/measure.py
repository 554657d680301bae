"""Figures measured over repeats: median and spread, percentiles, and the machine they ran on."""

from __future__ import annotations

import os
import platform
import statistics
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any


@dataclass
class Spread:
    """One figure measured once per repeat: its median and its range over the repeats."""

    values: list[float] = field(default_factory=list)

    def add(self, value: float) -> None:
        self.values.append(float(value))

    @property
    def median(self) -> float:
        if not self.values:
            raise ValueError("a figure with no measurement has no median")
        return statistics.median(self.values)

    @property
    def low(self) -> float:
        return min(self.values)

    @property
    def high(self) -> float:
        return max(self.values)

    def text(self, unit: str = "", digits: int = 2) -> str:
        """``median unit (min-max)`` (an en dash between), or just the median when there was one repeat."""
        middle = f"{self.median:,.{digits}f}{unit}"
        if len(self.values) < 2:
            return middle
        return f"{middle} ({self.low:,.{digits}f}\N{EN DASH}{self.high:,.{digits}f})"


def percentile(values: Iterable[float], q: float) -> float:
    """The ``q`` quantile (0..1) by the nearest-rank method."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    rank = max(0, min(len(ordered) - 1, round(q * len(ordered) + 0.5) - 1))
    return ordered[rank]


_schedstat = threading.local()


def cpu_wait() -> float:
    """Seconds this thread has been ready to run but waiting for a CPU (Linux schedstat).

    On a shared machine a thread that is ready often waits for a core that another job
    holds; that wait is no cost of the code measured. 0.0 where the kernel does not say.
    """
    fd = getattr(_schedstat, "fd", None)
    if fd is None:
        try:
            fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            fd = -1
        _schedstat.fd = fd
    if fd < 0:
        return 0.0
    return int(os.pread(fd, 128, 0).split()[1]) / 1e9


def mark() -> tuple[float, float]:
    """A start point for :func:`since`."""
    return time.perf_counter(), cpu_wait()


def since(start: tuple[float, float]) -> float:
    """Seconds since ``start`` less the time this thread waited for a CPU meanwhile: what
    the interval takes on a machine with a core to spare. Every in-process timing of the
    benchmarks is taken this way (whole processes are timed by their CPU time)."""
    wall, waited = start
    return (time.perf_counter() - wall) - (cpu_wait() - waited)


def seconds(call: Callable[[], Any]) -> tuple[float, Any]:
    """How long ``call()`` took (see :func:`since`), and what it returned."""
    start = mark()
    result = call()
    return since(start), result


def median_seconds(call: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """The median time of ``repeat`` calls, and what the last call returned."""
    times, result = [], None
    for _ in range(repeat):
        took, result = seconds(call)
        times.append(took)
    return statistics.median(times), result


def version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def load_average() -> str:
    try:
        return " / ".join(f"{value:.1f}" for value in os.getloadavg())
    except OSError:
        return "unknown"


SETTLED_LOAD = 4.0
SETTLE_LIMIT = 300.0


def settle() -> None:
    """Wait until the machine is about as busy as before a scenario's set-up (1-minute
    load average under :data:`SETTLED_LOAD`, for at most :data:`SETTLE_LIMIT` seconds):
    the runs a node loses at once, and a warm pool's standbys, started long before the
    loss, and starting dozens of pods at once keeps 2 CPUs busy for a while after."""
    deadline = time.monotonic() + SETTLE_LIMIT
    while os.getloadavg()[0] > SETTLED_LOAD and time.monotonic() < deadline:
        time.sleep(5.0)  # before the measured burst


def machine() -> str:
    """One line naming the machine and the interpreter."""
    return (
        f"{platform.machine()}, {os.cpu_count()} CPUs ({cpu_model()}), "
        f"Linux {platform.release()}, Python {platform.python_version()}"
    )


PEER_PACKAGES = (
    "anthropic",
    "minio",
    "langgraph",
    "langgraph-checkpoint",
    "langgraph-checkpoint-sqlite",
    "langgraph-checkpoint-postgres",
    "langchain-core",
    "langchain",
    "langchain-anthropic",
    "psycopg",
)


def versions() -> str:
    return ", ".join(f"{name} {version(name)}" for name in PEER_PACKAGES)
