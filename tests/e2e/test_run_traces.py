"""A run's trace on the real node: its pod deleted mid tool call, resumed, one trace.

The release is upgraded with the three lines of ``telemetry`` values (the
endpoint swapped for a real OpenTelemetry Collector on the node's bridge, where pods reach
it), as a user points their runs at Jaeger or Tempo. A run's gated tool call is held, its
pod deleted (SIGTERM: the runner closes the call as ``aborted``, saves, and sends its spans
as it exits), and the run resumes in a second pod. The collector must then hold one trace
with both attempts, a ``chat`` span per model call with its GenAI attributes, the aborted
``execute_tool`` span, the ``resume`` event naming it; and no Secret's value of the
namespace and no prompt or answer text in any span.
"""

from __future__ import annotations

import base64
import json
import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from alpineagents import tracing
from tests.bench.helm import Helm
from tests.bench.otel_collector import Collector, Span
from tests.bench.tool_gate import ToolGate
from tests.e2e.environment import (
    Environment,
    apply_run,
    gated,
    run_pods,
    upgrade_release,
    wait_phase,
)
from tests.paths import REPO

pytestmark = pytest.mark.e2e
MODEL = "claude-sonnet-5"


def readme_telemetry_values() -> dict[str, Any]:
    """docs/observability.md's "three lines of values" that send every run's traces to a backend."""
    text = (REPO / "docs" / "observability.md").read_text()
    found = re.search(r"```yaml\n(telemetry:\n.*?)```", text, re.DOTALL)
    assert found is not None, "docs/observability.md has no ```yaml block of telemetry values"
    block = found.group(1)
    assert len(block.strip().splitlines()) == 3, block
    values: dict[str, Any] = yaml.safe_load(block)
    return values


@pytest.fixture
def traced(
    node_env: Environment, helm: Helm, node_otel_collector: Collector
) -> Iterator[Collector]:
    """The release upgraded to send its runs' traces to the collector; put back after."""
    values = readme_telemetry_values()
    values["telemetry"]["otlpEndpoint"] = node_otel_collector.endpoint
    upgrade_release(node_env, helm, values)
    try:
        yield node_otel_collector
    finally:
        upgrade_release(node_env, helm, {})


_SECRET_KEY = re.compile(r"(?i)secret|password|token|api.?key")


def secret_values(env: Environment) -> list[str]:
    """The secret values of the release's namespace: API keys, the store's keys and
    password, the runs' own credentials (not names such as an access key id)."""
    listing = json.loads(env.kubectl("get", "secrets", "-o", "json").stdout)
    found = []
    for secret in listing["items"]:
        for key, value in (secret.get("data") or {}).items():
            if _SECRET_KEY.search(key):
                found.append(base64.b64decode(value).decode("utf-8", "replace"))
    assert len(found) >= 3, "expected the model's key and the store's keys"
    return [value for value in found if value]


def named(spans: list[Span], name: str) -> list[Span]:
    return [s for s in spans if s.name == name]


def test_a_run_deleted_mid_tool_and_resumed_is_one_trace_with_the_aborted_call(
    node_env: Environment, gate: ToolGate, traced: Collector
) -> None:
    name = f"r-{uuid.uuid4().hex[:6]}"
    apply_run(node_env, name, gated(gate, name))
    gate.wait_started(name)
    [first] = run_pods(node_env, name)
    env = {e["name"]: e.get("value") for e in first["spec"]["containers"][0]["env"]}
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == traced.endpoint
    secrets = secret_values(node_env)  # the run's own credentials exist while it runs
    node_env.kubectl("delete", "pod", f"{name}-1", "--wait=false")
    done = wait_phase(node_env, name, "Succeeded")
    assert done["attempt"] == 2 and gate.starts(name) == 1
    [call_id] = done["abortedCalls"]

    # Each pod sends its spans as it exits: the first on SIGTERM, if its save came before
    # the operator's claim for the next pod; if the claim came first, its successor
    # rebuilds the attempt from the history instead. One of the two, never both.
    spans = traced.wait_for_spans(f"invoke_agent {MODEL}", count=2)
    trace_id = format(tracing.trace_id_of(done["stateId"]), "032x")
    assert {s.trace_id for s in spans} == {trace_id}
    attempts = named(spans, f"invoke_agent {MODEL}")
    assert len(attempts) == 2 and all(a.parent_id == "" for a in attempts)
    stopped = ("interrupted", "lost")
    lost = next(a for a in attempts if a.attributes["alpineagents.stop_reason"] in stopped)
    resumed = next(a for a in attempts if a is not lost)
    assert lost.status == 2  # the attempt ended on the pod's loss
    assert resumed.attributes["alpineagents.stop_reason"] == "answered"
    for attempt in attempts:
        assert attempt.attributes["gen_ai.conversation.id"] == done["stateId"]
    (resume,) = resumed.events
    assert resume["name"] == "resume"
    assert resume["alpineagents.aborted_calls"] == [call_id]
    assert resume["alpineagents.aborted_tools"] == ["shell"]

    chats = named(spans, f"chat {MODEL}")
    assert sorted(c.parent_id for c in chats) == sorted([lost.span_id, resumed.span_id])
    for chat in chats:
        attributes = chat.attributes
        assert attributes["gen_ai.operation.name"] == "chat"
        assert attributes["gen_ai.provider.name"] == "anthropic"
        assert attributes["gen_ai.request.model"] == MODEL
        assert attributes["gen_ai.response.model"]
        assert attributes["gen_ai.response.id"]
        assert attributes["gen_ai.usage.input_tokens"] > 0
        assert attributes["gen_ai.usage.output_tokens"] > 0
        assert "gen_ai.usage.cache_read.input_tokens" in attributes
        assert "gen_ai.usage.cache_creation.input_tokens" in attributes
    first_chat = next(c for c in chats if c.parent_id == lost.span_id)
    assert first_chat.attributes["gen_ai.response.finish_reasons"] == ["tool_use"]

    (aborted,) = named(spans, "execute_tool shell")
    assert aborted.parent_id == lost.span_id
    assert aborted.status == 2
    assert aborted.attributes["alpineagents.tool.outcome"] == "aborted"
    assert aborted.attributes["gen_ai.tool.call.id"] == call_id
    assert aborted.attributes["gen_ai.tool.name"] == "shell"

    text = traced.text()
    for value in secrets:
        assert value not in text, "a Secret's value is in a span"
    for words in ("Do the job", gate.url, done["answer"][:40]):
        assert words not in text  # no prompt, argument or answer text unless asked for
