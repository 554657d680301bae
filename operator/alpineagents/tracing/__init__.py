"""OpenTelemetry traces of runs, in the GenAI semantic conventions (off unless configured).

Tracing is on when the standard variables ask for it: ``OTEL_TRACES_EXPORTER`` (``otlp``,
``console``; ``none`` is off) or an OTLP endpoint (``OTEL_EXPORTER_OTLP_ENDPOINT``,
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``), unless ``OTEL_SDK_DISABLED=true``. Off, nothing of
OpenTelemetry is imported and each hook costs a context variable lookup. On, the official
``opentelemetry-sdk`` exports over OTLP/HTTP (the ``otel`` extra), batching as the
``OTEL_BSP_*`` variables say, with the resource of ``OTEL_SERVICE_NAME`` and
``OTEL_RESOURCE_ATTRIBUTES``.

What a run looks like:

- ``invoke_agent {model}``: one span per attempt (each ``Agent.run`` of the State, on any
  pod). Every attempt of a State lands in one trace: its id is derived from the State id,
  so a resumed pod continues the trace with nothing new saved but the attempt's span id
  (in the data of its ``model_request`` entries). A resumed attempt carries a ``resume``
  event naming the calls the attempt before left ``aborted``; a lost attempt itself (a
  killed pod exports no span that had not ended) is rebuilt from the saved history: a
  span with its saved id, ending at its last saved entry, status error, with a span for
  each aborted call. An attempt stopped by a signal (SIGTERM, Ctrl+C) ends its own span,
  status error, and sends it as its process exits, once its stop is saved. An attempt
  whose end is not saved (its last save refused: a successor's claim fenced it off, the
  store failed) sends neither its span nor those of the calls its stop cut short: the
  attempt that loads the State next finds it unended and rebuilds it, so each attempt
  is in the trace once.
- ``chat {model}``: a child span per model call (``gen_ai.*``: models, response id, the
  token counts including cache reads and writes, finish reasons).
- ``execute_tool {name}``: a child span per tool call (``gen_ai.tool.*`` and the outcome
  as ``alpineagents.tool.outcome``; errors and aborted calls have status error).

Prompt and completion text, tool arguments and results are recorded only with
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``, with every secret the
process knows masked (:class:`~alpineagents.redaction.Redactor`).

``gen_ai.usage.input_tokens`` counts the whole prompt, as the conventions define it:
the API's ``input_tokens`` plus cache reads and writes (those two also have attributes of
their own).

This module is the hooks the Agent calls and the process's switch; the SDK's setup and
the ids are :mod:`.sdk`, the live spans :mod:`.spans`, the lost attempt rebuilt
:mod:`.lost_attempts`.
"""

from __future__ import annotations

import contextvars
import logging
import os
import threading
from collections.abc import Awaitable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from ..pacing import Throttle
from ..state import State, ToolCall
from .lost_attempts import resumed
from .sdk import CAPTURE_CONTENT_ENV, Tracing, chosen_ids, made, trace_id_of
from .spans import PROVIDER, SPAN_ID_KEY, Attempt, traced_chat, traced_tool

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

__all__ = [
    "CAPTURE_CONTENT_ENV",
    "PROVIDER",
    "SPAN_ID_KEY",
    "enable",
    "enabled_by_environment",
    "trace_id_of",
]

_R = TypeVar("_R")
_log = logging.getLogger(__name__)

_lock = threading.Lock()
_tracing: Tracing | None = None
_attempt: contextvars.ContextVar[Attempt | None] = contextvars.ContextVar(
    "alpineagents_trace_attempt", default=None
)


