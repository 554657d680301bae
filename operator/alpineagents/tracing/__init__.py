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
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Awaitable, Coroutine, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar, cast

from .pacing import Throttle
from .redaction import Redactor
from .state import MODEL_STOPPED, Entry, State, ToolCall

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, Tracer

__all__ = ["CAPTURE_CONTENT_ENV", "enable", "enabled_by_environment", "trace_id_of"]

CAPTURE_CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
PROVIDER = "anthropic"
SPAN_ID_KEY = "span_id"
"""The key of the attempt's span id in a ``model_request`` entry's data."""
# Our default batch delay: a killed pod loses what waits in the batch, so send often.
_SCHEDULE_DELAY_MS = "1000"
_R = TypeVar("_R")
_log = logging.getLogger(__name__)


class _Tracing:
    """The process's tracer and what each span needs (made once, on the first traced run)."""

    def __init__(self, provider: TracerProvider, capture: bool) -> None:
        from opentelemetry import trace
        from opentelemetry.trace import Status, StatusCode

        self.provider = provider
        self.tracer: Tracer = provider.get_tracer("alpineagents")
        self.capture = capture
        self.redactor = Redactor.from_environment() if capture else None
        self.trace = trace
        self.status = Status
        self.error_code = StatusCode.ERROR

    def content(self, value: Any) -> str:
        """Text for a content attribute, secrets masked."""
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        return self.redactor.text(text) if self.redactor is not None else text


class _Attempt:
    """The span of one run attempt, current for the length of the run."""

    def __init__(self, tracing: _Tracing, span: Span, provider: str = PROVIDER) -> None:
        self.tracing = tracing
        self.span = span
        self.provider = provider
        """The ``gen_ai.provider.name`` of the run's model requests."""
        self.token: contextvars.Token[_Attempt | None] | None = None
        self.span_id = format(span.get_span_context().span_id, "016x")
        self.held: list[tuple[Span, int]] = []
        """Spans of calls the run's stop cut short, with their end times: sent only if
        the stop is saved (see :func:`end_attempt`)."""
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


