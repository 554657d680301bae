"""A run's timeline rows as the page gets them: :class:`Row` (its wire form, a list in
the order of :data:`ROW_COLUMNS`), :class:`Summary` (the run at a glance),
:class:`AwaitingCall`, and a text cut to one line of a row. :mod:`.timeline` builds them
from the history (and re-exports these names)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from json.encoder import encode_basestring
from typing import Any, Literal

from alpineagents.usage import USAGE_KEYS

__all__ = [
    "JSON",
    "PLOT_POINTS",
    "ROW_COLUMNS",
    "TEXT_LIMIT",
    "WAITING_FOR_RESUME",
    "AwaitingCall",
    "Row",
    "RowKind",
    "Summary",
    "brief",
    "millis",
    "one_line",
]

RowKind = Literal["message", "model", "call", "sent", "compaction", "stop", "attempt", "note"]
TEXT_LIMIT = 300  # characters of a row's one-line text; the whole entry opens on demand
PLOT_POINTS = 240  # points of the token plot sent to the page, however long the run
ROW_COLUMNS = (
    "order",
    "id",
    "kind",
    "seqs",
    "title",
    "text",
    "status",
    "start",
    "end",
    "turn",
    "attempt",
    "tokens",
    "call_id",
    "lost",
)
"""The fields of a row on the wire, in the order of :meth:`Row.as_list`."""

JSON = dict[str, Any]
WAITING_FOR_RESUME = "waiting_for_resume"
"""A run stopped for approval whose calls a person answered: it goes on when run again."""


@dataclass
class Row:
    """One line of the timeline. ``seqs`` are the history entries it shows."""

    id: str
    kind: RowKind
    order: int
    seqs: list[int]
    title: str
    text: str
    status: str = ""
    start: str | None = None
    end: str | None = None
    turn: int | None = None
    attempt: int = 1
    tokens: dict[str, int] | None = None
    call_id: str | None = None
    lost: bool = False
    """Ended with a lost process: ``end`` is the lost process's last save (the closing
    entries carry its time), a lower bound: the call ran at least until then."""

    @property
    def seq(self) -> int | None:
        """The entry the row's ``#`` names: a call's latest (its result, once it has
        one), any other row's first."""
        if not self.seqs:
            return None
        return self.seqs[-1] if self.kind == "call" else self.seqs[0]

    def as_list(self) -> list[Any]:
        """The row as the page gets it: its fields in :data:`ROW_COLUMNS` order, ``start``
        and ``end`` as epoch milliseconds, ``tokens`` as ``[input, output]``."""
        return [
            self.order,
            self.id,
            self.kind,
            self.seqs,
            self.title,
            self.text,
            self.status,
            millis(self.start),
            millis(self.end),
            self.turn,
            self.attempt,
            [self.tokens["input_tokens"], self.tokens["output_tokens"]] if self.tokens else None,
            self.call_id,
            self.lost,
        ]

    def to_json(self) -> JSON:
        """The row as a dict (for programs; the page gets :meth:`as_list`)."""
        return {
            "id": self.id,
            "kind": self.kind,
            "order": self.order,
            "seq": self.seq,
            "seqs": list(self.seqs),
            "title": self.title,
            "text": self.text,
            "status": self.status,
            "start": self.start,
            "end": self.end,
            "turn": self.turn,
            "attempt": self.attempt,
            "tokens": self.tokens,
            "call_id": self.call_id,
            "lost": self.lost,
        }


@dataclass(frozen=True)
class AwaitingCall:
    """A tool call waiting for a person's answer: what a person needs to decide."""

    call_id: str
    name: str
    input: Mapping[str, Any]
    seq: int

    def to_json(self) -> JSON:
        return {
            "call_id": self.call_id,
            "name": self.name,
            "input": dict(self.input),
            "seq": self.seq,
        }


