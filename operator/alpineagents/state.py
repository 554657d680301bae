"""A State is a conversation plus its append-only history.

The history is an event log. Everything else on a State (``messages``, ``answer``,
pending tool calls, ``stopped``) is derived from it by ``State._replay``, the one
function that applies an entry, whether the entry was just made by a live run or was
read back from a store. That is why a State loaded twice from the same save is the
same State. The replay and the views it keeps are :mod:`alpineagents.replay`; what an
entry is, :mod:`alpineagents.history`; both are re-exported here.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import unicodedata
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, NamedTuple, Protocol

from . import collection
from .errors import StateFormatError
from .history import (
    MODEL_STOPPED,
    UNKNOWN_RESULT,
    Entry,
    EntryKind,
    Outcome,
    StopReason,
    ToolCall,
    ToolList,
    aborted_text,
    cleared_text,
    cut_text,
    error_text,
)
from .messages import Message, excerpt
from .replay import HistoryViews

__all__ = [
    "FORMAT_VERSION",
    "MODEL_STOPPED",
    "READABLE_FORMATS",
    "SEALED",
    "UNKNOWN_RESULT",
    "ActiveRun",
    "Entry",
    "EntryKind",
    "ForkPoint",
    "Outcome",
    "Record",
    "SaveCursor",
    "State",
    "StopReason",
    "ToolCall",
    "ToolList",
    "aborted_text",
    "check_format",
    "check_id",
    "cleared_text",
    "cut_text",
    "error_text",
]

FORMAT_VERSION = 5
READABLE_FORMATS = (4, 5)
SEALED = "sealed"
"""The field holding the ciphertext of an entry or info saved through an EncryptedStore
(:mod:`alpineagents.store.encrypted`); a State whose info has it is read through one."""


def check_id(state_id: object) -> str:
    """``state_id`` if stores can keep it, else ``ValueError`` saying what is wrong.

    The one place that knows the rule: a State id is non-empty text that is valid UTF-8,
    without control characters (NUL, line breaks). Dots and slashes are fine: stores
    encode ids, so none can leave its folder or prefix.
    """
    if not isinstance(state_id, str) or not state_id:
        raise ValueError("a State needs a non-empty string id")
    try:
        state_id.encode("utf-8")
    except UnicodeEncodeError:
        problem = "is not valid UTF-8 text"
    else:
        if not any(unicodedata.category(c) == "Cc" for c in state_id):
            return state_id
        problem = "has a control character (NUL, a line break, ...)"
    raise ValueError(
        f"State id {state_id!r} {problem}: use printable text, such as letters, digits, "
        f"'-', '_' and '.'"
    )


class ForkPoint(NamedTuple):
    """Where a forked State came from: the source State's id and its last entry copied."""

    id: str
    entry: int


class Record(NamedTuple):
    """A State as a store holds it: its entries (as dicts) and its info."""

    entries: list[dict[str, Any]]
    info: dict[str, Any]


class ActiveRun(Protocol):
    """What a State needs of the Agent running it (``State.active_run``, set by the Agent
    for the length of one run; the Agent keeps the rest of its run there too)."""

    def message_sent(self, seq: int, *, waits: bool) -> concurrent.futures.Future[None]:
        """A message is being sent to the running State as entry ``seq`` (from any thread,
        with the State's lock held): save it soon. The future is done once it is saved (or
        holds the save's error). ``waits``: the sender blocks on it, so this raises
        ``RuntimeError`` on the run's own event loop, which must do the save."""


class SaveCursor(Protocol):
    """What a State needs of the store that saves it (``State.save_cursor``, set by that
    store after each save; the store keeps the rest of its bookkeeping there too)."""

    @property
    def entries(self) -> int:
        """How many entries of the history the store has."""
        ...


