"""A child process that pauses a run at one instant of its first moments, for a real Ctrl+C.

Usage: python -m tests.agents.interrupt_child STORE STATE_ID INSTANT MODE

- STORE: a store URL (``alpineagents.store_url.open_store``), or ``memory`` for a MemoryStore
  of the child's own (the spec page's; only the child can look into it, so it reports).
- INSTANT: where the run pauses (see ``INSTANTS``). There the child prints ``at INSTANT``
  and waits for a line on stdin: the parent sends SIGINT, then that line.
- MODE: ``run`` (``agent.run``) or ``arun`` (``asyncio.run(agent.arun(...))``).

When the run has raised (or returned), the child prints one JSON line, ``report {...}``:
what it raised, its State's history kinds, how many entries its store has, and whether a
fresh load of the State equals it.

The pause is a profile hook (``sys.setprofile``/``threading.setprofile``): it only watches
which function is called and waits there; everything else is the library's own code.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
from types import FrameType
from typing import Any

from alpineagents import Agent, Message, State, Store
from alpineagents.store_url import open_store
from tests.spec import memory_store_class

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

    def __init__(self, instant: str, agent: Agent, store: Store) -> None:
        if instant not in INSTANTS:
            raise SystemExit(f"unknown instant {instant!r}: one of {', '.join(INSTANTS)}")
        self.instant = instant
        self.store = store
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
        print(f"at {self.instant}", flush=True)
        sys.stdin.readline()  # the parent sends SIGINT, then this line

    def matches(self, frame: FrameType, event: str, arg: Any) -> bool:
        name = frame.f_code.co_name
        own = frame.f_locals.get("self") is self.store
        if self.instant == "run":
            if event == "c_call":
                return frame.f_code in self.run_codes
            return (
                event == "call"
                and frame.f_back is not None
                and (frame.f_back.f_code in self.run_codes)
            )
        if self.instant == "client":
            return event == "call" and name == "default_client"
        if self.instant == "save":
            return event == "call" and own and name in ("save", "asave")
        if self.instant == "write":
            return event == "call" and own and name == "write"
        if self.instant == "fsync":
            return event == "c_call" and arg is os.fsync
        return event == "return" and own and name == "write"  # "written"


def main() -> None:
    url, state_id, instant, mode = sys.argv[1:5]
    store: Store = memory_store_class()() if url == "memory" else open_store(url)
    agent = Agent(model="claude-sonnet-5", store=store, max_tokens=1024)
    state = State(id=state_id, messages=[Message.user("Write the nightly report")])
    pause = PauseAt(instant, agent, store)
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
    print("report " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