@dataclass
class Summary:
    """The run at a glance, as far as its history tells."""

    entries: int = 0
    turns: int = 0
    usage: dict[str, int] = field(default_factory=lambda: dict.fromkeys(USAGE_KEYS, 0))
    cost_usd: float = 0.0
    stopped: str | None = None
    """The last ``stop`` entry's reason while nothing came after it, else None (open);
    :data:`WAITING_FOR_RESUME` once a person answered every call it waited on."""
    attempts: int = 1
    aborted_calls: int = 0
    answer: str | None = None
    awaiting: list[AwaitingCall] = field(default_factory=list)
    updated_at: str | None = None
    rows: int = 0
    """How many rows the timeline has (the page asks for the ones it shows)."""
    usage_over_time: list[tuple[int, int, int, int]] = field(default_factory=list)
    """``(epoch ms, input tokens so far (cached or not), output tokens so far, input tokens
    read from the cache so far)``: at the first model request, then at each reply."""

    def to_json(self) -> JSON:
        return {
            "entries": self.entries,
            "turns": self.turns,
            "usage": dict(self.usage),
            "cost_usd": round(self.cost_usd, 6),
            "stopped": self.stopped,
            "attempts": self.attempts,
            "aborted_calls": self.aborted_calls,
            "answer": self.answer,
            "awaiting": [call.to_json() for call in self.awaiting],
            "updated_at": self.updated_at,
            "rows": self.rows,
            "usage_over_time": _thinned(self.usage_over_time, PLOT_POINTS),
        }


def one_line(text: str) -> str:
    """``text`` on one line, cut at :data:`TEXT_LIMIT` characters (a row shows no more)."""
    # Only the start of a long text can show: split no more of it than that.
    line = " ".join(text[: TEXT_LIMIT * 4].split())
    if len(line) <= TEXT_LIMIT and len(text) <= TEXT_LIMIT * 4:
        return line
    return line[: TEXT_LIMIT - 1] + "…"


def brief(value: Any) -> str:
    """A tool call's input on one line, as compact JSON cut at :data:`TEXT_LIMIT`.

    Written out only as far as it shows, so a call with a large input (a file's whole
    text) costs no more than a small one; no ``json.dumps`` a call.
    """
    parts: list[str] = []
    _write_brief(value, parts, [0])
    return one_line("".join(parts))


def _write_brief(value: Any, parts: list[str], used: list[int]) -> None:
    if used[0] > TEXT_LIMIT:
        return
    if isinstance(value, str):
        piece = encode_basestring(value[: TEXT_LIMIT + 1])
    elif isinstance(value, Mapping):
        parts.append("{")
        used[0] += 1
        for index, (key, item) in enumerate(value.items()):
            if used[0] > TEXT_LIMIT:
                break
            key_text = (", " if index else "") + encode_basestring(str(key)) + ": "
            parts.append(key_text)
            used[0] += len(key_text)
            _write_brief(item, parts, used)
        piece = "}"
    elif isinstance(value, list | tuple):
        parts.append("[")
        used[0] += 1
        for index, item in enumerate(value):
            if used[0] > TEXT_LIMIT:
                break
            if index:
                parts.append(", ")
            _write_brief(item, parts, used)
        piece = "]"
    elif value is None or isinstance(value, bool):
        piece = {None: "null", True: "true", False: "false"}[value]
    else:
        piece = str(value)
    parts.append(piece)
    used[0] += len(piece)


def millis(time: str | None) -> int | None:
    """An entry's ISO time as epoch milliseconds (what the page computes with)."""
    if not time:
        return None
    try:
        moment = datetime.fromisoformat(time)
    except ValueError:
        return None
    return round(moment.timestamp() * 1000)


def _thinned(points: list[tuple[int, int, int, int]], most: int) -> list[tuple[int, int, int, int]]:
    """At most ``most`` of ``points``, evenly spread, the last always kept."""
    if len(points) <= most:
        return list(points)
    step = -(-len(points) // (most - 1))
    kept = points[::step]
    return kept if kept[-1] == points[-1] else [*kept, points[-1]]
