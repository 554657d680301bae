"""A run killed mid tool call and resumed, traced into a real OpenTelemetry Collector.

The child (tests/agents/crash_child.py, a real process) runs with the standard ``OTEL_*``
variables pointing at the collector and is killed with SIGKILL while its tool runs; this
process loads the State and resumes it with the same variables. The collector's file
must then hold one trace: the lost attempt (rebuilt from the saved history) with its
model call and the aborted tool call, and the resumed attempt with its ``resume`` event
and its model call; no secret and no prompt text anywhere.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from alpineagents import Agent, FileStore, tool, tracing
from alpineagents.testing import ModelServer, reply, tool_use
from tests.bench.otel_collector import Collector, Span
from tests.paths import REPO

WAIT = 120.0  # seconds: a safety net on a loaded machine, not a measure
STATE_ID = "nightly-report"


@pytest.fixture
def fresh_tracing() -> Iterator[None]:
    """No tracer of an earlier test; the one this test makes is shut down (flushed) after."""
    tracing.disable()
    yield
    tracing.disable()


def by_name(spans: list[Span], name: str) -> list[Span]:
    return [s for s in spans if s.name == name]


def test_a_killed_and_resumed_run_is_one_trace(
    tmp_path: Path,
    model_server: ModelServer,
    otel_collector: Collector,
    monkeypatch: pytest.MonkeyPatch,
    fresh_tracing: None,
) -> None:
    folder = tmp_path / "runs"
    model_server.add(reply("On it.", tool_use("slow", id="toolu_slow")))
    env = {**os.environ, **model_server.env, **otel_collector.env}
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.agents.crash_child", str(folder), STATE_ID, "tool"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        for line in child.stdout:
            if line.startswith("started slow"):
                break
        else:
            raise AssertionError(f"child ended (code {child.wait()}) before its tool started")
        # The model call ended before the tool began: its span is sent with the next batch.
        otel_collector.wait_for_spans("chat claude-sonnet-5")
    finally:
        child.send_signal(signal.SIGKILL)
        assert child.wait(WAIT) == -signal.SIGKILL

    @tool
    def slow(name: str = "slow") -> str:
        """Must not run again after a crash."""
        raise AssertionError("the aborted tool was run again")

    for key, value in {**model_server.env, **otel_collector.env}.items():
        monkeypatch.setenv(key, value)
    state = FileStore(folder).load(STATE_ID)
    model_server.add(reply("The report could not be checked."))
    agent = Agent(model="claude-sonnet-5", store=FileStore(folder), tools=[slow], max_tokens=1024)
    assert agent.run(state) == "The report could not be checked."
    tracing.disable()  # sends what is left, as a process's exit does

    spans = otel_collector.wait_for_spans("invoke_agent claude-sonnet-5", count=2)
    trace_id = format(tracing.trace_id_of(STATE_ID), "032x")
    assert {s.trace_id for s in spans} == {trace_id}

    attempts = by_name(spans, "invoke_agent claude-sonnet-5")
    lost = next(s for s in attempts if s.attributes["alpineagents.stop_reason"] == "lost")
    resumed = next(s for s in attempts if s is not lost)
    assert lost.status == 2 and lost.parent_id == "" and resumed.parent_id == ""
    assert resumed.attributes["alpineagents.stop_reason"] == "answered"
    assert resumed.attributes["gen_ai.conversation.id"] == STATE_ID
    (resume,) = resumed.events
    assert resume["name"] == "resume"
    assert resume["alpineagents.aborted_calls"] == ["toolu_slow"]
    assert resume["alpineagents.aborted_tools"] == ["slow"]

    chats = by_name(spans, "chat claude-sonnet-5")
    assert sorted(c.parent_id for c in chats) == sorted([lost.span_id, resumed.span_id])
    for chat in chats:
        attributes = chat.attributes
        assert attributes["gen_ai.operation.name"] == "chat"
        assert attributes["gen_ai.provider.name"] == "anthropic"
        assert attributes["gen_ai.request.model"] == "claude-sonnet-5"
        assert attributes["gen_ai.response.model"]
        assert attributes["gen_ai.response.id"]
        assert attributes["gen_ai.usage.input_tokens"] > 0
        assert attributes["gen_ai.usage.output_tokens"] > 0
        assert "gen_ai.usage.cache_read.input_tokens" in attributes
        assert "gen_ai.usage.cache_creation.input_tokens" in attributes
    first = next(c for c in chats if c.parent_id == lost.span_id)
    second = next(c for c in chats if c is not first)
    assert first.attributes["gen_ai.response.finish_reasons"] == ["tool_use"]
    assert second.attributes["gen_ai.response.finish_reasons"] == ["end_turn"]

    (aborted,) = by_name(spans, "execute_tool slow")
    assert aborted.parent_id == lost.span_id
    assert aborted.status == 2
    assert aborted.attributes["alpineagents.tool.outcome"] == "aborted"
    assert aborted.attributes["gen_ai.tool.call.id"] == "toolu_slow"
    assert aborted.attributes["gen_ai.tool.name"] == "slow"

    text = otel_collector.text()
    assert model_server.env["ANTHROPIC_API_KEY"] not in text
    for words in ("Write the nightly report", "On it.", "could not be checked"):
        assert words not in text  # no prompt or completion text unless asked for
