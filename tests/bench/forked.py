"""Child processes forked from a server that has imported the library already.

A fresh Python spends seconds of CPU importing ``anthropic``; a campaign of hundreds of
kills cannot pay that for each child. A multiprocessing "forkserver" imports the library
once, then forks each child in milliseconds: real processes, with real signals (SIGKILL,
SIGINT) sent to their pid. Each child gets Python's usual Ctrl+C handling
(KeyboardInterrupt), as a program started from a terminal has, even when this process
ignores SIGINT (a shell starting pytest in the background makes it ignored).

A child reads its environment from ``env`` (the forkserver's own is the one of the moment
it started), and talks to the test through a ``multiprocessing.Pipe`` end it is given.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Mapping
from multiprocessing.process import BaseProcess
from typing import Any

_FORKSERVER = multiprocessing.get_context("forkserver")
_FORKSERVER.set_forkserver_preload(
    [
        "anthropic",
        "alpineagents",
        "alpineagents.store.s3",
        "alpineagents.testing",
        "tests.agents.interrupt_child",
        "tests.campaign.child",
    ]
)


def start(target: Callable[..., None], *args: Any, env: Mapping[str, str]) -> BaseProcess:
    """Fork a child that runs ``target(*args)`` with ``env`` added to its environment."""
    process = _FORKSERVER.Process(target=_child, args=(target, dict(env), *args), daemon=True)
    process.start()
    return process


def warm_up() -> None:
    """Start the forkserver now (it imports the library: seconds), so that later children
    start in milliseconds."""
    process = start(_nothing, env={})
    process.join()


def _nothing() -> None:
    pass


def _child(target: Callable[..., None], env: dict[str, str], *args: Any) -> None:
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal
        os.environ.update(env)
        target(*args)
    except KeyboardInterrupt:  # one the target did not catch: end as Python does, quietly
        sys.exit(130)
