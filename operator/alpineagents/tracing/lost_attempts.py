"""A resumed attempt's marks in the trace, and the attempt before it rebuilt when its
process was lost (a killed pod exports no span that had not ended): from the saved
history, a span with its saved id, ending at its last saved entry, status error, with a
span for each call it left aborted (and the model call it waited on)."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from ..state import MODEL_STOPPED, Entry, State
from .sdk import Tracing, chosen_ids, trace_id_of
from .spans import SPAN_ID_KEY

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = ["resumed"]


def resumed(tracing: Tracing, state: State, span: Span, provider: str) -> None:
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
    chosen = chosen_ids.set((trace_id_of(state.id), span_id))
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
        chosen_ids.reset(chosen)
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
