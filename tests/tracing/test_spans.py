"""The spans of a run, taken by the real OpenTelemetry SDK's in-memory exporter.

The scripted model server answers through the real ``anthropic`` client; each test turns
tracing on with a ``SimpleSpanProcessor`` (every span handed over as it ends) and off
again after. The off case runs in a fresh interpreter: it must not load the SDK.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import anthropic
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from alpineagents import Agent, FileStore, Message, State, open_store, tool, tracing
from alpineagents.testing import ModelServer, hold, reply, tool_use
from tests.bench.minio_server import S3Server
from tests.paths import REPO

SECRET = "sk-ant-secret-value-0123456789"


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """Tracing on, into memory, for one test."""
    monkeypatch.delenv(tracing.CAPTURE_CONTENT_ENV, raising=False)
    exporter = InMemorySpanExporter()
    tracing.enable(processor=SimpleSpanProcessor(exporter))
    yield exporter
    tracing.disable()


def named(exporter: InMemorySpanExporter, prefix: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name.startswith(prefix)]


def agent_with_tools(client: anthropic.Anthropic, folder: Path) -> Agent:
    @tool
    def lookup(city: str) -> str:
        """Looks a city up."""
        return f"{city}: sunny"

    @tool
    def broken() -> str:
        """Always fails."""
        raise RuntimeError("the service is down")

    return Agent(
        model="claude-sonnet-5",
        store=FileStore(folder),
        tools=[lookup, broken],
        client=client,
        max_tokens=512,
    )


def test_a_run_is_an_attempt_span_with_model_and_tool_spans(
    tmp_path: Path,
    model_server: ModelServer,
    model_client: anthropic.Anthropic,
    spans: InMemorySpanExporter,
) -> None:
    model_server.add(
        reply(tool_use("lookup", {"city": "Bern"}, id="toolu_1"), tool_use("broken", id="toolu_2")),
        reply("Sunny in Bern."),
    )
    state = State(id="weather", messages=[Message.user("Weather in Bern?")])
    assert agent_with_tools(model_client, tmp_path).run(state) == "Sunny in Bern."

    (attempt,) = named(spans, "invoke_agent")
    assert attempt.name == "invoke_agent claude-sonnet-5"
    assert attempt.context.trace_id == tracing.trace_id_of("weather")
    assert attempt.parent is None
    assert attempt.attributes is not None
    assert attempt.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert attempt.attributes["alpineagents.stop_reason"] == "answered"
    assert attempt.attributes["alpineagents.usage.output_tokens"] == state.usage["output_tokens"]
    assert not attempt.events  # a first attempt: no resume

    chats = named(spans, "chat claude-sonnet-5")
    assert len(chats) == 2
    replies = [e for e in state.history if e.kind == "model_reply"]
    for chat, entry in zip(chats, replies, strict=True):
        assert chat.parent is not None and chat.parent.span_id == attempt.context.span_id
        attributes = dict(chat.attributes or {})
        usage = entry.data["usage"]
        assert attributes["gen_ai.usage.output_tokens"] == usage["output_tokens"]
        assert attributes["gen_ai.usage.input_tokens"] == (
            usage["input_tokens"]
            + usage["cache_read_input_tokens"]
            + usage["cache_creation_input_tokens"]
        )
        assert (
            attributes["gen_ai.usage.cache_read.input_tokens"] == usage["cache_read_input_tokens"]
        )
        assert (
            attributes["gen_ai.usage.cache_creation.input_tokens"]
            == usage["cache_creation_input_tokens"]
        )
        assert attributes["gen_ai.response.finish_reasons"] == (entry.data["stop_reason"],)
        assert attributes["gen_ai.response.model"] == entry.data["model"]
        assert "gen_ai.input.messages" not in attributes
    # The span id is saved with each model request: a resumed attempt can rebuild this one.
    requests = [e for e in state.history if e.kind == "model_request"]
    assert {e.data[tracing.SPAN_ID_KEY] for e in requests} == {
        format(attempt.context.span_id, "016x")
    }

    tools = {s.name: s for s in named(spans, "execute_tool")}
    ok, failed = tools["execute_tool lookup"], tools["execute_tool broken"]
    assert ok.attributes is not None and failed.attributes is not None
    assert ok.attributes["alpineagents.tool.outcome"] == "ok"
    assert ok.attributes["gen_ai.tool.call.id"] == "toolu_1"
    assert ok.status.status_code == StatusCode.UNSET
    assert failed.attributes["alpineagents.tool.outcome"] == "error"
    assert failed.attributes["error.type"] == "RuntimeError"
    assert failed.status.status_code == StatusCode.ERROR
    assert ok.parent is not None and ok.parent.span_id == attempt.context.span_id


def test_an_interrupted_attempt_and_its_aborted_call_have_status_error(
    tmp_path: Path,
    model_server: ModelServer,
    model_client: anthropic.Anthropic,
    spans: InMemorySpanExporter,
) -> None:
    @tool
    def slow() -> str:
        """Its run is interrupted while it runs (as by a pod's SIGTERM)."""
        raise KeyboardInterrupt

    model_server.add(reply(tool_use("slow", id="toolu_i")))
    agent = Agent(
        model="claude-sonnet-5", store=FileStore(tmp_path), tools=[slow], client=model_client
    )
    with pytest.raises(KeyboardInterrupt):
        agent.run(State(id="stopped", messages=[Message.user("Go")]))
    (attempt,) = named(spans, "invoke_agent")
    assert (attempt.attributes or {})["alpineagents.stop_reason"] == "interrupted"
    assert attempt.status.status_code == StatusCode.ERROR
    (call,) = named(spans, "execute_tool")
    assert (call.attributes or {})["alpineagents.tool.outcome"] == "aborted"
    assert call.status.status_code == StatusCode.ERROR

    # The run resumed: its attempt names the call the stopped one closed as aborted.
    spans.clear()
    model_server.add(reply("Stopped before it ended."))
    assert agent.run(FileStore(tmp_path).load("stopped")) == "Stopped before it ended."
    (resumed,) = named(spans, "invoke_agent")
    (resume,) = resumed.events
    assert resume.name == "resume"
    assert (resume.attributes or {})["alpineagents.aborted_calls"] == ("toolu_i",)


def test_content_is_captured_only_when_asked_and_never_a_secret(
    tmp_path: Path,
    model_server: ModelServer,
    model_client: anthropic.Anthropic,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(tracing.CAPTURE_CONTENT_ENV, "true")
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    exporter = InMemorySpanExporter()
    tracing.enable(processor=SimpleSpanProcessor(exporter))
    try:
        model_server.add(reply(tool_use("lookup", {"city": SECRET}, id="toolu_1")), reply("Done."))
        state = State(id="captured", messages=[Message.user(f"Is {SECRET} a key? Weather?")])
        assert agent_with_tools(model_client, tmp_path).run(state) == "Done."
    finally:
        tracing.disable()
    everything = json.dumps(
        [dict(s.attributes or {}) for s in exporter.get_finished_spans()], default=list
    )
    assert SECRET not in everything
    chat = named(exporter, "chat")[0]
    assert chat.attributes is not None
    assert "Is *** a key? Weather?" in str(chat.attributes["gen_ai.input.messages"])
    assert "lookup" in str(chat.attributes["gen_ai.output.messages"])
    (lookup,) = named(exporter, "execute_tool lookup")
    assert lookup.attributes is not None
    assert lookup.attributes["gen_ai.tool.call.result"] == "***: sunny"


def test_a_resumed_attempt_rebuilds_the_lost_one(
    tmp_path: Path,
    model_server: ModelServer,
    model_client: anthropic.Anthropic,
    spans: InMemorySpanExporter,
) -> None:
    # A lost attempt, as its pod left it: a tool call started and never finished. Its
    # saved model request names its span; the closing entries mark the call aborted.
    @tool
    def slow() -> str:
        """Stands for a tool a killed pod was running."""
        raise KeyboardInterrupt  # the run stops here, like a pod that goes away

    model_server.add(reply(tool_use("slow", id="toolu_slow")))
    state = State(id="lost-once", messages=[Message.user("Go")])
    agent = Agent(
        model="claude-sonnet-5", store=FileStore(tmp_path), tools=[slow], client=model_client
    )
    with pytest.raises(KeyboardInterrupt):
        agent.run(state)
    first = named(spans, "invoke_agent")[0]
    spans.clear()

    loaded = FileStore(tmp_path).load("lost-once")
    model_server.add(reply("Resumed."))
    assert agent.run(loaded) == "Resumed."
    (attempt,) = named(spans, "invoke_agent")
    assert attempt.context.trace_id == first.context.trace_id
    (event,) = attempt.events
    assert event.name == "resume"
    # The first attempt ended (it saved its stop): it sent its own span, none is rebuilt.
    assert named(spans, "execute_tool") == []


def test_off_loads_no_sdk_and_no_exporter(tmp_path: Path, model_server: ModelServer) -> None:
    # The OpenTelemetry API itself may be loaded (recent anthropic SDKs import it when it
    # is installed); the SDK and the exporters, the cost of tracing, must not be.
    probe = (
        "import sys\n"
        "from alpineagents import Agent, FileStore, Message, State\n"
        f"agent = Agent(model='claude-sonnet-5', store=FileStore({str(tmp_path)!r}))\n"
        "assert agent.run(State(id='off', messages=[Message.user('Hi')])) == 'Hello.'\n"
        "print(sorted(m for m in sys.modules\n"
        "    if m.startswith(('opentelemetry.sdk', 'opentelemetry.exporter'))))\n"
    )
    model_server.add(reply("Hello."))
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO / "operator"), **model_server.env}
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True
    )
    assert done.stdout.strip() == "[]"


