"""A child process that runs an agent until its parent kills it (crash tests).

Usage: python -m tests.agents.crash_child FOLDER STATE_ID SCENARIO
It prints one line per event the parent waits for ("started slow", "saved kinds...").
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

from alpineagents import Agent, FileStore, Message, State, tool

folder, state_id, scenario = sys.argv[1], sys.argv[2], sys.argv[3]
markers = Path(folder) / "markers"
markers.mkdir(parents=True, exist_ok=True)
state: State


def say(line: str) -> None:
    print(line, flush=True)


class ReportingStore(FileStore):
    """Tells the parent what each save wrote, so it can kill at an exact point."""

    def write(
        self,
        state_id: str,
        entries: list[dict[str, Any]],
        info: dict[str, Any],
        *,
        create: bool = False,
    ) -> None:
        if scenario == "send" and any(e["kind"] == "waiting" for e in entries):
            time.sleep(0.5)  # a slow store: send must still return only once it saved
        super().write(state_id, entries, info, create=create)
        say("saved " + " ".join(e["kind"] for e in entries))


@tool
def slow(name: str = "slow") -> str:
    """Writes a marker, then blocks until the process is killed."""
    (markers / f"{name}-{len(list(markers.iterdir()))}").touch()
    if scenario in ("waiting", "send"):
        state.send(Message.user("Also: add the weather."))
        say("sent")
    say(f"started {name}")
    threading.Event().wait()
    return "never"


@tool
def fast() -> str:
    """Answers at once."""
    (markers / f"fast-{len(list(markers.iterdir()))}").touch()
    return "fast result"


store = ReportingStore(folder)
agent = Agent(model="claude-sonnet-5", store=store, tools=[slow, fast], max_tokens=1024)
state = State(id=state_id, messages=[Message.user("Write the nightly report")])
agent.run(state)
