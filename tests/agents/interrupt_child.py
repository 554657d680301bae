"""A child process that pauses a run at one instant of its first moments, for a real Ctrl+C.

Forked by ``tests.bench.forked.start(main, connection, store_url, state_id, instant, mode)``:

- ``store_url``: a store URL (``alpineagents.store.open_store``), or ``memory`` for a
  MemoryStore of the child's own (``alpineagents.testing``; only the child can look into it, so it
  reports what it holds).
- ``instant``: where the run pauses (see ``INSTANTS``). There the child sends
  ``("at", instant)`` and waits for a message: the test sends SIGINT, then the message.
- ``mode``: ``run`` (``agent.run``) or ``arun`` (``asyncio.run(agent.arun(...))``).

When the run has raised (or returned), the child sends a report (a dict): what it
raised, its State's history kinds, how many entries its store has, and whether a fresh
load of the State equals it.

The pause is a profile hook (``sys.setprofile``/``threading.setprofile``): it only watches
which function is called and waits there; everything else is the library's own code.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from multiprocessing.connection import Connection
from types import FrameType
from typing import Any

from alpineagents import Agent, Message, State, Store
from alpineagents.store import open_store
from alpineagents.testing import MemoryStore

INSTANTS = {
    "run": "the first call made inside agent.run / agent.arun",
    "client": "the model client is built",
    "save": "the first store save is entered",
    "write": "the first store write is entered",
    "fsync": "the first fsync (FileStore)",
    "written": "the first store write has returned, before the save is booked",
}


class PauseAt:
    """A profile hook that stops the thread at the first moment ``instant`` happens."""

    def __init__(self, instant: str, store: Store, connection: Connection) -> None:
        if instant not in INSTANTS:
            raise ValueError(f"unknown instant {instant!r}: one of {', '.join(INSTANTS)}")
        self.instant = instant
        self.store = store
        self.connection = connection
        self.run_codes = {Agent.run.__code__, Agent.arun.__code__}
        self.done = False
        self.lock = threading.Lock()

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if self.done or not self.matches(frame, event, arg):
            return
        with self.lock:
            if self.done:
                return
            self.done = True
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
        self.connection.send(("at", self.instant))
        self.connection.recv()  # the test sends SIGINT, then this message

    def matches(self, frame: FrameType, event: str, arg: Any) -> bool:
        name = frame.f_code.co_name
        own = frame.f_locals.get("self") is self.store
        if self.instant == "run":
            if event == "c_call":
                return frame.f_code in self.run_codes
            caller = frame.f_back
            return event == "call" and caller is not None and caller.f_code in self.run_codes
        if self.instant == "client":
            return event == "call" and name == "default_client"
        if self.instant == "save":
            return event == "call" and own and name in ("save", "asave")
        if self.instant == "write":
            return event == "call" and own and name in ("write", "awrite")
        if self.instant == "fsync":
            return event == "c_call" and arg is os.fsync
        return event == "return" and own and name in ("write", "awrite")  # "written"


def main(connection: Connection, store_url: str, state_id: str, instant: str, mode: str) -> None:
    store: Store = MemoryStore() if store_url == "memory" else open_store(store_url)
    agent = Agent(model="claude-sonnet-5", store=store, max_tokens=1024)
    state = State(id=state_id, messages=[Message.user("Write the nightly report")])
    pause = PauseAt(instant, store, connection)
    threading.setprofile(pause)  # type: ignore[arg-type]
    sys.setprofile(pause)
    raised = None
    try:
        if mode == "run":
            agent.run(state)
        else:
            asyncio.run(agent.arun(state))
    except BaseException as error:
        raised = type(error).__name__
    sys.setprofile(None)
    report: dict[str, Any] = {
        "paused": pause.done,
        "raised": raised,
        "kinds": [e.kind for e in state.history],
        "texts": [e.text for e in state.history],
        "stopped": state.stopped,
        "saved": state.saved_entries,
    }
    try:
        loaded = store.load(state_id)
    except LookupError:
        report["loaded"] = None
    else:
        report["loaded"] = {
            "same": loaded == state,
            "kinds": [e.kind for e in loaded.history],
            "closing": len(loaded.history) - loaded.saved_entries,
        }
    connection.send(("report", report))
