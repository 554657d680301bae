"""An Agent's hold on the State it runs (:class:`RunHold`), and the waits a run's saves need.

The hold is what ``State.active_run`` points at while a run goes on: the run's event loop,
the save lock, the messages sent meanwhile (``State.send``) and who waits for them to be
saved, the toolsets opened for the run, and the conversation as its requests send it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from .context import ApiMessages
from .state import State
from .toolsets import RunToolsets

__all__ = ["RunHold", "running_loop", "settle", "to_the_end"]


class RunHold:
    """An Agent's hold on a State for the length of one run (``State.active_run``).

    ``agent`` is the Agent running it (its toolsets are opened for this run);
    ``save_soon(state, hold)`` saves a message sent while the run goes on, on the run's loop.
    """

    def __init__(
        self,
        agent: Any,
        state: State,
        *,
        sync_saves: bool,
        save_soon: Callable[[State, RunHold], None],
    ) -> None:
        self.agent = agent
        self._save_soon = save_soon
        self.state = state
        self.sync_saves = sync_saves
        """Saves run on the run's own thread (``run``), not as awaited tasks (``arun``)."""
        self.loop: asyncio.AbstractEventLoop | None = None
        self.save_lock = asyncio.Lock()
        self.save_error: BaseException | None = None
        """The last error a save raised (a run ending on it notes no second failure)."""
        self.interrupt: BaseException | None = None
        """The signal (Ctrl+C, SIGTERM) that stopped ``run``: the reason calls close with."""
        self.background: set[asyncio.Future[None]] = set()
        self.toolsets = RunToolsets(agent.toolsets)
        """The agent's toolsets (MCP servers): opened on the run's first step, closed at its end."""
        self.api_messages = ApiMessages()
        """The conversation as the run's requests send it, kept from step to step."""
        self._sends: list[tuple[int, concurrent.futures.Future[None]]] = []
        self._sends_lock = threading.Lock()
        self._ended = False

    def message_sent(self, seq: int, *, waits: bool) -> concurrent.futures.Future[None]:
        """Save a message sent while the run goes on (``State.send``, from any thread)."""
        if waits and self.loop is not None and running_loop() is self.loop:
            raise RuntimeError(
                f"State.send() on the event loop running State {self.state.id!r} would wait "
                f"for itself: use 'await state.asend(message)' in async code"
            )
        saved: concurrent.futures.Future[None] = concurrent.futures.Future()
        with self._sends_lock:
            if self._ended:  # the run has made its last save
                settle(saved, self._unsaved_error() if self.state.saved_entries <= seq else None)
                return saved
            self._sends.append((seq, saved))
        if self.loop is not None:
            with contextlib.suppress(RuntimeError):  # closed: the run's end settles it
                self.loop.call_soon_threadsafe(self._save_soon, self.state, self)
        return saved

    def settle_sends(self, error: BaseException | None = None) -> None:
        """Wake the senders whose message is saved now; with ``error`` (a save failed),
        all the others too: they raise it."""
        saved_entries = self.state.saved_entries
        with self._sends_lock:
            waiting = []
            for seq, saved in self._sends:
                if seq < saved_entries:
                    settle(saved, None)
                elif error is not None:
                    settle(saved, error)
                else:
                    waiting.append((seq, saved))
            self._sends = waiting

    def unsaved_sends(self) -> bool:
        with self._sends_lock:
            return bool(self._sends)

    def end(self) -> None:
        """The run made its last save: every sender learns whether its message is saved."""
        self.settle_sends()
        with self._sends_lock:
            self._ended = True
        self.settle_sends(self._unsaved_error())

    def _unsaved_error(self) -> RuntimeError:
        return RuntimeError(
            f"the run of State {self.state.id!r} ended before the message was saved: it is "
            f"in the State, and the next save writes it"
        )


def running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def settle(saved: concurrent.futures.Future[None], error: BaseException | None) -> None:
    # Already cancelled: the task of an asend was cancelled, and nobody waits any more.
    with contextlib.suppress(concurrent.futures.InvalidStateError):
        if error is None:
            saved.set_result(None)
        else:
            saved.set_exception(error)


async def to_the_end(work: Coroutine[Any, Any, None]) -> None:
    """Await ``work``; if cancelled meanwhile, let it finish first, then raise the cancel.

    A save cancelled half-way would keep writing unseen: the closing save would send its
    entries again, and a create would be refused as taken.
    """
    task = asyncio.ensure_future(work)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait([task])
        if not task.cancelled():
            task.exception()  # retrieved: the closing save raises what still fails
        raise
