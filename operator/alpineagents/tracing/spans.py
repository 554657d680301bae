"""The spans of a live attempt: :class:`Attempt` (its ``invoke_agent`` span, current for
the length of the run) and, as its children, a ``chat`` span per model call and an
``execute_tool`` span per tool call, in the GenAI conventions."""

from __future__ import annotations

import contextvars
import time
from collections.abc import Awaitable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar, cast

from ..state import ToolCall
from .sdk import Tracing

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = ["PROVIDER", "SPAN_ID_KEY", "Attempt", "count", "traced_chat", "traced_tool"]

PROVIDER = "anthropic"
SPAN_ID_KEY = "span_id"
"""The key of the attempt's span id in a ``model_request`` entry's data."""
_R = TypeVar("_R")


class Attempt:
    """The span of one run attempt, current for the length of the run."""

    def __init__(self, tracing: Tracing, span: Span, provider: str = PROVIDER) -> None:
        self.tracing = tracing
        self.span = span
        self.provider = provider
        """The ``gen_ai.provider.name`` of the run's model requests."""
        self.token: contextvars.Token[Attempt | None] | None = None
        self.span_id = format(span.get_span_context().span_id, "016x")
        self.held: list[tuple[Span, int]] = []
        """Spans of calls the run's stop cut short, with their end times: sent only if
        the stop is saved (see :func:`~alpineagents.tracing.end_attempt`)."""
        self.end_saved: bool | None = None
        """Once the attempt ended: whether its end is saved (None: not ended yet)."""

    def end(self, span: Span, error: BaseException) -> None:
        """End ``span``, a call that raised ``error``: now, or with the attempt if
        ``error`` stops the run (a signal, a cancellation: not an ``Exception``). A call
        cancelled after the attempt ended goes as the attempt went."""
        if isinstance(error, Exception) or self.end_saved:
            span.end()
        elif self.end_saved is None:
            self.held.append((span, time.time_ns()))


async def traced_chat(
    attempt: Attempt, request: dict[str, Any], reply: Awaitable[dict[str, Any]]
) -> dict[str, Any]:
    """The model call ``reply`` for ``request``, in a ``chat`` span of ``attempt``."""
    tracing = attempt.tracing
    model = str(request.get("model", ""))
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": attempt.provider,
        "gen_ai.system": attempt.provider,
        "gen_ai.request.model": model,
    }
    if isinstance(request.get("max_tokens"), int):
        attributes["gen_ai.request.max_tokens"] = request["max_tokens"]
    if tracing.capture:
        attributes["gen_ai.input.messages"] = tracing.content(request.get("messages", []))
        if request.get("system"):
            attributes["gen_ai.system_instructions"] = tracing.content(request["system"])
    context = tracing.trace.set_span_in_context(attempt.span)
    span = tracing.tracer.start_span(f"chat {model}", context=context, attributes=attributes)
    try:
        with tracing.trace.use_span(span):  # records an error, ends nothing
            answer = await reply
    except BaseException as error:
        attempt.end(span, error)
        raise
    try:
        usage = answer.get("usage") or {}
        read = count(usage, "cache_read_input_tokens")
        written = count(usage, "cache_creation_input_tokens")
        span.set_attributes(
            {
                "gen_ai.response.model": str(answer.get("model", model)),
                "gen_ai.usage.input_tokens": count(usage, "input_tokens") + read + written,
                "gen_ai.usage.output_tokens": count(usage, "output_tokens"),
                "gen_ai.usage.cache_read.input_tokens": read,
                "gen_ai.usage.cache_creation.input_tokens": written,
                "gen_ai.response.finish_reasons": [str(answer.get("stop_reason"))],
            }
        )
        if answer.get("id"):
            span.set_attribute("gen_ai.response.id", str(answer["id"]))
        if tracing.capture:
            output = [{"role": "assistant", "content": answer.get("content", [])}]
            span.set_attribute("gen_ai.output.messages", tracing.content(output))
        return answer
    finally:
        span.end()


async def traced_tool(attempt: Attempt, call: ToolCall, work: Coroutine[Any, Any, _R]) -> _R:
    """The tool call ``work``, in an ``execute_tool`` span of ``attempt``."""
    tracing = attempt.tracing
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": call.name,
        "gen_ai.tool.call.id": call.id,
        "gen_ai.tool.type": "function",
    }
    if tracing.capture:
        attributes["gen_ai.tool.call.arguments"] = tracing.content(call.input)
    context = tracing.trace.set_span_in_context(attempt.span)
    span = tracing.tracer.start_span(
        f"execute_tool {call.name}", context=context, attributes=attributes
    )
    try:
        # Not use_span's own error handling: a cancelled call is "aborted", not an error text.
        with tracing.trace.use_span(span, record_exception=False, set_status_on_exception=False):
            result = await work
    except BaseException as error:
        span.set_attribute("alpineagents.tool.outcome", "aborted")
        span.set_status(tracing.status(tracing.error_code, type(error).__name__))
        attempt.end(span, error)
        raise
    try:
        _, outcome, content, failure = cast(tuple[Any, str, Any, BaseException | None], result)
        span.set_attribute("alpineagents.tool.outcome", outcome)
        if failure is not None:
            span.set_attribute("error.type", type(failure).__qualname__)
            span.set_status(tracing.status(tracing.error_code, type(failure).__name__))
        if tracing.capture:
            span.set_attribute("gen_ai.tool.call.result", tracing.content(content))
        return result
    finally:
        span.end()


def count(usage: dict[str, Any], key: str) -> int:
    """``usage[key]`` when it is a count, else 0."""
    value = usage.get(key)
    return value if isinstance(value, int) else 0
