"""The campaign's child: runs (or resumes) one planned run until every round is answered.

Forked by ``tests.bench.forked.start(main, connection, store_url, plan, markers)``. It
loads the State (or starts it), sends the next round whenever the last one is answered,
and runs the Agent. The tool ``work`` leaves a marker file named after its job the moment
it starts, works, and may send a note while the run is live. The child tells the test, over
``connection``:

- ``("tool", job)`` when a call of ``work`` has started (its marker is written);
- ``("sent", token)`` once ``state.send`` into a live run returned (the message must be
  saved by then);
- ``("answered", entries)`` when every round is answered;
- ``("interrupted", {"in_run": bool, "entries": n, "saved": n})`` after a Ctrl+C, where it
  was raised (``agent.run`` or the child's own code) and how much of the State is saved.
"""

from __future__ import annotations

import json
import os
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from alpineagents import Agent, Message, State, tool
from alpineagents.providers import Provider
from alpineagents.store import open_store
from tests.campaign.plan import ROUND_PREFIX, RunPlan

MODEL = "claude-sonnet-5"
ENV_PROVIDER = "CAMPAIGN_PROVIDER"
"""``spec.provider`` as JSON: the runs ask their model through that provider's wire."""
ENV_MODEL = "CAMPAIGN_MODEL"
"""The model id as the provider spells it."""


def _provider() -> Provider | None:
    raw = os.environ.get(ENV_PROVIDER)
    return Provider.from_spec(json.loads(raw)) if raw else None


def rounds_asked(state: State) -> int:
    """How many round messages the State holds."""
    return sum(
        1
        for entry in state.history
        if entry.kind in ("message", "waiting")
        and Message.from_dict(entry.data["message"]).text.startswith(ROUND_PREFIX)
    )


def main(connection: Connection, store_url: str, plan_dict: dict[str, Any], markers: str) -> None:
    try:
        _run_plan(connection, store_url, RunPlan.from_dict(plan_dict), Path(markers))
    except KeyboardInterrupt:  # outside agent.run: before it started, or between rounds
        connection.send(("interrupted", {"in_run": False}))


def _run_plan(connection: Connection, store_url: str, plan: RunPlan, markers: Path) -> None:
    store = open_store(store_url)
    state: State | None = None
    sending = threading.Lock()  # tools run on threads of their own; a Connection is not safe

    def tell(message: tuple[str, Any]) -> None:
        with sending:
            connection.send(message)

    @tool
    def work(job: str, ms: int = 0, note: str = "") -> str:
        """One job of a campaign run: marks its start, works ``ms`` ms, may send a note."""
        (markers / f"{job}.{os.getpid()}.{time.monotonic_ns()}").touch()
        tell(("tool", job))
        time.sleep(ms / 1000)  # the work itself
        # Only a send into a live run is saved before it returns; a tool that outlives
        # its run (a Ctrl+C ended it) sends a "message" the next save writes.
        if note and state is not None and state.send(f"note {note}").kind == "waiting":
            tell(("sent", note))
        return f"{job} done"

    # The smallest window: the runs clear results and summarize turns while they are killed.
    agent = Agent(
        model=os.environ.get(ENV_MODEL, MODEL),
        store=store,
        tools=[work],
        max_tokens=256,
        context_window=1024,
        provider=_provider(),
    )
    try:
        state = store.load(plan.state_id)
    except LookupError:
        state = State(plan.state_id, [Message.user(plan.round_text(0))])
    while True:
        if state.answer is not None:
            asked = rounds_asked(state)
            if asked == len(plan.rounds):
                tell(("answered", len(state.history)))
                return
            state.send(plan.round_text(asked))
        try:
            agent.run(state)
        except KeyboardInterrupt:
            # What the run wrote ends with its stop entry; a tool still working on its
            # thread may have sent a message after it, which the next save writes.
            ran = 1 + max(i for i, e in enumerate(state.history) if e.kind == "stop")
            info = {"in_run": True, "entries": ran, "saved": state.saved_entries}
            tell(("interrupted", info))
            return
        if state.answer is None:
            raise AssertionError(f"the run stopped without an answer: {state.stopped}")