_lock = threading.Lock()
_tracing: _Tracing | None = None
_attempt: contextvars.ContextVar[_Attempt | None] = contextvars.ContextVar(
    "alpineagents_trace_attempt", default=None
)
# Ids the next span takes (a trace id for an attempt, a span id for a rebuilt one).
_chosen: contextvars.ContextVar[tuple[int, int]] = contextvars.ContextVar(
    "alpineagents_trace_ids", default=(0, 0)
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
        _tracing = _made(exporter, processor)
        return _tracing.provider


def _made(exporter: SpanExporter | None, processor: SpanProcessor | None) -> _Tracing:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    resource = Resource.create(
        {"service.name": os.environ.get("OTEL_SERVICE_NAME") or "alpineagents"}
    )
    provider = TracerProvider(resource=resource, id_generator=_id_generator())
    provider.add_span_processor(processor or _batch(exporter or _exporter_from_environment()))
    capture = os.environ.get(CAPTURE_CONTENT_ENV, "").strip().lower() == "true"
    return _Tracing(provider, capture)


def _current() -> _Tracing | None:
    """The process's tracing: made from the ``OTEL_*`` variables on the first run that
    finds them asking for it (once, however many runs start at the same time)."""
    global _tracing
    tracing = _tracing
    if tracing is not None or not enabled_by_environment():
        return tracing
    with _lock:
        if _tracing is None:
            _tracing = _made(None, None)
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


def trace_id_of(state_id: str) -> int:
    """The trace id of every attempt of the State ``state_id`` (128 bits of its hash)."""
    return int.from_bytes(hashlib.sha256(state_id.encode()).digest()[:16], "big") or 1


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
    chosen = _chosen.set((trace_id_of(state.id), 0))
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
        _chosen.reset(chosen)
    if state.parent_id is not None:
        span.set_attribute("alpineagents.state.parent_id", state.parent_id)
    if state.loaded_entries:
        try:
            _resumed(tracing, state, span, provider)
        except Exception:  # a history it cannot read: the run goes on, untraced in part
            _log.warning("tracing: could not mark the resume of %s", state.id, exc_info=True)
    attempt = _Attempt(tracing, span, provider)
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


def _end(attempt: _Attempt, state: State) -> None:
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
    return _traced_chat(attempt, request, reply)


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
    return _traced_tool(attempt, call, work)


# ---------------------------------------------------------------------- spans
async def _traced_chat(
    attempt: _Attempt, request: dict[str, Any], reply: Awaitable[dict[str, Any]]
) -> dict[str, Any]:
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
        read = _count(usage, "cache_read_input_tokens")
        written = _count(usage, "cache_creation_input_tokens")
        span.set_attributes(
            {
                "gen_ai.response.model": str(answer.get("model", model)),
                "gen_ai.usage.input_tokens": _count(usage, "input_tokens") + read + written,
                "gen_ai.usage.output_tokens": _count(usage, "output_tokens"),
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


async def _traced_tool(attempt: _Attempt, call: ToolCall, work: Coroutine[Any, Any, _R]) -> _R:
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


def _resumed(tracing: _Tracing, state: State, span: Span, provider: str) -> None:
    """Mark a resumed attempt, and rebuild the attempt that was lost (its pod is gone)."""
    closing = state.history[state.loaded_entries :]
    aborted = [e for e in closing if e.kind == "tool_result" and e.outcome == "aborted"]
    left = _left_aborted(state)
    span.add_event(
        "resume",
        {
            "alpineagents.loaded_entries": state.loaded_entries,
            "alpineagents.aborted_calls": [str(e.data.get("call_id", "")) for e in left],
            "alpineagents.aborted_tools": [str(e.data.get("name", "")) for e in left],
        },
    )
    lost = _lost_attempt(state)
    if lost is None:
        return
    span_id, model, started = lost
    ended = state.history[state.loaded_entries - 1].time
    chosen = _chosen.set((trace_id_of(state.id), span_id))
    try:
        rebuilt = tracing.tracer.start_span(
            f"invoke_agent {model}",
            context=tracing.trace.set_span_in_context(tracing.trace.INVALID_SPAN),
            attributes={
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.provider.name": provider,
                "gen_ai.system": provider,
                "gen_ai.request.model": model,
                "gen_ai.conversation.id": state.id,
                "alpineagents.state.id": state.id,
                "alpineagents.stop_reason": "lost",
            },
            start_time=_nanos(started),
        )
    finally:
        _chosen.reset(chosen)
    rebuilt.set_status(
        tracing.status(tracing.error_code, "the process running this attempt was lost")
    )
    context = tracing.trace.set_span_in_context(rebuilt)
    for entry in aborted:
        asked = _asked_at(state, str(entry.data.get("call_id", "")))
        name = str(entry.data.get("name", ""))
        tool_span = tracing.tracer.start_span(
            f"execute_tool {name}",
            context=context,
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": name,
                "gen_ai.tool.call.id": str(entry.data.get("call_id", "")),
                "gen_ai.tool.type": "function",
                "alpineagents.tool.outcome": "aborted",
            },
            start_time=_nanos(asked or ended),
        )
        tool_span.set_status(tracing.status(tracing.error_code, "aborted"))
        tool_span.end(end_time=_nanos(max(ended, asked or ended)))
    if any(_closing(e) and e.kind == "model_error" for e in closing):
        # Lost while the model was asked (its request is the last saved entry): that
        # call's span never ended either. When the process died is unknown: it ends there.
        chat = tracing.tracer.start_span(
            f"chat {model}",
            context=context,
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": provider,
                "gen_ai.system": provider,
                "gen_ai.request.model": model,
                "error.type": "lost",
            },
            start_time=_nanos(ended),
        )
        chat.set_status(tracing.status(tracing.error_code, "lost while waiting for the model"))
        chat.end(end_time=_nanos(ended))
    rebuilt.end(end_time=_nanos(ended))


def _left_aborted(state: State) -> list[Entry]:
    """The calls the attempt before left ``aborted``: closed by it as it stopped (a
    signal: saved with its ``stop``) or by this load (it was killed). Either way they are
    the aborted results since the last model request: nothing asked the model since."""
    found: list[Entry] = []
    for entry in reversed(state.history):
        if entry.kind == "model_request":
            break
        if entry.kind == "tool_result" and entry.outcome == "aborted":
            found.append(entry)
    return found[::-1]


def _lost_attempt(state: State) -> tuple[int, str, datetime] | None:
    """The span id, model and first saved time of the attempt that saved last, if its
    ``model_request`` entries name it."""
    span_id: str | None = None
    model = ""
    started: datetime | None = None
    for entry in reversed(state.history[: state.loaded_entries]):
        if entry.kind == "stop" or _closing(entry):
            # An attempt that ended sent its own span; one lost before was rebuilt already
            # (these are the entries its load closed the turn with).
            break
        if entry.kind != "model_request" or not entry.data.get(SPAN_ID_KEY):
            continue
        if span_id is not None and entry.data[SPAN_ID_KEY] != span_id:
            break
        span_id = str(entry.data[SPAN_ID_KEY])
        model = str(entry.data.get("model", ""))
        started = entry.time
    if span_id is None or started is None:
        return None
    try:
        return int(span_id, 16), model, started
    except ValueError:
        return None


def _closing(entry: Entry) -> bool:
    """Whether ``entry`` closed a turn that a lost process left open (see
    ``State.close_open_turn``)."""
    if entry.kind == "tool_result":
        return entry.outcome == "aborted"
    return entry.kind == "model_error" and entry.text == MODEL_STOPPED


def _asked_at(state: State, call_id: str) -> datetime | None:
    """When the model asked for call ``call_id`` (its ``model_reply``), if saved."""
    for entry in reversed(state.history[: state.loaded_entries]):
        if entry.kind == "model_reply" and _asks(entry, call_id):
            return entry.time
    return None


def _asks(entry: Entry, call_id: str) -> bool:
    message = entry.data.get("message") or {}
    content = message.get("content") if isinstance(message, dict) else None
    return isinstance(content, list) and any(
        isinstance(block, dict) and block.get("id") == call_id for block in content
    )


def _nanos(time: datetime) -> int:
    return int(time.timestamp() * 1_000_000_000)


def _count(usage: dict[str, Any], key: str) -> int:
    value = usage.get(key)
    return value if isinstance(value, int) else 0


# ---------------------------------------------------------------------- SDK setup
def _id_generator() -> Any:
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class _StateIds(RandomIdGenerator):
        """Random ids, except those a span of a run must have (see ``_chosen``)."""

        def generate_trace_id(self) -> int:
            return _chosen.get()[0] or super().generate_trace_id()

        def generate_span_id(self) -> int:
            return _chosen.get()[1] or super().generate_span_id()

    return _StateIds()


def _exporter_from_environment() -> SpanExporter:
    name = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() or "otlp"
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if name != "otlp":
        raise ValueError(
            f"OTEL_TRACES_EXPORTER={name!r} is not supported by alpineagents: use 'otlp' "
            f"(OTLP/HTTP), 'console' or 'none'"
        )
    protocol = (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    if protocol != "http/protobuf":
        # Said at the start, not found out by a collector that never gets a span.
        raise ValueError(
            f"OTLP protocol {protocol!r} is not supported by alpineagents: it sends OTLP over "
            f"HTTP (http/protobuf); set OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf and point "
            f"the endpoint at the collector's OTLP/HTTP port (4318 by default)"
        )
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as error:
        raise ImportError(
            "tracing is configured (OTEL_* variables) but the OTLP exporter is not "
            "installed: pip install 'alpineagents[otel]'"
        ) from error
    return OTLPSpanExporter()


def _batch(exporter: SpanExporter) -> SpanProcessor:
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    delay = os.environ.get("OTEL_BSP_SCHEDULE_DELAY") or _SCHEDULE_DELAY_MS
    return BatchSpanProcessor(exporter, schedule_delay_millis=float(delay))