class State(HistoryViews):
    """A conversation and its history, saved to a store as it runs.

    ``State(id, messages=[...])`` starts a new one; ``store.load(id)`` continues a saved
    one (:meth:`from_record` is how). ``history`` is append-only; the other attributes are
    derived from it. The steps of a run (``Agent.think``, ``use_tools``, ...) record what
    happens with :meth:`add`, :meth:`add_result`, :meth:`join_waiting` and
    :meth:`close_open_turn`.
    """

    def __init__(
        self,
        id: str,
        messages: Iterable[Message] = (),
        *,
        parent_id: str | None = None,
    ) -> None:
        super().__init__()
        self.id = check_id(id)
        self.parent_id = parent_id
        self.forked_from: ForkPoint | None = None
        """The State and entry this one was forked from (``alpineagents.fork``), or None."""
        self.history: list[Entry] = []
        self.loaded_entries = 0
        """How many entries of ``history`` came from the record it was loaded from (the
        entries after them were added since: first those closing a turn a stopped
        process left open, then the run's)."""
        self.active_run: ActiveRun | None = None
        """The Agent's hold on this State while it runs; ``None`` between runs."""
        self.save_cursor: SaveCursor | None = None
        """The saving store's bookkeeping; ``None`` until a store saved or loaded it."""
        self._lock = threading.RLock()
        for message in messages:
            self.add("message", _message_text(message), {"message": message.to_dict()})

    @classmethod
    def from_record(cls, state_id: str, record: Record) -> State:
        """The State a store saved, ready to run on: the whole load, in one place.

        Checks the format, puts the entries in seq order (a store may hand back entries
        sent twice, or out of order), replays them, and closes a turn a stopped process
        left open with entries of its own (tool calls without a result end ``aborted``;
        the next save writes these). Raises :class:`~alpineagents.errors.StateFormatError`
        for a format this version cannot read or a history with a gap.
        """
        entries, info = record
        check_format(state_id, info)
        state = cls(state_id, parent_id=info.get("parent_id"))
        forked = info.get("forked_from")
        if isinstance(forked, dict):
            state.forked_from = ForkPoint(str(forked["id"]), int(forked["entry"]))
        history, replay, from_dict = state.history, state._replay, Entry.from_dict
        with collection.paused(long_lived=True):
            for raw in _ordered(state_id, entries):
                entry = from_dict(raw)
                history.append(entry)
                replay(entry)
        state.loaded_entries = len(state.history)
        state.close_open_turn(None)
        return state

    def to_record(self, since: int = 0) -> Record:
        """The entries from seq ``since`` on (as dicts) and the info a store saves with them,
        taken together (the State may be changing on another thread)."""
        with self._lock:
            return Record([entry.to_dict() for entry in self.history[since:]], self._info())

    # ----------------------------------------------------------------- derived views
    @property
    def first_message(self) -> str | None:
        for entry in self.history:
            if entry.kind in ("message", "waiting"):
                return Message.from_dict(entry.data["message"]).text
        return None

    @property
    def saved_entries(self) -> int:
        """How many entries of ``history`` its store has; later ones are not saved yet."""
        cursor = self.save_cursor
        return cursor.entries if cursor is not None else 0

    # ----------------------------------------------------------------- sending
    def send(self, message: Message | str) -> Entry:
        """Send a message to this State, also while it runs (from any thread).

        While a run is live, the message is saved as ``waiting`` and ``send`` returns once
        that save is done, so a process killed after ``send`` returned still has it. It
        joins ``messages`` after the reply or the results it waits for. If the save fails,
        ``send`` raises the store's exception; the message stays in the State and the
        next save writes it. On the run's own event loop (an async tool, say) ``send``
        would wait for itself: use ``await state.asend(message)`` there.

        With no live run the message joins ``messages`` at once, unsaved: the next run's
        first save (or ``store.save(state)``) saves it.
        """
        entry, saved = self._send(message, waits=True)
        if saved is not None:
            saved.result()
        return entry

    async def asend(self, message: Message | str) -> Entry:
        """``send`` for async code: while a run is live, returns once the message is saved."""
        entry, saved = self._send(message, waits=False)
        if saved is not None:
            await asyncio.wrap_future(saved)
        return entry

    def _send(
        self, message: Message | str, *, waits: bool
    ) -> tuple[Entry, concurrent.futures.Future[None] | None]:
        if isinstance(message, str):
            message = Message.user(message)
        data = {"message": message.to_dict()}
        with self._lock:
            run = self.active_run
            if run is None:
                return self.add("message", _message_text(message), data), None
            saved = run.message_sent(len(self.history), waits=waits)
            return self.add("waiting", "waiting: " + _message_text(message), data), saved

    def approve(self, call_id: str, allow: bool, *, note: str = "") -> Entry:
        """Record a person's answer to a permission ask; the next run acts on it."""
        with self._lock:
            call = next((c for c in self.pending_calls if c.id == call_id), None)
            if call is None:
                open_ids = ", ".join(c.id for c in self.pending_calls) or "none"
                raise ValueError(
                    f"State {self.id!r} has no open tool call {call_id!r} (open calls: {open_ids})"
                )
            word = "allowed" if allow else "refused"
            # "marks_start": runs of this version add a ``started`` entry before they run
            # the call, so a load tells a call that never ran from one that may have.
            return self.add(
                "permission",
                f"a person {word} {call.name}" + (f": {note}" if note else ""),
                {
                    "call_id": call_id,
                    "allow": allow,
                    "by": "person",
                    "note": note,
                    "marks_start": True,
                },
            )

    def mark_started(self, call: ToolCall) -> Entry:
        """Record that a run takes a call a person answered, before it runs it."""
        return self.add("started", f"started: {call.name}", {"call_id": call.id})

    # ----------------------------------------------------------------- the event log
    def add(
        self,
        kind: EntryKind,
        text: str,
        data: dict[str, Any],
        error: BaseException | None = None,
        *,
        time: datetime | None = None,
    ) -> Entry:
        """Append one entry to the history and apply it (the steps of a run call this).

        ``time`` defaults to now."""
        with self._lock:
            entry = Entry(len(self.history), kind, time or datetime.now(UTC), text, data, error)
            self.history.append(entry)
            self._replay(entry)
            return entry

    def add_result(
        self,
        call: ToolCall,
        outcome: Outcome,
        content: str | list[dict[str, Any]],
        error: BaseException | None = None,
        *,
        time: datetime | None = None,
    ) -> Entry:
        """Append the result of a tool call (its content is what the model gets)."""
        text = content if isinstance(content, str) else Message.user(content).text or "[content]"
        return self.add(
            "tool_result",
            excerpt(text),
            {"call_id": call.id, "name": call.name, "outcome": outcome, "content": content},
            error,
            time=time,
        )

    def join_waiting(self, *, time: datetime | None = None) -> None:
        """Let the messages sent while a turn was open join ``messages`` (turn closed)."""
        for seq, message in list(self._waiting):
            data = {"waiting_seq": seq}
            self.add("joined", "joined: " + _message_text(message), data, time=time)

    def close_open_turn(self, reason: BaseException | None) -> None:
        """Close what a stopped run left open, with entries of its own.

        ``reason`` is the exception that ends a live run; ``None`` means the process was
        killed and we only know what was saved. Then the entries are a pure function of
        the saved ones, stamped with the time of the last, so every load of one save is
        the same State.
        """
        with self._lock:
            time = self.history[-1].time if reason is None and self.history else None
            if self._request_open:
                text = MODEL_STOPPED if reason is None else aborted_text(reason)
                self.add("model_error", text, {"error": text}, reason, time=time)
            for call in self.pending_calls:
                if self._never_started(call.id):
                    continue  # it waits for a person, or for the run a person let it have
                content = UNKNOWN_RESULT if reason is None else aborted_text(reason)
                self.add_result(call, "aborted", content, time=time)
            if not self.pending_calls:
                self.join_waiting(time=time)

    # ----------------------------------------------------------------- persistence
    def _info(self) -> dict[str, Any]:
        answer = self.answer
        info: dict[str, Any] = {
            "v": FORMAT_VERSION,
            "first_message": excerpt(self.first_message or "", 200),
            "updated_at": (
                self.history[-1].time if self.history else datetime.now(UTC)
            ).isoformat(),
            "stopped": self.stopped,
            "parent_id": self.parent_id,
            "entries": len(self.history),
            "turns": self.turns,
            "usage": dict(self.usage),
            "cost_usd": round(self.cost_usd, 6),
            "answer": excerpt(answer, 500) if answer is not None else None,
        }
        if self.forked_from is not None:
            info["forked_from"] = {"id": self.forked_from.id, "entry": self.forked_from.entry}
        return info

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, State):
            return NotImplemented
        return (self.id, self.parent_id, self.history) == (other.id, other.parent_id, other.history)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"State(id={self.id!r}, entries={len(self.history)}, stopped={self.stopped!r})"