def enabled_by_environment(env: Mapping[str, str] | None = None) -> bool:
    """Whether the ``OTEL_*`` variables (of ``env``, default ``os.environ``) ask for traces."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(
        env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def enable(
    exporter: SpanExporter | None = None, *, processor: SpanProcessor | None = None
) -> TracerProvider:
    """Trace every run of this process from now on, and return the tracer provider.

    Without arguments, as the ``OTEL_*`` variables say (what a run does on its own when
    they ask for traces). ``exporter`` sends spans elsewhere (batched), ``processor``
    takes them as it likes (tests: a ``SimpleSpanProcessor`` of an in-memory exporter).
    Runs keep their own provider, never the global one: its ids must follow the State.
    """
    global _tracing
    with _lock:
        if _tracing is not None:
            _tracing.provider.shutdown()
        _tracing = made(exporter, processor)
        return _tracing.provider


def _current() -> Tracing | None:
    """The process's tracing: made from the ``OTEL_*`` variables on the first run that
    finds them asking for it (once, however many runs start at the same time)."""
    global _tracing
    tracing = _tracing
    if tracing is not None or not enabled_by_environment():
        return tracing
    with _lock:
        if _tracing is None:
            _tracing = made(None, None)
        return _tracing


def disable() -> None:
    """Stop tracing runs (sending what is left first)."""
    global _tracing
    with _lock:
        if _tracing is not None:
            _tracing.provider.shutdown()
        _tracing = None


def flush(timeout: float) -> bool:
    """Send the spans that wait in the batch, waiting at most ``timeout`` seconds; returns
    whether they went (True when tracing is off). A process that ends at once calls this
    first: the exporter would otherwise retry an unreachable collector for its own timeout.
    """
    tracing = _tracing
    if tracing is None:
        return True
    sent: list[bool] = []
    sending = threading.Thread(
        target=lambda: sent.append(tracing.provider.force_flush()),
        name="alpineagents-trace-flush",
        daemon=True,
    )
    sending.start()
    sending.join(timeout)
    return bool(sent and sent[0])


# ---------------------------------------------------------------------- the Agent's hooks
def begin_attempt(state: State, model: str, provider: str = PROVIDER) -> None:
    """A run of ``state`` begins: open its attempt span (a no-op unless tracing is on).

    ``provider`` is the ``gen_ai.provider.name`` of the run's model requests (``aws.bedrock``,
    ``gcp.vertex_ai``, ...)."""
    tracing = _current()
    if tracing is None:
        return
    # A subagent's run (a tool call of another run) is a trace of its own, linked to the
    # call that started it; so is a run inside a span of the caller's own.
    caller = tracing.trace.get_current_span().get_span_context()
    links = [tracing.trace.Link(caller)] if caller.is_valid else None
    chosen = chosen_ids.set((trace_id_of(state.id), 0))
    try:
        span = tracing.tracer.start_span(
            f"invoke_agent {model}",
            context=tracing.trace.set_span_in_context(tracing.trace.INVALID_SPAN),
            links=links,
            attributes={
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.provider.name": provider,
                "gen_ai.system": provider,
                "gen_ai.request.model": model,
                "gen_ai.conversation.id": state.id,
                "alpineagents.state.id": state.id,
                "alpineagents.attempt.loaded_entries": state.loaded_entries,
            },
        )
    finally:
        chosen_ids.reset(chosen)
    if state.parent_id is not None:
        span.set_attribute("alpineagents.state.parent_id", state.parent_id)
    if state.loaded_entries:
        try:
            resumed(tracing, state, span, provider)
        except Exception:  # a history it cannot read: the run goes on, untraced in part
            _log.warning("tracing: could not mark the resume of %s", state.id, exc_info=True)
    attempt = Attempt(tracing, span, provider)
    attempt.token = _attempt.set(attempt)


def end_attempt(state: State) -> None:
    """The run of ``state`` ended (answered, stopped or failed): end its attempt span.

    Never raises: it runs where a run ends, which must finish whatever happens here."""
    attempt = _attempt.get()
    if attempt is None:
        return
    try:
        _end(attempt, state)
    except Exception:
        _log.warning("tracing: could not end the attempt of %s", state.id, exc_info=True)


def _end(attempt: Attempt, state: State) -> None:
    try:
        if attempt.token is None:
            raise ValueError("no token")
        _attempt.reset(attempt.token)  # a subagent's run gives its caller's back
    except ValueError:  # ended in another context than it began
        _attempt.set(None)
    attempt.end_saved = state.saved_entries >= len(state.history)
    if not attempt.end_saved:
        # Its end is not in the store: the next attempt rebuilds this one from what is.
        return
    for held, ended_at in attempt.held:
        held.end(end_time=ended_at)
    span = attempt.span
    span.set_attribute("alpineagents.stop_reason", state.stopped or "none")
    span.set_attribute("alpineagents.turns", state.turns)
    for key, value in state.usage.items():
        span.set_attribute(f"alpineagents.usage.{key}", value)
    span.set_attribute("alpineagents.cost_usd", state.cost_usd)
    if state.stopped in ("error", "interrupted"):
        # An attempt stopped by a signal (its pod deleted, drained, evicted) did not finish
        # either: an error, as the attempt of a pod killed outright is once rebuilt.
        last = state.history[-1] if state.history else None
        error = last.data.get("error") if last is not None and last.kind == "stop" else None
        span.set_status(attempt.tracing.status(attempt.tracing.error_code, str(error or "")))
    # Sent with the next batch, or when the process exits (the provider flushes then).
    span.end()


def request_context() -> dict[str, str]:
    """What a ``model_request`` entry saves of the trace: the attempt's span id (so that a
    resumed attempt can rebuild this one if its pod is lost); nothing when off."""
    attempt = _attempt.get()
    return {SPAN_ID_KEY: attempt.span_id} if attempt is not None else _NOTHING


_NOTHING: dict[str, str] = {}


def chat(request: dict[str, Any], reply: Awaitable[dict[str, Any]]) -> Awaitable[dict[str, Any]]:
    """The model call ``reply`` (awaitable) for ``request``, traced as a ``chat`` span."""
    attempt = _attempt.get()
    if attempt is None:
        return reply
    return traced_chat(attempt, request, reply)


def throttled(throttle: Throttle) -> None:
    """A wait for the key's capacity, as an event of the model call's span (off: nothing)."""
    attempt = _attempt.get()
    if attempt is not None:
        attempt.tracing.trace.get_current_span().add_event(
            "alpineagents.throttled",
            {"limit": throttle.limit, "wait_s": throttle.seconds, "refused": throttle.refused},
        )


def tool(call: ToolCall, work: Coroutine[Any, Any, _R]) -> Coroutine[Any, Any, _R]:
    """The tool call ``work`` (returning ``(call, outcome, content, error)``), traced as
    an ``execute_tool`` span."""
    attempt = _attempt.get()
    if attempt is None:
        return work
    return traced_tool(attempt, call, work)
