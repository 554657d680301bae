"""Long runs through the billing model server: the conversation, its model, and each side.

Every turn of a run calls one tool, ``check_service``, whose result is 2 KB of log text;
the last turn answers. The model is :class:`Responder`, a pure function of the request
(which turn it is comes from the ``tool_use_id`` of the newest tool result), so both
sides see the same model, turn for turn, whatever they cut from their requests. A request
that carries no tools, or whose last user message asks for a summary in its text, gets a
summary: both sides' compaction calls are answered the same way.

One run, one :class:`~alpineagents.testing.ModelServer` with billing on: its ``bill``
sums what the run would be billed for its input, in input-price units (cache writes
1.25x, cache reads 0.1x), next to the same requests without caching.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic

from alpineagents import Agent, FileStore, Message, State, tool
from alpineagents.context import Compaction
from alpineagents.testing import ModelServer, Reply, reply, tool_use
from alpineagents.testing.billing import Bill

MODEL = "claude-sonnet-4-5"
WINDOW = 200_000  # the Messages API's context window, in tokens
SYSTEM = "You keep a fleet of services healthy. Check each service with check_service."
FIRST_MESSAGE = "Check every service of the fleet, one at a time, and tell me when all are green."
ANSWER = "Every service is green."
RESULT_BYTES = 2048
# LangChain's SummarizationMiddleware fires at 150k tokens of a 200k window (issue 22).
SUMMARY_TRIGGER = 0.75
# ContextEditingMiddleware's default ClearToolUsesEdit fires at 100k tokens: half the window.
EDIT_TRIGGER = 0.5
_TOOL_ID = re.compile(r"toolu_(\d+)$")
_LOG_LINE = (
    "{t:02d}:{m:02d}:{s:02d} service-{n:05d} shard {k:02d}/16: 412 tests, 409 passed, "
    "3 skipped, 0 failed; p95 {ms} ms; cache hit 0.{hit:02d}; disk {disk}% used\n"
)


def result(service: int) -> str:
    """The check's output for ``service``: 2,048 bytes of log lines, different per service."""
    lines: list[str] = []
    size, k = 0, 0
    while size < RESULT_BYTES:
        line = _LOG_LINE.format(
            t=(service // 60) % 24,
            m=service % 60,
            s=k,
            n=service,
            k=k % 16,
            ms=100 + (service * 7 + k * 13) % 900,
            hit=(service + k) % 100,
            disk=(service * 3 + k) % 100,
        )
        lines.append(line)
        size += len(line)
        k += 1
    return "".join(lines)[:RESULT_BYTES]


def summary_text(upto: int) -> str:
    return (
        f"Summary: the fleet is being checked one service at a time; services 1 to {upto} "
        "were checked and are green (all tests passed, caches warm, disks below the limit). "
        "Next: keep checking the following services, then report."
    )


@dataclass
class Responder:
    """The model of a run of ``turns`` turns: a tool call each turn, an answer at the last.

    ``curve`` gets, at each turn's request, the turn before it and the input units billed
    so far (read from ``server.bill``, set once the server exists).
    """

    turns: int
    server: ModelServer | None = None
    answered: int = 0  # the highest turn answered
    summaries: int = 0
    curve: list[tuple[int, float, float]] = field(default_factory=list)

    def __call__(self, body: Mapping[str, Any]) -> Reply:
        messages = body.get("messages") or []
        last = messages[-1] if messages else {}
        if not body.get("tools") or _asks_summary(last):
            self.summaries += 1
            return reply(summary_text(_newest_call(messages)))
        turn = _newest_call(messages) + 1
        if self.server is not None:
            bill = _bill_so_far(self.server)
            self.curve.append((turn - 1, bill.input_units, bill.uncached_units))
        self.answered = max(self.answered, turn)
        if turn >= self.turns:
            return reply(ANSWER)
        return reply(tool_use("check_service", {"service": turn}, id=f"toolu_{turn:06d}"))


def _bill_so_far(server: ModelServer) -> Bill:
    """The server's bill, read from inside ``respond`` (which runs under the server's
    lock; ``ModelServer.bill`` may be read there)."""
    return server.bill


def _asks_summary(message: Mapping[str, Any]) -> bool:
    if message.get("role") != "user":
        return False
    content = message.get("content")
    if isinstance(content, str):
        return "summar" in content.lower()
    texts = [b.get("text", "") for b in content or [] if b.get("type") == "text"]
    return any("summar" in text.lower() for text in texts)


def _newest_call(messages: list[Mapping[str, Any]]) -> int:
    """The turn of the newest tool result in ``messages`` (0 before the first)."""
    for message in reversed(messages):
        content = message.get("content")
        if message.get("role") != "user" or not isinstance(content, list):
            continue
        for block in reversed(content):
            if block.get("type") == "tool_result":
                found = _TOOL_ID.match(str(block.get("tool_use_id", "")))
                if found:
                    return int(found.group(1))
    return 0


@dataclass
class BilledRun:
    """What one run was billed, and how it ended."""

    setting: str
    turns: int
    window: int
    failed_at: int | None  # the turn whose request the API refused; None: finished
    input_units: float
    uncached_units: float
    largest_prompt: int
    requests: int
    summaries: int
    seconds: float
    curve: list[tuple[int, float, float]]  # (turns done, billed units, uncached units)
    error: str | None = None  # an API refusal other than the window's, which ended the run
    read_fraction: float | None = None  # resume: the first resumed request's cached share

    @property
    def ratio(self) -> float:
        return self.input_units / self.uncached_units if self.uncached_units else 0.0

    @property
    def outcome(self) -> str:
        if self.failed_at is None:
            return "finished"
        why = f" ({self.error})" if self.error else ""
        return f"failed at turn {self.failed_at:,}{why}"


@contextlib.contextmanager
def billing_server(turns: int, window: int) -> Iterator[tuple[ModelServer, Responder]]:
    responder = Responder(turns)
    with ModelServer([], window=window, respond=responder) as server:
        responder.server = server
        yield server, responder


def _billed(
    setting: str,
    turns: int,
    window: int,
    server: ModelServer,
    responder: Responder,
    error: BaseException | None,
    began: float,
) -> BilledRun:
    bill = server.bill
    curve = [*responder.curve, (responder.answered, bill.input_units, bill.uncached_units)]
    return BilledRun(
        setting,
        turns,
        window,
        None if error is None else responder.answered + 1,
        bill.input_units,
        bill.uncached_units,
        bill.largest_prompt,
        bill.requests,
        responder.summaries,
        time.monotonic() - began,
        curve,
        None if error is None or too_long(error) else str(error).split(" (request_id")[0],
    )


def api_refusal(error: BaseException) -> BaseException | None:
    """The API's answer that ``error`` carries (it or what it was raised from), if any: a
    refused request ends a run as a result to record, any other error is the harness's."""
    seen: BaseException | None = error
    for _ in range(10):
        if seen is None:
            return None
        if isinstance(seen, anthropic.APIStatusError) or "prompt is too long" in str(seen):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def too_long(error: BaseException) -> bool:
    """Whether ``error`` is the API's "prompt is too long"."""
    return "prompt is too long" in str(error)


# ---------------------------------------------------------------------------- ours


@tool
async def check_service(service: int) -> str:
    """Runs the health checks of one service and returns their log.

    Args:
        service: the service's number
    """
    return result(service)


DEFAULT_COMPACTION = Compaction()


def ours_agent(
    store: FileStore,
    client: Any,
    window: int,
    *,
    cached: bool,
    tools: list[Any] | None = None,
    compaction: Compaction = DEFAULT_COMPACTION,
) -> Agent:
    """Our Agent as a user writes it: the defaults, but for caching off in the baseline
    (and, for the same context kept as LangChain's summarization, its compaction)."""
    return Agent(
        MODEL,
        store,
        tools=tools or [check_service],
        system=SYSTEM,
        client=client,
        context_window=window,
        compaction=compaction,
        prompt_cache="5m" if cached else None,
    )


def run_ours(
    setting: str,
    turns: int,
    window: int,
    folder: Path,
    *,
    cached: bool,
    compaction: Compaction = DEFAULT_COMPACTION,
) -> BilledRun:
    """Our Agent on a FileStore in ``folder``, against a fresh billing server."""
    with billing_server(turns, window) as (server, responder):
        # The Agent makes its client from the environment, on the run's own event loop,
        # and closes it there: a client made here would be closed after that loop is gone.
        agent = ours_agent(FileStore(folder), None, window, cached=cached, compaction=compaction)
        began, refused = time.monotonic(), None
        try:
            with server.in_environment():
                answer = agent.run(State(f"long-{turns}", [Message.user(FIRST_MESSAGE)]))
        except Exception as error:
            refused = api_refusal(error)
            if refused is None:
                raise
        else:
            if answer != ANSWER:
                raise AssertionError(f"{setting}: the run answered {answer!r}, not {ANSWER!r}")
        return _billed(setting, turns, window, server, responder, refused, began)


# ---------------------------------------------------------------------------- LangChain


def _langchain_agent(server: ModelServer, window: int, kind: str) -> Any:
    from langchain.agents import create_agent
    from langchain.agents.middleware import (
        ClearToolUsesEdit,
        ContextEditingMiddleware,
        SummarizationMiddleware,
    )
    from langchain_anthropic import ChatAnthropic
    from langchain_anthropic.middleware import AnthropicPromptCachingMiddleware
    from langchain_core.tools import tool as langchain_tool

    @langchain_tool
    def check_service(service: int) -> str:
        """Runs the health checks of one service and returns their log."""
        return result(service)

    # langchain-anthropic's aliases (model, max_tokens) and a plain key: what its docs show.
    model = ChatAnthropic(  # type: ignore[call-arg]
        base_url=server.url,
        api_key="x",  # type: ignore[arg-type]
        model=MODEL,
        max_retries=0,
        max_tokens=4096,
    )
    middleware: list[Any] = []
    if kind == "summarize":
        trigger = int(window * SUMMARY_TRIGGER)
        middleware.append(SummarizationMiddleware(model, trigger=("tokens", trigger)))
    if kind == "edit":
        trigger = int(window * EDIT_TRIGGER)
        middleware.append(ContextEditingMiddleware(edits=[ClearToolUsesEdit(trigger=trigger)]))
    if kind != "default":
        middleware.append(AnthropicPromptCachingMiddleware(ttl="5m"))
    return create_agent(model, tools=[check_service], system_prompt=SYSTEM, middleware=middleware)


def run_langchain(setting: str, turns: int, window: int, kind: str) -> BilledRun:
    """LangChain's ``create_agent`` with ``ChatAnthropic``; ``kind`` picks the middleware:
    ``default`` (none), ``cache``, ``summarize`` (plus caching), ``edit`` (plus caching)."""
    with billing_server(turns, window) as (server, responder):
        agent = _langchain_agent(server, window, kind)
        began, refused = time.monotonic(), None
        try:
            out = agent.invoke(
                {"messages": [{"role": "user", "content": FIRST_MESSAGE}]},
                {"recursion_limit": 4 * turns + 100},
            )
        except Exception as error:
            refused = api_refusal(error)
            if refused is None:
                raise
        else:
            answer = out["messages"][-1].text
            if answer != ANSWER:
                raise AssertionError(f"{setting}: the run answered {answer!r}, not {ANSWER!r}")
        return _billed(setting, turns, window, server, responder, refused, began)


@dataclass(frozen=True)
class Setting:
    """One way to run the conversation: a name for the tables and how to run it."""

    name: str
    side: str  # "ours" or "langchain"
    run: Callable[[int, int, Path], BilledRun]  # (turns, window, work folder)


def _ours(name: str, cached: bool, compaction: Compaction = DEFAULT_COMPACTION) -> Setting:
    return Setting(
        name,
        "ours",
        lambda turns, window, work: run_ours(
            name, turns, window, work, cached=cached, compaction=compaction
        ),
    )


def _theirs(name: str, kind: str) -> Setting:
    return Setting(
        name, "langchain", lambda turns, window, work: run_langchain(name, turns, window, kind)
    )


OURS = _ours("ours: Agent defaults (caching, compaction)", True)
OURS_UNCACHED = _ours("ours: caching off", False)
# LangChain's SummarizationMiddleware, triggered at 150k tokens of its own count (about
# 128k of the server's), keeps its last 20 messages (10 turns): ours kept to the same
# context, for the comparison at the same context kept.
OURS_SMALL = _ours(
    "ours: the context LangChain's summarization keeps (trigger 0.64, 10 turns)",
    True,
    Compaction(trigger=0.64, target=0.05, keep_results=10, keep_turns=10),
)
LANGCHAIN = _theirs("LangChain create_agent", "default")
LANGCHAIN_CACHE = _theirs("LangChain + prompt caching", "cache")
LANGCHAIN_SUMMARY = _theirs("LangChain + summarization + caching", "summarize")
LANGCHAIN_EDIT = _theirs("LangChain + context editing + caching", "edit")
SETTINGS = [
    OURS,
    OURS_SMALL,
    OURS_UNCACHED,
    LANGCHAIN,
    LANGCHAIN_CACHE,
    LANGCHAIN_SUMMARY,
    LANGCHAIN_EDIT,
]