def _message_text(message: Message) -> str:
    return f"{message.role}: {excerpt(message.text or '[content]')}"


def check_format(state_id: str, info: dict[str, Any]) -> None:
    """Refuse a State saved in a format this version cannot read (the one place that knows)."""
    if SEALED in info:
        raise StateFormatError(
            f"State {state_id!r} is encrypted: read it through an EncryptedStore (store URL "
            f"option encrypted=true) with its keys in ALPINEAGENTS_ENCRYPTION_KEYS"
        )
    version = info.get("v")
    if version not in READABLE_FORMATS:
        readable = " and ".join(str(v) for v in READABLE_FORMATS)
        raise StateFormatError(
            f"State {state_id!r} was saved in format {version!r}; this alpineagents reads "
            f"formats {readable} only, and there is no converter"
        )


def _ordered(state_id: str, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # Stores may hand back entries sent twice or out of order; seq decides.
    if all(entry["seq"] == index for index, entry in enumerate(entries)):
        return entries  # the usual case, checked without a copy
    by_seq: dict[int, dict[str, Any]] = {}
    for entry in entries:
        by_seq.setdefault(int(entry["seq"]), entry)
    ordered = [by_seq[seq] for seq in sorted(by_seq)]
    for index, entry in enumerate(ordered):
        if int(entry["seq"]) != index:
            raise StateFormatError(
                f"State {state_id!r} is damaged: its history has no entry {index} "
                f"(the store holds seqs {sorted(by_seq)[:5]}...)"
            )
    return ordered
