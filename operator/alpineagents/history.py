"""A State's history, entry by entry: what an entry is (:class:`Entry`, its kinds and
outcomes), the tool calls and tool lists entries record, and the texts of the entries the
spec writes for a turn a stopped run left open. :mod:`alpineagents.state` re-exports all of
it (import it from there)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, get_args

__all__ = [
    "MODEL_STOPPED",
    "UNKNOWN_RESULT",
    "Entry",
    "EntryKind",
    "Outcome",
    "StopReason",
    "ToolCall",
    "ToolList",
    "aborted_text",
    "cleared_text",
    "cut_text",
    "error_text",
]

EntryKind = Literal[
    "message",
    "waiting",
    "joined",
    "model_request",
    "model_reply",
    "model_error",
    "tool_result",
    "permission",
    "approval_request",
    "started",
    "compaction",
    "cleared",
    "stop",
    "tools",
]
"""What an entry records (see the README's "History entries and formats")."""
_KINDS: dict[str, EntryKind] = {kind: kind for kind in get_args(EntryKind)}  # one str each
Outcome = Literal["ok", "error", "refused", "aborted"]
"""How a tool call ended (``Entry.outcome`` of a ``tool_result``)."""
StopReason = Literal[
    "answered", "max_turns", "waiting_for_approval", "budget_exceeded", "interrupted", "error"
]
"""Why a run stopped (``State.stopped``)."""

# The closing texts of the spec: what a loaded State says about a turn a killed process left open.
UNKNOWN_RESULT = (
    "(unknown: the run stopped before this result was saved, so the tool may or may not "
    "have run. Check whether it took effect before running it again.)"
)
MODEL_STOPPED = "(process stopped while waiting for the model)"


def cleared_text(seq: int) -> str:
    """What a request carries instead of a result cleared to keep the context small."""
    return f"(cleared to keep the context small: entry {seq} of the run's history)"


def cut_text(content: Any, keep: int, seq: int) -> str:
    """What a request carries instead of a result too large for the window: its first
    ``keep`` characters of text, and where the whole of it is."""
    if isinstance(content, str):
        text = content
    else:
        text = "\n".join(
            str(block.get("text", "")) for block in content if block.get("type") == "text"
        )
    return (
        f"{text[:keep]}\n\n(cut to fit the context window: this result is {len(text):,} "
        f"characters; all of it is entry {seq} of the run's history)"
    )


def aborted_text(reason: BaseException) -> str:
    return f"(aborted: {type(reason).__name__})"


def error_text(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


@dataclass
class Entry:
    """One step of a State's history.

    ``seq`` is its position in ``history``; ``kind`` says what happened; ``text`` is a short
    human-readable line; ``data`` is the JSON payload replay works from. ``error`` is the
    live exception of a failed step, and ``None`` once the entry was loaded from a store
    (``text`` still holds the exception's type and message).
    """

    seq: int
    kind: EntryKind
    time: datetime
    text: str
    data: dict[str, Any] = field(default_factory=dict)
    error: BaseException | None = field(default=None, compare=False, repr=False)

    @property
    def outcome(self) -> Outcome | None:
        """For a ``tool_result``: ``"ok"``, ``"error"``, ``"refused"`` or ``"aborted"``."""
        value: Outcome | None = self.data.get("outcome")
        return value if self.kind == "tool_result" else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "kind": self.kind,
            "time": self.time.isoformat(),
            "text": self.text,
            "data": self.data,
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Entry:
        data = raw.get("data")
        if type(data) is not dict:  # a dict is taken as it is: to_dict hands out its own too
            data = dict(data or {})
        # A kind this version does not know is kept as it is; replay passes over it.
        name = str(raw["kind"])
        kind: Any = _KINDS.get(name, name)
        time = datetime.fromisoformat(raw["time"])
        return cls(int(raw["seq"]), kind, time, str(raw.get("text", "")), data)


@dataclass(frozen=True)
class ToolList:
    """The tools a tool source (an MCP server) listed, as a State's history recorded them.

    ``started`` are the ones the run uses: what the source listed when the run first used
    it. ``latest`` is what it listed when a run last found its list changed (the same as
    ``started`` until then). Each tool is ``{"name", "description", "input_schema"}``.
    """

    started: list[dict[str, Any]]
    latest: list[dict[str, Any]]


@dataclass
class ToolCall:
    """A tool call the model asked for, as seen by permission policies and tools."""

    id: str
    name: str
    input: dict[str, Any]