def snapshot(folder: Path, into: Path) -> Path:
    """The store's folder as a process killed now would leave it."""
    shutil.copytree(folder, into)
    return into


def test_each_lost_attempt_is_rebuilt_once_in_a_chain_of_losses(
    tmp_path: Path,
    model_server: ModelServer,
    model_client: anthropic.Anthropic,
    spans: InMemorySpanExporter,
) -> None:
    # Two attempts lost in a row, each mid tool call (the store copied while the tool
    # runs is what a killed pod leaves), then a third that answers.
    live = tmp_path / "live"
    copies: list[Path] = []

    @tool
    def slow() -> str:
        """Its process is lost while it runs."""
        copies.append(snapshot(live, tmp_path / f"lost-{len(copies)}"))
        raise KeyboardInterrupt  # ends this process's run; the copy is the lost one

    agent = Agent(model="claude-sonnet-5", store=FileStore(live), tools=[slow], client=model_client)
    model_server.add(reply(tool_use("slow", id="toolu_a")))
    with pytest.raises(KeyboardInterrupt):
        agent.run(State(id="chain", messages=[Message.user("Go")]))
    model_server.add(reply(tool_use("slow", id="toolu_b")))
    resumed = Agent(
        model="claude-sonnet-5", store=FileStore(copies[0]), tools=[slow], client=model_client
    )
    live = copies[0]  # the second attempt saves here; its tool copies this folder
    with pytest.raises(KeyboardInterrupt):
        resumed.run(FileStore(copies[0]).load("chain"))
    model_server.add(reply("Done."))
    last = Agent(model="claude-sonnet-5", store=FileStore(copies[1]), client=model_client)
    spans.clear()  # the interrupted runs' own spans: what a killed pod never sends
    assert last.run(FileStore(copies[1]).load("chain")) == "Done."

    attempts = named(spans, "invoke_agent")
    rebuilt = [
        a for a in attempts if (a.attributes or {}).get("alpineagents.stop_reason") == "lost"
    ]
    assert len(rebuilt) == 1  # only the attempt lost last: the one before was rebuilt by it
    (aborted,) = named(spans, "execute_tool")
    assert (aborted.attributes or {})["gen_ai.tool.call.id"] == "toolu_b"
    assert aborted.parent is not None and aborted.parent.span_id == rebuilt[0].context.span_id
    saved = FileStore(copies[1]).load("chain")
    second_attempt = [
        e.data[tracing.SPAN_ID_KEY] for e in saved.history if e.kind == "model_request"
    ][1]
    assert format(rebuilt[0].context.span_id, "016x") == second_attempt
    assert {s.context.trace_id for s in spans.get_finished_spans()} == {
        tracing.trace_id_of("chain")
    }


