"""Real processes killed with SIGKILL at exact points of a run, then loaded and resumed.

The child (tests/agents/crash_child.py) prints a line at each point the parent waits
for; the parent kills it there, loads the State, checks the closing entries, and runs on.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from alpineagents import Agent, FileStore, Message, State, tool
from alpineagents.state import MODEL_STOPPED, UNKNOWN_RESULT
from alpineagents.testing import ModelServer, hold, reply, tool_use
from tests.paths import REPO

WAIT = 120.0  # seconds an awaited event may take on a loaded machine: a safety net, not a measure


class Child:
    def __init__(self, folder: Path, scenario: str, model: ModelServer) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.agents.crash_child",
                str(folder),
                "nightly-report",
                scenario,
            ],
            cwd=REPO,
            env={**os.environ, **model.env},
            stdout=subprocess.PIPE,
            text=True,
        )

    def wait_for(self, wanted: str) -> list[str]:
        """Read the child's lines until one starts with ``wanted`` (or the child ends)."""
        assert self.process.stdout is not None
        lines = []
        for line in self.process.stdout:
            lines.append(line.strip())
            if line.startswith(wanted):
                return lines
        raise AssertionError(f"child ended (code {self.process.wait()}) before {wanted!r}: {lines}")

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        assert self.process.wait(WAIT) == -signal.SIGKILL


@pytest.fixture
def run_folder(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "runs"


def markers(folder: Path, name: str) -> list[str]:
    return sorted(p.name for p in (folder / "markers").iterdir() if p.name.startswith(name))


def resume_agent(folder: Path, model: ModelServer) -> Agent:
    @tool
    def slow(name: str = "slow") -> str:
        """Must not run again after a crash."""
        raise AssertionError("the aborted tool was run again")

    @tool
    def fast() -> str:
        """Answers at once."""
        return "fast result"

    os.environ.update(model.env)
    return Agent(
        model="claude-sonnet-5", store=FileStore(folder), tools=[slow, fast], max_tokens=1024
    )


def test_killed_while_a_tool_runs(run_folder: Path, model_server: ModelServer) -> None:
    model_server.add(reply("On it.", tool_use("slow", id="toolu_slow")))
    child = Child(run_folder, "tool", model_server)
    child.wait_for("started slow")
    child.kill()

    state = FileStore(run_folder).load("nightly-report")
    closing = state.history[-1]
    assert (closing.kind, closing.outcome, closing.text) == (
        "tool_result",
        "aborted",
        UNKNOWN_RESULT,
    )
    assert closing.data["call_id"] == "toolu_slow"

    model_server.add(reply("The report could not be checked."))
    assert resume_agent(run_folder, model_server).run(state) == "The report could not be checked."
    assert markers(run_folder, "slow") == ["slow-0"]  # started once, never again
    sent = model_server.requests[-1].body["messages"][-1]["content"][0]
    sent.pop("cache_control")  # the request's end: the next one reads up to it from the cache
    assert sent == {
        "type": "tool_result",
        "tool_use_id": "toolu_slow",
        "content": UNKNOWN_RESULT,
        "is_error": True,
    }


def test_killed_while_the_model_is_asked(run_folder: Path, model_server: ModelServer) -> None:
    model_server.add(hold())
    child = Child(run_folder, "model", model_server)
    taken_back = model_server.wait_for_requests(1)[0]
    child.kill()
    model_server.release()

    state = FileStore(run_folder).load("nightly-report")
    assert [(e.kind, e.text) for e in state.history[1:]] == [
        ("model_request", "asking claude-sonnet-5"),
        ("model_error", MODEL_STOPPED),
    ]
    assert state.messages == [Message.user("Write the nightly report")]

    model_server.add(reply("Here is the report."))
    assert resume_agent(run_folder, model_server).run(state) == "Here is the report."
    assert model_server.requests[1].body["messages"] == taken_back.body["messages"]
    assert FileStore(run_folder).load("nightly-report") == state


def test_killed_between_two_tool_results_of_one_turn(
    run_folder: Path, model_server: ModelServer
) -> None:
    model_server.add(reply(tool_use("fast", id="toolu_fast"), tool_use("slow", id="toolu_slow")))
    child = Child(run_folder, "tools", model_server)
    child.wait_for("saved tool_result")  # fast's result, saved while slow still runs
    child.kill()

    state = FileStore(run_folder).load("nightly-report")
    results = {
        e.data["call_id"]: (e.outcome, e.text) for e in state.history if e.kind == "tool_result"
    }
    assert results == {
        "toolu_fast": ("ok", "fast result"),
        "toolu_slow": ("aborted", UNKNOWN_RESULT),
    }
    assert markers(run_folder, "fast") == ["fast-1"] or markers(run_folder, "fast") == ["fast-0"]

    model_server.add(reply("Half done."))
    assert resume_agent(run_folder, model_server).run(state) == "Half done."
    blocks = model_server.requests[-1].body["messages"][-1]["content"]
    assert [(b["tool_use_id"], b.get("is_error", False)) for b in blocks] == [
        ("toolu_fast", False),
        ("toolu_slow", True),
    ]
    assert markers(run_folder, "slow") == [m for m in markers(run_folder, "slow")][:1]


def test_killed_while_a_message_is_waiting(run_folder: Path, model_server: ModelServer) -> None:
    model_server.add(reply(tool_use("slow", id="toolu_slow")))
    child = Child(run_folder, "waiting", model_server)
    child.wait_for("saved waiting")  # sent while the tool runs: saved at once
    child.kill()

    state = FileStore(run_folder).load("nightly-report")
    assert [e.kind for e in state.history[-2:]] == ["tool_result", "joined"]
    assert [m.role for m in state.messages] == ["user", "assistant", "user", "user"]
    assert state.messages[-1] == Message.user("Also: add the weather.")
    assert state.waiting == []

    model_server.add(reply("Report, with the weather."))
    assert resume_agent(run_folder, model_server).run(state) == "Report, with the weather."
    last = model_server.requests[-1].body["messages"][-1]["content"]
    assert [b["type"] for b in last] == ["tool_result", "text"]
    assert last[1]["text"] == "Also: add the weather."


def test_killed_right_after_send_returned(run_folder: Path, model_server: ModelServer) -> None:
    model_server.add(reply(tool_use("slow", id="toolu_slow")))
    child = Child(run_folder, "send", model_server)  # its store takes 0.5 s to save
    child.wait_for("sent")
    child.kill()

    state = FileStore(run_folder).load("nightly-report")
    assert state.messages[-1] == Message.user("Also: add the weather.")
    assert [e.kind for e in state.history[-2:]] == ["tool_result", "joined"]


def test_a_waiting_message_joins_after_the_results_in_a_live_run(
    tmp_path: Path, model_server: ModelServer
) -> None:
    state = State(id="live", messages=[Message.user("Start")])

    @tool
    def work() -> str:
        """Works, and meanwhile the person sends a message."""
        state.send("Also this")
        assert state.waiting == [Message.user("Also this")]
        return "worked"

    os.environ.update(model_server.env)
    model_server.add(reply(tool_use("work")), reply("Done, also this."))
    Agent(model="claude-sonnet-5", store=FileStore(tmp_path), tools=[work], max_tokens=1024).run(
        state
    )
    assert [m.role for m in state.messages] == ["user", "assistant", "user", "user", "assistant"]
    assert state.messages[3] == Message.user("Also this")
