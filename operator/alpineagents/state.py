"""A State is a conversation plus its append-only history.

The history is an event log. Everything else on a State (``messages``, ``answer``,
pending tool calls, ``stopped``) is derived from it by ``State._replay``, the one
function that applies an entry, whether the entry was just made by a live run or was
read back from a store. That is why a State loaded twice from the same save is the
same State.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, NamedTuple, Protocol, cast, get_args

from . import collection
from .errors import StateFormatError
from .messages import Message, excerpt
from .usage import USAGE_KEYS
from .usage import prompt_tokens as _prompt_tokens

FORMAT_VERSION = 5
READABLE_FORMATS = (4, 5)
SEALED = "sealed"
"""The field holding the ciphertext of an entry or info saved through an EncryptedStore
(:mod:`alpineagents.store.encrypted`); a State whose info has it is read through one."""

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


class State:
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
        self.id = check_id(id)
        self.parent_id = parent_id
        self.forked_from: ForkPoint | None = None
        """The State and entry this one was forked from (``alpineagents.fork``), or None."""
        self.history: list[Entry] = []
        self.messages: list[Message] = []
        self.stopped: StopReason | None = None
        self.turns = 0
        self.usage: dict[str, int] = dict.fromkeys(USAGE_KEYS, 0)
        self.cost_usd = 0.0
        """The estimated cost of every reply so far (each reply's is saved with it)."""
        self.prompt_tokens = 0
        """The size in tokens of the last request the model answered (its whole prompt)."""
        self.tokens_per_char = 0.0
        """Tokens per character of request JSON, as the last reply measured it (0: not yet)."""
        self.context_edits = 0
        """How many ``cleared`` and ``compaction`` entries changed ``messages`` in place."""
        self.tool_lists: dict[str, ToolList] = {}
        """What each toolset (an MCP server) listed, from the history's ``tools`` entries."""
        self.loaded_entries = 0
        """How many entries of ``history`` came from the record it was loaded from (the
        entries after them were added since: first those closing a turn a stopped
        process left open, then the run's)."""
        self.active_run: ActiveRun | None = None
        """The Agent's hold on this State while it runs; ``None`` between runs."""
        self.save_cursor: SaveCursor | None = None
        """The saving store's bookkeeping; ``None`` until a store saved or loaded it."""
        # Derived bookkeeping of the open turn.
        self._calls: dict[str, ToolCall] = {}
        self._results: dict[str, Entry] = {}
        self._asked: set[str] = set()
        self._answered: dict[str, bool] = {}
        # Calls a person answered whose runs mark when they take them (``started``
        # entries), and the calls they took: an answered call not taken never ran.
        self._marked: set[str] = set()
        self._started: set[str] = set()
        self._request_open = False
        self._request_chars = 0
        self._result_seqs: dict[str, int] = {}
        self._cleared_through = -1
        self._uncleared = 0  # the first message that may hold a result not cleared yet
        self._waiting: list[tuple[int, Message]] = []
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
    def answer(self) -> str | None:
        """The model's final reply, or ``None`` while the run has more to do."""
        if self.messages and self.messages[-1].role == "assistant":
            last = self.messages[-1]
            if not last.tool_uses:
                return last.text
        return None

    @property
    def pending_calls(self) -> list[ToolCall]:
        """Tool calls of the open turn that have no result yet, in the model's order."""
        return [c for c in self._calls.values() if c.id not in self._results]

    @property
    def awaiting_approval(self) -> list[ToolCall]:
        """Calls a person was asked about and has not answered."""
        return [c for c in self.pending_calls if c.id in self._asked and c.id not in self._answered]

    @property
    def waiting(self) -> list[Message]:
        """Messages sent while a turn was open, that join ``messages`` when it closes."""
        return [m for _, m in self._waiting]

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

    def approval(self, call_id: str) -> bool | None:
        return self._answered.get(call_id)

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
            call = self._calls.get(call_id)
            if call is None or call_id in self._results:
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

    def _never_started(self, call_id: str) -> bool:
        """True for a call that certainly did not run: waiting for a person, or answered
        by one and not taken by a run since. Histories from before ``started`` entries
        say nothing of this, so their answered calls may have run."""
        if call_id not in self._asked:
            return False
        return call_id not in self._answered or (
            call_id in self._marked and call_id not in self._started
        )

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

    def _replay(self, entry: Entry) -> None:
        """Apply one entry to the derived views. The only place that derives them."""
        kind, data = entry.kind, entry.data
        if kind != "stop":
            self.stopped = None
        if kind == "message":
            self.messages.append(Message.from_dict(data["message"]))
        elif kind == "waiting":
            self._waiting.append((entry.seq, Message.from_dict(data["message"])))
        elif kind == "joined":
            for index, (seq, message) in enumerate(self._waiting):
                if seq == data["waiting_seq"]:
                    del self._waiting[index]
                    self.messages.append(message)
                    break
        elif kind == "model_request":
            self._request_open = True
            self._request_chars = int(data.get("prompt_chars", 0))
        elif kind == "model_error":
            self._request_open = False
        elif kind == "model_reply":
            self._request_open = False
            self.turns += 1
            usage = data.get("usage", {})
            for key in USAGE_KEYS:
                self.usage[key] += int(usage.get(key, 0))
            self.cost_usd += float(data.get("cost_usd", 0.0))
            self.prompt_tokens = _prompt_tokens(usage)
            if self._request_chars and self.prompt_tokens:
                self.tokens_per_char = self.prompt_tokens / self._request_chars
            reply = Message.from_dict(data["message"])
            self.messages.append(reply)
            self._calls = {
                b["id"]: ToolCall(b["id"], b["name"], dict(b.get("input") or {}))
                for b in reply.tool_uses
            }
            self._results, self._asked, self._answered = {}, set(), {}
            self._marked, self._started = set(), set()
        elif kind == "approval_request":
            self._asked.add(data["call_id"])
        elif kind == "permission":
            if data.get("by") == "person":
                self._answered[data["call_id"]] = bool(data["allow"])
                if data.get("marks_start"):
                    self._marked.add(data["call_id"])
        elif kind == "started":
            self._started.add(data["call_id"])
        elif kind == "tool_result":
            self._results[data["call_id"]] = entry
            self._result_seqs[data["call_id"]] = entry.seq
            if self._calls and all(call_id in self._results for call_id in self._calls):
                self.messages.append(Message.user(self._result_blocks()))
                self._calls = {}
        elif kind == "compaction":
            summary = Message.user(f"Summary of the earlier conversation:\n{data['summary']}")
            # The summary's own request counts, like a reply's (older entries have none).
            for key, value in data.get("usage", {}).items():
                if key in self.usage:
                    self.usage[key] += int(value)
            self.cost_usd += float(data.get("cost_usd", 0.0))
            replaced = int(data["replaced"])
            self.messages[:replaced] = [summary]
            self._uncleared = max(1, self._uncleared - replaced + 1)
            self.context_edits += 1
        elif kind == "cleared":
            self._clear_results(int(data["through_seq"]))
            # Results too large for the window, cut in the requests (older readers, which
            # know no "cut", send them whole: the history is the same either way).
            for seq, keep in data.get("cut", ()):
                self._cut_result(int(seq), int(keep))
            self.context_edits += 1
        elif kind == "stop":
            self.stopped = cast(StopReason, str(data["reason"]))
        elif kind == "tools":
            listed = list(data["tools"])
            known = self.tool_lists.get(data["source"])
            self.tool_lists[data["source"]] = ToolList(known.started if known else listed, listed)

    def _clear_results(self, through_seq: int) -> None:
        """Put placeholders for the results saved at or before ``through_seq`` in
        ``messages`` (the history keeps them whole)."""
        seqs = self._result_seqs
        for index in range(self._uncleared, len(self.messages)):
            message = self.messages[index]
            if message.role == "user" and not isinstance(message.content, str):
                blocks, newer = [], False
                for block in message.content:
                    seq = seqs.get(block.get("tool_use_id", ""))
                    if block.get("type") == "tool_result" and seq is not None:
                        if seq > through_seq:
                            newer = True
                        else:
                            block = {**block, "content": cleared_text(seq)}
                    blocks.append(block)
                if blocks != message.content:
                    self.messages[index] = Message.user(blocks)
                if newer:
                    return  # the results from here on are newer
            self._uncleared = index + 1

    def _cut_result(self, seq: int, keep: int) -> None:
        """Put :func:`cut_text` for the result saved at ``seq`` in ``messages``."""
        seqs = self._result_seqs
        for index in range(self._uncleared, len(self.messages)):
            message = self.messages[index]
            if message.role != "user" or isinstance(message.content, str):
                continue
            blocks = [
                {**block, "content": cut_text(block.get("content", ""), keep, seq)}
                if block.get("type") == "tool_result"
                and seqs.get(block.get("tool_use_id", "")) == seq
                else block
                for block in message.content
            ]
            if blocks != message.content:
                self.messages[index] = Message.user(blocks)
                return

    def clearable_results(self) -> list[tuple[int, int]]:
        """The results in ``messages`` not cleared yet, oldest first: (seq, characters)."""
        seqs, found = self._result_seqs, []
        for message in self.messages[self._uncleared :]:
            if message.role != "user" or isinstance(message.content, str):
                continue
            for block in message.content:
                seq = seqs.get(block.get("tool_use_id", ""))
                if block.get("type") == "tool_result" and seq is not None:
                    content = block.get("content", "")
                    if content != cleared_text(seq):
                        found.append((seq, len(json.dumps(content))))
        return found

    def _result_blocks(self) -> list[dict[str, Any]]:
        blocks = []
        for call_id in self._calls:
            result = self._results[call_id].data
            block: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": call_id,
                "content": result["content"],
            }
            if result["outcome"] != "ok":
                block["is_error"] = True
            blocks.append(block)
        return blocks

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