def test_an_attempt_lost_while_the_model_was_asked_has_a_failed_chat_span(
    tmp_path: Path,
    model_server: ModelServer,
    model_client: anthropic.Anthropic,
    spans: InMemorySpanExporter,
) -> None:
    model_server.add(hold(reply("Too late.")))
    agent = Agent(model="claude-sonnet-5", store=FileStore(tmp_path / "live"), client=model_client)
    running = threading.Thread(
        target=agent.run, args=(State(id="asked", messages=[Message.user("Hi")]),)
    )
    running.start()
    model_server.wait_for_requests(1)
    lost = snapshot(tmp_path / "live", tmp_path / "lost")
    model_server.release()
    running.join()
    spans.clear()

    model_server.add(reply("Hello again."))
    resumed = Agent(model="claude-sonnet-5", store=FileStore(lost), client=model_client)
    assert resumed.run(FileStore(lost).load("asked")) == "Hello again."
    (rebuilt,) = [
        a
        for a in named(spans, "invoke_agent")
        if (a.attributes or {}).get("alpineagents.stop_reason") == "lost"
    ]
    chats = named(spans, "chat")
    (failed,) = [c for c in chats if c.status.status_code == StatusCode.ERROR]
    assert failed.parent is not None and failed.parent.span_id == rebuilt.context.span_id
    assert (failed.attributes or {})["error.type"] == "lost"


