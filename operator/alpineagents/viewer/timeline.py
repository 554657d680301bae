"""A run's timeline: its history entries turned into rows a person reads.

:class:`Timeline` takes entries (as stores hand them back, dicts with ``seq``) a batch at
a time, in the order they were saved, and returns the rows each batch created or changed.
The page keeps rows by id and replaces a changed one, so following a live run costs only
what is new: a tool call's row is made when the model asks for the call and changed when
its result arrives. On the wire a row is a list in the order of :data:`ROW_COLUMNS`
(:meth:`Row.as_list`, times as epoch milliseconds; the row types are :mod:`.rows`,
re-exported here), and the page asks for rows a page at a time (:meth:`Timeline.page`)
as they scroll into view, so opening a run of 10,000 entries sends a screenful, not the
history.

Rows, in history order:

- ``message``: a message of the conversation (the first prompt, a follow-up).
- ``model``: one model request, from ``model_request`` to its reply or error; the reply's
  token use and, for the last reply, the final answer.
- ``call``: one tool call, from the reply that asked for it (or the person's approval) to
  its result; ``status`` is the outcome: ``ok``, ``error``, ``refused`` or ``aborted``,
  or ``running`` / ``asking`` while it has none.
- ``sent``: a message sent while the run was going (``waiting`` until it ``joined``).
- ``compaction``, ``stop`` and ``note`` (an entry kind this viewer does not know).
- ``attempt``: where one process's run ended and the next one's began. A run that stopped
  (``stop`` entry) and was run again, or a process lost without stopping (killed,
  OOM, node gone): the next process closes what it left open with entries of its own
  (an aborted call, a taken-back model request), and the boundary is drawn before them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from alpineagents import Message
from alpineagents.state import MODEL_STOPPED, UNKNOWN_RESULT
from alpineagents.usage import USAGE_KEYS, prompt_tokens

from .attempts import Attempts, is_persons_answer
from .rows import (
    JSON,
    PLOT_POINTS,
    ROW_COLUMNS,
    TEXT_LIMIT,
    WAITING_FOR_RESUME,
    AwaitingCall,
    Row,
    RowKind,
    Summary,
    brief,
    millis,
    one_line,
)

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
    "Timeline",
]

_STOP_STATUS = {
    "answered": "ok",
    "waiting_for_approval": "asking",
    "max_turns": "error",
    "interrupted": "aborted",
    "error": "error",
}


class Timeline:
    """Rows and a summary of one run, built up from its entries as they are saved."""

    def __init__(self) -> None:
        self.rows: list[Row] = []
        self.summary = Summary()
        self.next_seq = 0
        self._model: Row | None = None
        self._calls: dict[str, Row] = {}
        self._inputs: dict[str, Mapping[str, Any]] = {}
        self._shown_inputs: dict[str, str] = {}  # each call's input as its row shows it
        self._sent: dict[int, Row] = {}
        self._attempts = Attempts()  # where a new process's run begins
        self._lost_attempt: Row | None = None  # its row, until the new process's first entry
        self._last_time: str | None = None
        self._now: str | None = None  # the time of the entry being applied

    def add(self, entries: Iterable[Mapping[str, Any]]) -> list[Row]:
        """Take the next entries; return the rows they created or changed, in order.

        Entries this timeline already has (a store may hand some back twice) are skipped.
        """
        changed: dict[str, Row] = {}
        for raw in sorted(entries, key=lambda e: int(e["seq"])):
            seq = int(raw["seq"])
            if seq != self.next_seq:
                if seq < self.next_seq:
                    continue
                raise ValueError(
                    f"history entry {self.next_seq} is missing (the next one given is {seq})"
                )
            for row in self._apply(seq, raw):
                changed[row.id] = row
            self.next_seq = seq + 1
            self.summary.entries = self.next_seq
            self.summary.updated_at = self._last_time
        self.summary.rows = len(self.rows)
        return sorted(changed.values(), key=lambda row: row.order)

    def page(self, start: int, end: int) -> list[Row]:
        """Rows ``start`` to ``end`` (positions, end excluded), widened to whole turns.

        A turn's bars are drawn in the window of all its rows, so a page never holds only
        part of a turn.
        """
        rows = self.rows
        start, end = max(0, start), min(len(rows), end)
        if start >= end:
            return []
        while (
            start > 0 and rows[start].turn is not None and rows[start - 1].turn == rows[start].turn
        ):
            start -= 1
        while (
            end < len(rows) and rows[end].turn is not None and rows[end].turn == rows[end - 1].turn
        ):
            end += 1
        return rows[start:end]

    # ------------------------------------------------------------------ one entry
    def _apply(self, seq: int, raw: Mapping[str, Any]) -> list[Row]:
        kind = str(raw.get("kind", ""))
        text = str(raw.get("text", ""))
        data: Mapping[str, Any] = raw.get("data") or {}
        time = str(raw.get("time")) if raw.get("time") else None
        self._now = time
        touched: list[Row] = []
        boundary = self._boundary(seq, kind, text, data, time)
        if boundary is not None:
            touched.append(boundary)
        # A person's answer to a stopped run is no step of a run: it stays stopped until
        # a process takes it up again (then the answered calls run).
        answered = is_persons_answer(kind, data) and self._attempts.stopped_by is not None
        if kind != "stop" and not answered:
            self.summary.stopped = None
        self._last_time = time or self._last_time
        touched.extend(self._entry(seq, kind, text, data, time))
        if answered and not self.summary.awaiting:
            self.summary.stopped = WAITING_FOR_RESUME
        return touched

    def _boundary(
        self, seq: int, kind: str, text: str, data: Mapping[str, Any], time: str | None
    ) -> Row | None:
        """The attempt row to draw before this entry, if a new process's run begins here."""
        stopped_by = self._attempts.stopped_by
        began = self._attempts.see(kind, text, data)
        if began == "resumed":
            return self._new_attempt(seq, time, f"run again after it stopped ({stopped_by})", began)
        if began == "lost":
            # Placed before the closing entries, which carry the lost process's last save
            # time: the row's start becomes the new process's first entry's, below.
            self._lost_attempt = self._new_attempt(
                seq,
                time,
                "the process before was lost without stopping (killed, or its pod or node "
                "went away); what it left running is marked aborted above",
                began,
            )
            return self._lost_attempt
        if not self._attempts.closing and kind != "joined":
            attempt, self._lost_attempt = self._lost_attempt, None
            if attempt is not None and time is not None:
                attempt.start = time
                return attempt
        return None

    def _new_attempt(self, seq: int, time: str | None, text: str, status: str) -> Row:
        self.summary.attempts = self._attempts.count
        return self._row(
            "attempt",
            f"a{seq}",
            seq=None,
            title=f"attempt {self.summary.attempts}",
            text=text,
            status=status,
            start=time,
        )

    def _entry(
        self, seq: int, kind: str, text: str, data: Mapping[str, Any], time: str | None
    ) -> list[Row]:
        if kind == "message":
            message = _message(data)
            role = message.role if message else "user"
            return [
                self._row(
                    "message", f"e{seq}", seq, title=role, text=one_line(_text_of(message, text))
                )
            ]
        if kind == "waiting":
            row = self._row(
                "sent",
                f"e{seq}",
                seq,
                title="sent while running",
                text=one_line(_text_of(_message(data), text)),
                status="waiting",
                start=time,
            )
            self._sent[seq] = row
            return [row]
        if kind == "joined":
            sent = self._sent.pop(int(data.get("waiting_seq", -1)), None)
            if sent is None:
                return [self._note(seq, kind, text)]
            sent.seqs.append(seq)
            sent.status, sent.end = "joined", time
            return [sent]
        if kind == "model_request":
            if not self.summary.usage_over_time:
                self.summary.usage_over_time.append((millis(time) or 0, 0, 0, 0))
            model = str(data.get("model") or "model")
            self._model = self._row(
                "model", f"m{seq}", seq, title=model, text=f"asking {model}", status="running"
            )
            self._model.start = time
            self._model.turn = seq
            return [self._model]
        if kind == "model_reply":
            return self._reply(seq, text, data, time)
        if kind == "model_error":
            row = self._model or self._row("model", f"m{seq}", seq, title="model", text="")
            self._model = None
            if seq not in row.seqs:
                row.seqs.append(seq)
            row.lost = text == MODEL_STOPPED
            row.status = "aborted" if row.lost else "error"
            row.end = time
            row.text = one_line(text)
            return [row]
        if kind == "approval_request":
            return self._asked(seq, text, data)
        if kind == "permission":
            return self._answered(seq, text, data, time)
        if kind == "started" and str(data.get("call_id")) in self._calls:
            call = self._calls[str(data.get("call_id"))]
            call.seqs.append(seq)
            call.status, call.start = "running", time  # the run took it: its time starts
            return [call]
        if kind == "tool_result":
            return self._result(seq, text, data, time)
        if kind in ("compaction", "cleared"):
            spent = data.get("usage") or {}
            for key in USAGE_KEYS:
                self.summary.usage[key] += int(spent.get(key, 0))
            # Both make the requests smaller: a summary of older turns, or older results
            # replaced by a placeholder (the history below keeps them whole).
            return [
                self._row(
                    "compaction",
                    f"e{seq}",
                    seq,
                    title="compaction" if kind == "compaction" else "cleared",
                    text=one_line(text),
                    start=time,
                )
            ]
        if kind == "stop":
            reason = str(data.get("reason") or "stopped")
            self.summary.stopped = reason
            row = self._row(
                "stop",
                f"e{seq}",
                seq,
                title="stop",
                text=one_line(text),
                status=_STOP_STATUS.get(reason, ""),
                start=time,
            )
            return [row]
        return [self._note(seq, kind, text)]

    def _reply(self, seq: int, text: str, data: Mapping[str, Any], time: str | None) -> list[Row]:
        row = self._model or self._row("model", f"m{seq}", seq, title="model", text="")
        self._model = None
        row.seqs.append(seq)
        row.end = time
        message = _message(data)
        calls = message.tool_uses if message else []
        usage = data.get("usage") or {}
        row.tokens = {key: int(usage.get(key, 0)) for key in USAGE_KEYS}
        usage_so_far = self.summary.usage
        for key, value in row.tokens.items():
            usage_so_far[key] += value
        cost = data.get("cost_usd")
        self.summary.cost_usd += float(cost) if isinstance(cost, int | float) else 0.0
        if time:
            self.summary.usage_over_time.append(
                (
                    millis(time) or 0,
                    prompt_tokens(usage_so_far),
                    usage_so_far["output_tokens"],
                    usage_so_far["cache_read_input_tokens"],
                )
            )
        self.summary.turns += 1
        reply_text = message.text if message else text
        row.title = str(data.get("model") or row.title)
        row.text = one_line(reply_text) if reply_text else one_line(text)
        touched = [row]
        if calls:
            row.status = "ok"
            self.summary.answer = None
            self._calls = {}
            for index, block in enumerate(calls):
                call_id = str(block.get("id"))
                call_input = block.get("input") or {}
                shown = brief(call_input)
                call = self._row(
                    "call",
                    f"c{seq}.{index}",
                    seq,
                    title=str(block.get("name")),
                    text=shown,
                    status="running",
                    start=time,
                )
                call.turn, call.call_id = row.turn, call_id
                self._calls[call_id] = call
                self._inputs[call_id] = call_input
                self._shown_inputs[call_id] = shown
                touched.append(call)
        else:
            row.status = "answer"
            self.summary.answer = reply_text
        return touched

    def _asked(self, seq: int, text: str, data: Mapping[str, Any]) -> list[Row]:
        call_id = str(data.get("call_id"))
        call = self._calls.get(call_id)
        if call is None:
            return [self._note(seq, "approval_request", text)]
        call.seqs.append(seq)
        call.status = "asking"
        self.summary.awaiting.append(
            AwaitingCall(
                call_id, call.title, data.get("input") or self._inputs.get(call_id, {}), seq
            )
        )
        return [call]

    def _answered(
        self, seq: int, text: str, data: Mapping[str, Any], time: str | None
    ) -> list[Row]:
        call_id = str(data.get("call_id"))
        call = self._calls.get(call_id)
        self.summary.awaiting = [c for c in self.summary.awaiting if c.call_id != call_id]
        if call is None:
            return [self._note(seq, "permission", text)]
        call.seqs.append(seq)
        if data.get("allow") and self._attempts.stopped_by is not None:
            # Allowed while the run is stopped: it runs when a process resumes the run.
            call.status, call.start = "approved", time
        elif data.get("allow"):
            # It runs from the answer on: the wait for the person is not the tool's time.
            call.status, call.start = "running", time
        else:
            call.status = "refused"
        return [call]

    def _result(self, seq: int, text: str, data: Mapping[str, Any], time: str | None) -> list[Row]:
        call_id = str(data.get("call_id"))
        call = self._calls.get(call_id)
        if call is None:
            call = self._row("call", f"e{seq}", seq, title=str(data.get("name") or "tool"), text="")
            call.call_id = call_id
        else:
            call.seqs.append(seq)
        outcome = str(data.get("outcome") or "ok")
        call.status = outcome
        # A call lost with its process ended somewhere before the next process closed it.
        call.lost = outcome == "aborted" and text == UNKNOWN_RESULT
        call.end = time
        call.text = one_line(f"{self._shown_inputs.get(call_id, '')} → {text}")
        if outcome == "aborted":
            self.summary.aborted_calls += 1
        self.summary.awaiting = [c for c in self.summary.awaiting if c.call_id != call_id]
        return [call]

    # ------------------------------------------------------------------ rows
    def _row(
        self,
        kind: RowKind,
        row_id: str,
        seq: int | None,
        *,
        title: str,
        text: str,
        status: str = "",
        start: str | None = None,
    ) -> Row:
        row = Row(
            id=row_id,
            kind=kind,
            order=len(self.rows),
            seqs=[] if seq is None else [seq],
            title=title,
            text=text,
            status=status,
            start=start if start is not None else self._now,
            attempt=self.summary.attempts,
        )
        self.rows.append(row)
        return row

    def _note(self, seq: int, kind: str, text: str) -> Row:
        return self._row("note", f"e{seq}", seq, title=kind, text=one_line(text))


def _message(data: Mapping[str, Any]) -> Message | None:
    raw = data.get("message")
    if not isinstance(raw, dict):
        return None
    try:
        return Message.from_dict(raw)
    except ValueError:
        return None


def _text_of(message: Message | None, fallback: str) -> str:
    if message is None:
        return fallback
    return message.text or fallback
