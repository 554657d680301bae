"""The conversation every benchmark runs, on our side: an instant model and one tool.

Each step is one assistant message calling ``run_command`` with an input of about 300
bytes, and the tool's result of about 300 bytes. The model answers in no time (a stand-in
for ``anthropic.AsyncAnthropic`` whose ``messages.create`` returns a reply built in
memory), so what is measured is the agent and its store, nothing else. The LangGraph side
(:mod:`benchmarks.langgraph_peer`) runs the same conversation with the same payloads.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anthropic

from alpineagents import Agent, Message, State, Store, tool

from .measure import mark, since

FIRST_MESSAGE = "Check the nightly build of every service and fix what is broken."
MODEL = "claude-sonnet-5"
# About 300 bytes each, as JSON: the tool call's input and the tool's result.
COMMAND = (
    "cd /srv/build/service-{n:05d} && ./ci/run --stage=test --shard=3/8 --retries=2 "
    "--junit=reports/junit-{n:05d}.xml --timeout=900 --env=staging --cache=/var/cache/ci "
    "--artifacts=s3://builds/nightly/{n:05d}/ --notify=oncall@example.com --log-level=info "
    "--keep-going --jobs=4 --seed=424242"
)
RESULT = (
    "service-{n:05d}: 412 tests, 409 passed, 3 skipped, 0 failed in 71.4 s; coverage 83.1% "
    "(+0.2); artifacts uploaded to s3://builds/nightly/{n:05d}/ (14 files, 2.3 MB); junit "
    "report written; slowest test test_migrations_roll_forward took 9.8 s; no flaky tests "
    "detected; cache hit ratio 0.91; exit code 0"
)


def command(n: int) -> str:
    return COMMAND.format(n=n)


def result(n: int) -> str:
    return RESULT.format(n=n)


@tool
async def run_command(command: str) -> str:
    """Runs a shell command and returns what it printed.

    Args:
        command: the command line
    """
    n = int(command.split("service-", 1)[1][:5])
    return result(n)


class _Reply:
    """What ``messages.create`` returns: only ``model_dump`` is used by the Agent."""

    def __init__(self, body: dict[str, Any]) -> None:
        self._body = body

    def model_dump(self, **_: Any) -> dict[str, Any]:
        return self._body


class _RawReply:
    """What ``messages.with_raw_response.create`` returns: the reply and its headers."""

    headers: dict[str, str] = {}

    def __init__(self, reply: _Reply) -> None:
        self._reply = reply

    async def parse(self) -> _Reply:
        return self._reply


class _RawMessages:
    def __init__(self, model: InstantModel) -> None:
        self._model = model

    async def create(self, **request: Any) -> _RawReply:
        return _RawReply(self._model.reply(request))


class _Messages(anthropic.resources.AsyncMessages):
    """The async client's messages, answered at once: an AsyncMessages, so the Agent takes
    the path it takes with ``AsyncAnthropic`` (awaited on its loop, no thread)."""

    def __init__(self, model: InstantModel) -> None:  # no HTTP client behind it
        self._model = model

    @property
    def with_raw_response(self) -> Any:  # the SDK's is a cached_property
        return _RawMessages(self._model)


@dataclass
class InstantModel:
    """Answers ``steps`` times with a ``run_command`` call, then with a short text.

    ``calls`` holds a ``measure.mark()`` of every request, so the time between two
    requests is what one step cost the agent (and its store, if it has one).
    """

    steps: int
    calls: list[tuple[float, float]] = field(default_factory=list)  # measure.mark() of each

    def reply(self, request: dict[str, Any]) -> _Reply:
        self.calls.append(mark())
        n = len(self.calls) - 1
        if n < self.steps:
            content: list[dict[str, Any]] = [
                {
                    "type": "tool_use",
                    "id": f"toolu_{n:020d}",
                    "name": "run_command",
                    "input": {"command": command(n)},
                }
            ]
            stop = "tool_use"
        else:
            content = [{"type": "text", "text": "Every service is green."}]
            stop = "end_turn"
        return _Reply(
            {
                "id": f"msg_{n:020d}",
                "type": "message",
                "role": "assistant",
                "model": MODEL,
                "content": content,
                "stop_reason": stop,
                "usage": {"input_tokens": 1000 + n, "output_tokens": 90},
            }
        )

    def client(self) -> anthropic.AsyncAnthropic:
        """An ``anthropic.AsyncAnthropic`` whose ``messages`` is this instant model."""
        client = anthropic.AsyncAnthropic(api_key="benchmark", max_retries=0)
        client.messages = _Messages(self)  # type: ignore[misc]  # a cached_property
        return client

    def step_seconds(self) -> list[float]:
        """How long each step took: from one model request to the next (less the time the
        thread waited for a CPU, see :func:`benchmarks.measure.since`)."""
        return [
            (b[0] - a[0]) - (b[1] - a[1]) for a, b in zip(self.calls, self.calls[1:], strict=False)
        ]


def timed_store(store: Store, record: Callable[[float], None]) -> Store:
    """``store`` with every ``save`` timed into ``record`` (a subclass, same object state)."""
    kind = type(store)

    def save(self: Store, state: State) -> None:
        start = mark()
        try:
            kind.save(self, state)
        finally:
            record(since(start))

    timed = type(f"Timed{kind.__name__}", (kind,), {"save": save})
    store.__class__ = timed
    return store


@dataclass
class OurRun:
    """One run of the conversation with our Agent."""

    state: State
    model: InstantModel
    saves: list[tuple[int, float]]  # (step it happened in, seconds) of every save
    seconds: float


def run_ours(state_id: str, steps: int, store: Store | None) -> OurRun:
    """Run the conversation for ``steps`` steps (then an answer) with ``store``."""
    model = InstantModel(steps)
    saves: list[tuple[int, float]] = []
    if store is not None:
        timed_store(store, lambda took: saves.append((len(model.calls), took)))
    # max_tokens at 4096: replies up to that are not streamed (the instant model does not stream).
    agent = Agent(MODEL, store, tools=[run_command], client=model.client(), max_tokens=4096)
    state = State(state_id, [Message.user(FIRST_MESSAGE)])
    start = mark()
    answer = agent.run(state)
    took = since(start)
    check_run(state, steps, answer)
    return OurRun(state, model, saves, took)


def check_run(state: State, steps: int, answer: str | None) -> None:
    """Fail loudly unless the run made exactly the conversation it was meant to."""
    results = [e for e in state.history if e.kind == "tool_result"]
    if answer != "Every service is green." or len(results) != steps:
        raise AssertionError(
            f"the benchmark conversation went wrong: answer {answer!r}, "
            f"{len(results)} tool results for {steps} steps"
        )
    if steps and json.loads(json.dumps(results[-1].data))["content"] != result(steps - 1):
        raise AssertionError("the last tool result is not the one the tool returned")


def check_loaded(loaded: State, saved: State) -> None:
    """A load must give back exactly the State that was saved."""
    if loaded != saved or loaded.messages != saved.messages:
        raise AssertionError(
            f"load gave back a different State: {len(loaded.history)} entries, "
            f"{len(saved.history)} saved"
        )
