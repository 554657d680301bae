"""Signals during ``Agent.run``: the exception of a signal handler ends the run at its next step.

Python raises the exception of a signal handler (``KeyboardInterrupt`` for Ctrl+C, the
``SystemExit`` of a SIGTERM handler) at whatever line the main thread runs: in the middle
of a save, or before the run has set up what closes its calls. While ``Agent.run`` runs,
:class:`SignalsStopTheRun` wraps the Python-level SIGINT and SIGTERM handlers: the first
exception one raises becomes the run's interrupt and cancels the run's task, whose steps
then close the open calls with it and save; ``run`` raises it afterwards. A second signal
raises at once, as in ``asyncio.run`` (the person insists).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from types import FrameType
from typing import Any, Protocol

_STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interruptible(Protocol):
    """A run: ``interrupt`` is the exception its open calls are closed with."""

    interrupt: BaseException | None


class SignalsStopTheRun:
    """A context manager for one sync ``run`` (see the module docstring).

    Only in the main thread (the only one Python runs signal handlers in), and only for
    handlers written in Python: ``SIG_DFL`` and ``SIG_IGN`` are left as they are.
    """

    def __init__(self, run: Interruptible) -> None:
        self.run = run
        self.raised: BaseException | None = None
        """The exception the first signal's handler raised, if one did."""
        self._previous: dict[int, Any] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None

    def __enter__(self) -> SignalsStopTheRun:
        if threading.current_thread() is threading.main_thread():
            for signum in _STOPPING_SIGNALS:
                if callable(signal.getsignal(signum)):
                    self._previous[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for signum, handler in self._previous.items():
            if signal.getsignal(signum) == self._on_signal:  # unless someone replaced ours
                signal.signal(signum, handler)
        self._previous.clear()

    def cancels(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> None:
        """From now on a signal's exception cancels ``task``, and one raised already does."""
        self._loop, self._task = loop, task
        if self.raised is not None:
            loop.call_soon(self._cancel)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        handler = self._previous[signum]
        if self.raised is not None:
            handler(signum, frame)  # a second signal: its exception is raised at once
            return
        try:
            handler(signum, frame)
        except BaseException as error:
            self.raised = self.run.interrupt = error
            if self._loop is not None:
                with contextlib.suppress(RuntimeError):  # the loop is closed: the run ended
                    self._loop.call_soon_threadsafe(self._cancel)

    def _cancel(self) -> None:
        # Always scheduled on the loop, never called from the handler: the task's first
        # step is scheduled before, and a task cancelled before it runs none of its code,
        # so nothing would close the calls and save.
        task = self._task
        if task is not None and not task.done() and not task.cancelling():
            task.cancel()
