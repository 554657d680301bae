"""What works against the Anthropic API works against each provider: the SDK's own client
(AnthropicBedrock, AnthropicVertex, AnthropicFoundry, or Anthropic through a gateway)
against a scripted server that speaks the provider's wire and checks its authentication.
Each test runs once per provider (tests/providers/conftest.py)."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from alpineagents import Agent, FileStore, Message, State, tool, tracing
from alpineagents.testing import error, hold, reply, tool_use
from tests.bench.runner_process import (
    BLOCKING,
    RunnerProcess,
    Workspace,
    tool_results,
    wait_for_file,
)
from tests.providers.conftest import Cloud


@tool
def lookup(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def agent_for(cloud: Cloud, store: FileStore | None = None, **settings: object) -> Agent:
    return Agent(cloud.model_id, store, tools=[lookup], provider=cloud.provider(), **settings)  # type: ignore[arg-type]


def written(folder: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in folder.rglob("*") if p.is_file())


def assert_no_secret(cloud: Cloud, *texts: str) -> None:
    secrets = cloud.secrets()
    assert secrets or cloud.name == "vertex"  # Vertex's tokens are issued below
    for text in texts:
        for secret in secrets:
            assert secret not in text, f"a {cloud.name} credential was written"


def test_a_run_calls_a_tool_and_answers(cloud: Cloud, tmp_path: Path) -> None:
    cloud.model.add(reply("Let me look.", tool_use("lookup", {"city": "Lyon"})), reply("Sunny."))
    store = FileStore(tmp_path / "states")
    state = State("weather", [Message.user("What is the weather in Lyon?")])

    assert agent_for(cloud, store).run(state) == "Sunny."

    assert cloud.refused() == []
    assert [r.body["model"] for r in cloud.model.requests] == [cloud.model_id] * 2
    assert [e.outcome for e in tool_results(state)] == ["ok"]
    assert cloud.issued() or cloud.name in ("gateway", "foundry-key")
    assert_no_secret(cloud, written(tmp_path / "states"))
    if cloud.name == "gateway":  # the gateway's headers went with every request
        for sent in cloud.model.requests:
            assert sent.headers["x-gateway-route"] == "team-a"
            assert (
                sent.headers["x-gateway-key"]
                == cloud.env[next(iter(cloud.env.keys() - {"ANTHROPIC_API_KEY"}))]
            )


def test_prompt_caching_and_its_usage_numbers_come_through(cloud: Cloud) -> None:
    cloud.model.add(reply("One."), reply("Two."))
    agent = agent_for(cloud, system="You answer briefly. " * 400)  # past 1,024 tokens
    state = State("cached", [Message.user("first")])
    agent.run(state)
    state.send("second")
    agent.run(state)

    first, second = (e.data["usage"] for e in state.history if e.kind == "model_reply")
    assert first["cache_creation_input_tokens"] > 0
    assert second["cache_read_input_tokens"] >= first["cache_creation_input_tokens"]
    # Priced as the Anthropic model the provider's id names (Sonnet: $3 in, $15 out).
    assert state.cost_usd == pytest.approx(
        sum(e.data["cost_usd"] for e in state.history if e.kind == "model_reply")
    )
    assert state.cost_usd > 0


def test_a_rate_limit_and_an_overload_are_waits_not_failures(cloud: Cloud) -> None:
    cloud.model.add(error(429), error(529), reply("Done after waiting."))
    waits: list[str] = []
    agent = agent_for(cloud, on_throttle=lambda state, throttle: waits.append(throttle.limit))
    state = State("throttled", [Message.user("go")])

    assert agent.run(state) == "Done after waiting."
    assert waits == ["requests", "overloaded"]
    assert not [e for e in state.history if e.kind == "model_error"]


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    monkeypatch.delenv(tracing.CAPTURE_CONTENT_ENV, raising=False)
    exporter = InMemorySpanExporter()
    tracing.enable(processor=SimpleSpanProcessor(exporter))
    yield exporter
    tracing.disable()


def test_traces_name_the_provider_and_hold_no_credential(
    cloud: Cloud, spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    cloud.model.add(reply(tool_use("lookup", {"city": "Oslo"})), reply("Cold."))
    store = FileStore(tmp_path / "states")
    agent_for(cloud, store).run(State("traced", [Message.user("Weather in Oslo?")]))

    finished = spans.get_finished_spans()
    model_spans = [s for s in finished if s.name.startswith(("chat", "invoke_agent"))]
    assert len(model_spans) == 3, [s.name for s in finished]  # the attempt, two chats
    for span in model_spans:
        assert span.attributes is not None
        assert span.attributes["gen_ai.system"] == cloud.gen_ai_name
        assert span.attributes["gen_ai.provider.name"] == cloud.gen_ai_name
    attributes = json.dumps([dict(s.attributes or {}) for s in finished], default=str)
    assert_no_secret(cloud, attributes)


def test_a_pod_killed_mid_tool_resumes_with_the_call_aborted_and_writes_no_credential(
    cloud: Cloud,
    tmp_path: Path,
    runners: list[RunnerProcess],
    leftover_commands: list[int],
) -> None:
    workspace = Workspace(tmp_path, cloud.model, runners)
    cloud.model.add(reply(tool_use("shell", {"command": BLOCKING}, id="toolu_send")))
    manifest = workspace.manifest(
        model=cloud.model_id, provider=cloud.spec, tools=["shell"], prompt="Send the email."
    )
    runner = workspace.start(manifest, "--log-format", "json", **cloud.env)
    leftover_commands.append(int(wait_for_file(workspace.work / "started")))
    runner.signal(signal.SIGKILL)
    assert runner.wait() == -signal.SIGKILL

    cloud.model.add(reply("The email may have gone out: I stop here."))
    again = workspace.run(manifest, "--log-format", "json", **cloud.env)
    assert again.process.returncode == 0, again.stderr
    assert again.message["aborted"] == ["toolu_send"]
    (result,) = tool_results(workspace.store.load("job"))
    assert result.outcome == "aborted"
    assert (workspace.work / "started").read_text().count("\n") == 1  # never run twice
    assert cloud.refused() == []
    assert_no_secret(
        cloud,
        written(workspace.runs),
        runner.stdout + runner.stderr,
        again.stdout + again.stderr,
        json.dumps(again.message),
    )


def test_a_pod_killed_while_the_model_is_asked_sends_the_same_request_on_resume(
    cloud: Cloud, tmp_path: Path, runners: list[RunnerProcess]
) -> None:
    workspace = Workspace(tmp_path, cloud.model, runners)
    cloud.model.add(hold(reply("Too late.")))
    manifest = workspace.manifest(model=cloud.model_id, provider=cloud.spec, prompt="Think.")
    runner = workspace.start(manifest, **cloud.env)
    cloud.model.wait_for_requests(1)
    runner.signal(signal.SIGKILL)
    assert runner.wait() == -signal.SIGKILL

    cloud.model.add(reply("Thought."))
    again = workspace.run(manifest, **cloud.env)
    assert again.process.returncode == 0, again.stderr
    assert again.message["answer"] == "Thought."
    kinds = [e.kind for e in workspace.store.load("job").history]
    assert kinds[:4] == ["message", "model_request", "model_error", "model_request"]
    # The request taken back is sent again byte for byte: the cache the lost pod wrote is read.
    first, last = cloud.model.requests[0], cloud.model.requests[-1]
    assert last.body == first.body
    assert cloud.refused() == []
