"""Reading a child process's pipe without hanging the suite on it."""

from __future__ import annotations

import select
import time
from typing import IO


def read_line(stream: IO[str], timeout: float = 60) -> str:
    """The next line of a child's pipe, failing (not hanging) if none comes.

    ``poll``, not ``select``: late in a long suite the pipe's descriptor can be
    above 1024, which ``select`` refuses.
    """
    poller = select.poll()
    poller.register(stream, select.POLLIN | select.POLLHUP)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if poller.poll(500):
            line = stream.readline()
            if not line:
                raise AssertionError("the process closed its output")
            return line
    raise AssertionError(f"no output line within {timeout}s")
