"""The segment algebra of MinioStore's layout 1, and the entry helpers both layouts share.

Layout 1 (see :mod:`.legacy`; read and converted, never written) stored a history as
immutable *segments*: these functions name and parse them, and decide which of them a
read needs and which entry of each seq wins (:func:`live_segments`,
:func:`pick_entries`). Each is a row in a table-driven unit test
(``tests/stores/test_segments.py``). Layout 2 is in :mod:`.slots`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .. import jsonl

__all__ = [
    "Lines",
    "Segment",
    "checked_prefix",
    "lines_bytes",
    "lines_of",
    "live_segments",
    "new_entries",
    "parse_lines",
    "parse_segment_name",
    "pick_entries",
    "segment_name",
]

_SEGMENT = re.compile(r"(\d{12})-(\d{12})-(\d{10})\.jsonl")


@dataclass(frozen=True)
class Segment:
    """One segment object: entries ``first..last`` of a history, written at ``epoch``."""

    key: str  # the full object key
    first: int
    last: int
    epoch: int

    @property
    def size(self) -> int:
        return self.last - self.first + 1

    def within(self, first: int, last: int) -> bool:
        return first <= self.first and self.last <= last


Lines = list[tuple[int, bytes]]  # (seq, JSON line without newline) of a segment


def new_entries(state_id: str, entries: list[dict[str, Any]], have: int) -> list[dict[str, Any]]:
    """The entries at or after seq ``have``; they must follow on without a gap."""
    new = sorted((e for e in entries if int(e["seq"]) >= have), key=lambda e: int(e["seq"]))
    for index, entry in enumerate(new):
        if int(entry["seq"]) != have + index:
            raise ValueError(
                f"State {state_id!r}: the store has {have} entries, so the next one is seq "
                f"{have + index}, not {entry['seq']}"
            )
    return new


def parse_lines(segment: Segment, body: bytes) -> Lines:
    """The (seq, line) pairs of a segment's body; ``ValueError`` for a damaged one."""
    if body and not body.endswith(b"\n"):  # segments are written whole, line by line
        raise ValueError(f"segment {segment.key} is not JSON lines: it ends mid-line (cut short)")
    lines: Lines = []
    for line in jsonl.complete_lines(body):
        # The seq is read without parsing the entry (a load parses each entry once, a
        # merge never).
        try:
            seq = jsonl.seq_of(line)
        except (ValueError, TypeError, KeyError) as error:
            raise ValueError(f"segment {segment.key} is not JSON lines ({error})") from None
        if not segment.first <= seq <= segment.last:
            raise ValueError(f"segment {segment.key} holds seq {seq}: damaged")
        lines.append((seq, line))
    return lines


def lines_of(entries: Iterable[dict[str, Any]]) -> Lines:
    """Entries as the (seq, line) pairs of a segment."""
    return [(int(entry["seq"]), jsonl.encode_line(entry)) for entry in entries]


def lines_bytes(lines: Lines) -> int:
    """The size of a segment made of ``lines``."""
    return sum(len(line) + 1 for _, line in lines)


def live_segments(segments: Iterable[Segment], committed: int, epoch: int) -> list[Segment]:
    """The segments a read needs, by first seq: visible, not contained in another one.

    A segment is contained (superseded) when another one holds all its seqs with an epoch
    at least as high: for each seq the highest epoch wins, so it would never be used.
    """
    visible = [s for s in segments if s.first < committed and s.epoch <= epoch]
    # Longest first among equal starts, higher epoch first among equal ranges: a segment
    # can only be contained in one sorted before it.
    visible.sort(key=lambda s: (s.first, -s.last, -s.epoch))
    reach: dict[int, int] = {}  # epoch -> furthest last seq of a segment seen so far
    live = []
    for segment in visible:
        if any(last >= segment.last for e, last in reach.items() if e >= segment.epoch):
            continue
        live.append(segment)
        reach[segment.epoch] = max(reach.get(segment.epoch, -1), segment.last)
    return live


def pick_entries(segments: Iterable[tuple[Segment, Lines]], committed: int) -> Lines:
    """Entries ``0..committed-1`` that are there: for each seq, from the highest epoch."""
    by_seq: dict[int, bytes] = {}
    for _, lines in sorted(segments, key=lambda pair: -pair[0].epoch):
        for seq, line in lines:
            if seq < committed:
                by_seq.setdefault(seq, line)
    return [(seq, by_seq[seq]) for seq in sorted(by_seq)]


def segment_name(first: int, last: int, epoch: int) -> str:
    """The object name of segment ``first..last`` of ``epoch`` (under ``h-<incarnation>/``)."""
    return f"{first:012d}-{last:012d}-{epoch:010d}.jsonl"


def parse_segment_name(key: str, folder: str) -> Segment | None:
    """The segment that object ``key`` under ``folder`` (``.../h-<incarnation>/``) is, or
    None for an object that is not one (another name, or ``first > last``)."""
    match = _SEGMENT.fullmatch(key[len(folder) :])
    if match is None:
        return None
    first, last, epoch = (int(group) for group in match.groups())
    return Segment(key, first, last, epoch) if first <= last else None


def checked_prefix(prefix: str) -> str:
    """``""`` or ``"a/b/"``; refuses parts that could climb out (``..``) or be ambiguous."""
    stripped = prefix.strip("/")
    if not stripped:
        return ""
    parts = stripped.split("/")
    for part in parts:
        if part in ("", ".", "..") or "\\" in part or "\x00" in part:
            raise ValueError(
                f"MinioStore prefix {prefix!r} is not a plain key prefix (no empty, '.' or "
                f"'..' parts, no backslash or NUL)"
            )
    return stripped + "/"
