"""Progress lines of a run: one line per saved step, as text or JSON (:class:`ProgressLog`).

:class:`LoggedStore` is the runner's view of its store: the same store, writing a line
for each entry it saves.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

from ..redaction import Redactor
from ..state import Entry
from ..store.base import Record, Store
from ..store.wrapped import WrappedStore

__all__ = ["LogFormat", "LoggedStore", "ProgressLog", "entry_event"]

LogFormat = Literal["text", "json"]

_EVENTS = {
    "message": "message",
    "waiting": "message",
    "joined": "message",
    "model_request": "think",
    "model_reply": "think",
    "model_error": "think",
    "tool_result": "tool",
    "permission": "approval",
    "approval_request": "approval",
    "started": "tool",
    "compaction": "compact",
    "stop": "stop",
}


def entry_event(entry: Entry) -> tuple[str, str]:
    """The step an entry records and a one-line text for it, e.g. ``("tool", "shell ok ...")``."""
    event = _EVENTS.get(entry.kind, entry.kind)
    if entry.kind == "tool_result":
        return event, f"{entry.data.get('name', '?')} {entry.outcome} {entry.text}"
    if entry.kind == "model_error":
        return event, f"failed: {entry.text}"
    if entry.kind == "stop":
        reason = str(entry.data.get("reason"))
        detail = entry.data.get("error")
        return event, f"{reason}: {detail}" if detail else reason
    return event, entry.text


class ProgressLog:
    """One line per step of a run to ``stream``: readable text, or JSON objects.

    Text: ``12:00:01 think claude-sonnet-5 calls shell``; with ``show_seq``, each entry's
    seq comes first. JSON (``format="json"``): one object per line with ``time`` (ISO,
    UTC), ``event``, ``state`` and, for history entries, ``seq``, ``kind``, ``text`` and
    (tool results) ``tool``, ``outcome``, ``callId``.
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        format: LogFormat = "text",
        show_seq: bool = False,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.format = format
        self.show_seq = show_seq
        self._lock = threading.Lock()

    def entry(self, state_id: str, entry: Entry) -> None:
        """A line for one history entry."""
        event, text = entry_event(entry)
        if self.format == "json":
            record: dict[str, Any] = {
                "time": entry.time.isoformat(),
                "event": event,
                "state": state_id,
                "seq": entry.seq,
                "kind": entry.kind,
                "text": entry.text,
            }
            if entry.kind == "tool_result":
                record.update(
                    tool=entry.data.get("name"),
                    outcome=entry.outcome,
                    callId=entry.data.get("call_id"),
                )
            self._write(json.dumps(record, ensure_ascii=False))
            return
        seq = f"{entry.seq:>4} " if self.show_seq else ""
        self._write(f"{seq}{_clock(entry.time)} {event} {text}")

    def saved(self, state_id: str, entries: Sequence[Mapping[str, Any]]) -> None:
        """Lines for entries a save just wrote, then one for the save."""
        if not entries:
            return
        for raw in entries:
            self.entry(state_id, Entry.from_dict(dict(raw)))
        first, last = int(entries[0]["seq"]), int(entries[-1]["seq"])
        span = f"seq {first}" if first == last else f"seq {first}-{last}"
        self.note("save", span, state=state_id, firstSeq=first, lastSeq=last)

    def note(self, event: str, text: str, *, state: str | None = None, **fields: Any) -> None:
        """A line of the runner's own (start, resume, approval, save, warning, exit)."""
        now = datetime.now(UTC)
        if self.format == "json":
            record = {"time": now.isoformat(), "event": event, "state": state, "text": text}
            self._write(json.dumps({**record, **fields}, ensure_ascii=False))
        else:
            pad = "     " if self.show_seq else ""
            self._write(f"{pad}{_clock(now)} {event} {text}")

    def finished(
        self, exit_code: int, message: Mapping[str, Any], written_to: str | None = None
    ) -> None:
        """The last line: how the run ended (its termination message) and its exit code."""
        outcome = message["outcome"]
        if message["error"]:
            text = f"{outcome} (exit {exit_code}): {message['error']}"
        elif message["pendingApprovals"]:
            calls = ", ".join(f"{p['callId']} ({p['name']})" for p in message["pendingApprovals"])
            text = f"{outcome} (exit {exit_code}): {calls}"
        else:
            text = f"{outcome} (exit {exit_code})"
        self.note(
            "exit",
            text,
            state=message["stateId"] or None,
            exitCode=exit_code,
            message=message,
            terminationMessagePath=written_to,
        )

    def _write(self, line: str) -> None:
        with self._lock:
            try:
                self.stream.write(line + "\n")
                self.stream.flush()
            except (OSError, ValueError):
                pass  # a closed stderr must not stop the run


class LoggedStore(WrappedStore):
    """The runner's view of its store: the same store, logging each entry it saves.

    It also remembers the last error the store raised, so the runner can tell a store
    that went away (retryable) from the run's own errors, and masks the pod's secrets in
    what it saves (a tool that printed a token, a model error that echoed the key).
    """

    def __init__(
        self, inner: Store, log: ProgressLog | None, redactor: Redactor | None = None
    ) -> None:
        super().__init__(inner)
        self.log = log
        self.redactor = redactor or Redactor(())
        self.failure: BaseException | None = None
        self._logged: dict[str, int] = {}

    def outgoing(
        self, state_id: str, entries: builtins.list[dict[str, Any]], info: dict[str, Any]
    ) -> tuple[builtins.list[dict[str, Any]], dict[str, Any]]:
        return self.redactor.data(entries), self.redactor.data(info)

    def incoming(self, state_id: str, record: Record) -> Record:
        if record.entries:  # what was saved before is not logged again
            self._logged[state_id] = int(record.entries[-1]["seq"]) + 1
        return record

    @contextlib.contextmanager
    def calling_inner(self) -> Iterator[None]:
        try:
            yield
        except Exception as error:
            self.failure = error
            raise

    def written(
        self, state_id: str, entries: builtins.list[dict[str, Any]], *, create: bool
    ) -> None:
        done = self._logged.get(state_id, 0)
        new = [e for e in entries if int(e["seq"]) >= done]  # a retried save resends entries
        if new:
            self._logged[state_id] = int(new[-1]["seq"]) + 1
            if self.log is not None:
                self.log.saved(state_id, new)

    def __repr__(self) -> str:
        return repr(self.inner)


def _clock(moment: datetime) -> str:
    return moment.astimezone().strftime("%H:%M:%S")
