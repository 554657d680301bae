"""Where a run's attempts begin: one rule for the run page's attempt rows and the list.

An attempt is one process's run of a State. A new one begins where a run that stopped
(a ``stop`` entry) goes on with an entry of a run (a person's answer to a stopped run is
no step of a run), and where a process closes what a lost one left open: the first of the
entries a load writes for that (an aborted call whose result is unknown, a taken-back
model request). :class:`Attempts` applies the rule entry by entry; the timeline draws a
row where it says an attempt begins, and :class:`RunCounts` only counts, so the runs list
can show a run's attempts and aborted calls without building its rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

from alpineagents.state import MODEL_STOPPED, UNKNOWN_RESULT

AttemptStart = Literal["resumed", "lost"]


class Attempts:
    """The attempts of a run so far, from its entries in the order they were saved."""

    def __init__(self) -> None:
        self.count = 1
        self.stopped_by: str | None = None
        """The reason of the ``stop`` that ended the last attempt, while nothing of a run
        came after it."""
        self.closing = False
        """Whether the last entries close what a lost process left open."""

    def see(self, kind: str, text: str, data: Mapping[str, Any]) -> AttemptStart | None:
        """Take the next entry: ``resumed`` (a stopped run run again) or ``lost`` (a lost
        process's turn closed) when a new attempt begins at it, else None."""
        closing = closes_a_lost_turn(kind, text, data)
        began: AttemptStart | None = None
        if self.stopped_by is not None and kind != "stop" and not is_persons_answer(kind, data):
            self.stopped_by = None
            self.closing = closing
            began = "resumed"
        elif closing and not self.closing:
            self.closing = True
            began = "lost"
        elif not closing and kind != "joined":
            self.closing = False
        if kind == "stop":
            self.stopped_by = str(data.get("reason") or "stopped")
        if began is not None:
            self.count += 1
        return began


class RunCounts:
    """A run's attempts and aborted calls, from its entries a batch at a time (as a
    store's ``read_since`` hands them back; entries already seen are skipped)."""

    def __init__(self) -> None:
        self.next_seq = 0
        self.aborted_calls = 0
        self._attempts = Attempts()

    @property
    def attempts(self) -> int:
        return self._attempts.count

    def add(self, entries: Iterable[Mapping[str, Any]]) -> None:
        for raw in sorted(entries, key=lambda e: int(e["seq"])):
            seq = int(raw["seq"])
            if seq < self.next_seq:
                continue
            if seq > self.next_seq:
                raise ValueError(
                    f"history entry {self.next_seq} is missing (the next one given is {seq})"
                )
            kind, text = str(raw.get("kind", "")), str(raw.get("text", ""))
            data: Mapping[str, Any] = raw.get("data") or {}
            self._attempts.see(kind, text, data)
            if kind == "tool_result" and data.get("outcome") == "aborted":
                self.aborted_calls += 1
            self.next_seq = seq + 1


def is_persons_answer(kind: str, data: Mapping[str, Any]) -> bool:
    """Whether the entry is a person's answer to a call waiting for approval."""
    return kind == "permission" and data.get("by") == "person"


def closes_a_lost_turn(kind: str, text: str, data: Mapping[str, Any]) -> bool:
    """Whether a load wrote this entry to close what a lost process left open."""
    if kind == "model_error":
        return text == MODEL_STOPPED
    return kind == "tool_result" and data.get("outcome") == "aborted" and text == UNKNOWN_RESULT