def test_an_attempt_fenced_off_its_state_sends_no_span_its_successor_rebuilds(
    model_server: ModelServer,
    model_client: anthropic.Anthropic,
    spans: InMemorySpanExporter,
    minio: S3Server,
) -> None:
    # A pod deleted mid tool: the operator claims the State for its replacement before
    # the pod's SIGTERM save lands, so that save is refused. The pod's spans of the
    # attempt and of the call its stop cut short would stand beside the ones its
    # successor rebuilds from the history: each attempt must be in the trace once.
    url = f"s3://{minio.bucket}/{minio.unique_prefix()}?endpoint={minio.endpoint}&secure=false"
    keys = {"AWS_ACCESS_KEY_ID": minio.access_key, "AWS_SECRET_ACCESS_KEY": minio.secret_key}

    @tool
    def slow() -> str:
        """Runs while its pod is deleted."""
        open_store(url, env=keys).claim("fenced")  # the operator, for the next pod
        raise KeyboardInterrupt  # the pod's SIGTERM

    model_server.add(reply(tool_use("slow", id="toolu_f")))
    agent = Agent(
        model="claude-sonnet-5", store=open_store(url, env=keys), tools=[slow], client=model_client
    )
    with pytest.raises(KeyboardInterrupt) as stopped:
        agent.run(State(id="fenced", messages=[Message.user("Go")]))
    assert "StateFencedError" in "".join(getattr(stopped.value, "__notes__", []))
    assert named(spans, "invoke_agent") == [] and named(spans, "execute_tool") == []

    model_server.add(reply("Done."))
    store = open_store(url, env=keys)
    state = store.load("fenced")
    store.claim("fenced")
    assert Agent(model="claude-sonnet-5", store=store, client=model_client).run(state) == "Done."
    attempts = named(spans, "invoke_agent")
    assert sorted(str((a.attributes or {})["alpineagents.stop_reason"]) for a in attempts) == [
        "answered",
        "lost",
    ]
    lost = next(a for a in attempts if (a.attributes or {})["alpineagents.stop_reason"] == "lost")
    (aborted,) = named(spans, "execute_tool")
    assert (aborted.attributes or {})["gen_ai.tool.call.id"] == "toolu_f"
    assert aborted.parent is not None and aborted.parent.span_id == lost.context.span_id
    first_chat = named(spans, "chat")[0]  # sent by the fenced attempt as it ended
    assert first_chat.parent is not None and first_chat.parent.span_id == lost.context.span_id


def test_a_subagent_is_a_trace_of_its_own_linked_to_the_call_that_started_it(
    tmp_path: Path,
    model_server: ModelServer,
    model_client: anthropic.Anthropic,
    spans: InMemorySpanExporter,
) -> None:
    store = FileStore(tmp_path)
    helper = Agent(model="claude-haiku-5", store=store, client=model_client)
    lead = Agent(
        model="claude-sonnet-5",
        store=store,
        tools=[helper.as_tool("research", "Researches a question.")],
        client=model_client,
    )
    model_server.add(
        reply(tool_use("research", {"task": "Find it"}, id="toolu_r")),
        reply("Found it."),
        reply("The lead's answer."),
    )
    assert lead.run(State(id="lead", messages=[Message.user("Go")])) == "The lead's answer."
    (call,) = named(spans, "execute_tool research")
    (child,) = named(spans, "invoke_agent claude-haiku-5")
    assert child.context.trace_id == tracing.trace_id_of("lead.toolu_r")
    assert child.parent is None
    assert [link.context.span_id for link in child.links] == [call.context.span_id]
    assert (child.attributes or {})["alpineagents.state.parent_id"] == "lead"


@pytest.mark.parametrize(
    ("env", "on"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
    ],
)
def test_the_standard_variables_turn_tracing_on(env: dict[str, str], on: bool) -> None:
    assert tracing.enabled_by_environment(env) is on


@pytest.mark.parametrize(
    ("variables", "said"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER='zipkin' is not supported"),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
            "OTLP protocol 'grpc' is not supported by alpineagents: it sends OTLP over HTTP",
        ),
    ],
)
def test_an_exporter_it_cannot_make_fails_the_run_saying_what_to_set(
    tmp_path: Path,
    model_server: ModelServer,
    model_client: anthropic.Anthropic,
    monkeypatch: pytest.MonkeyPatch,
    variables: dict[str, str],
    said: str,
) -> None:
    tracing.disable()
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    state = State(id="misconfigured", messages=[Message.user("Hi")])
    agent = Agent(model="claude-sonnet-5", store=FileStore(tmp_path), client=model_client)
    with pytest.raises(ValueError, match=said):
        agent.run(state)
    assert state.stopped == "error"  # saved as the run's end, like any failure
    assert model_server.requests == []
