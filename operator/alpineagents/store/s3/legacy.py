"""All of MinioStore's layout 1 (until 2026-12): reading it, and converting it to layout 2.

Layout 1 kept a commit point, ``info.json`` (``{"store": 1, "incarnation", "epoch",
"committed", "info", ...}``), rewritten on every save, next to segments
``h-<incarnation>/<first>-<last>-<epoch>.jsonl``. A read keeps, for each seq below
``committed``, the entry of the segment with the highest epoch that holds it. This version
reads such States as they are, and converts one to layout 2 on its first write or claim
(:func:`convert`): the whole history becomes slot 0 of a new incarnation, then
``info.json`` is replaced, ``If-Match`` the version read (so a layout-1 writer still
running is fenced), and the old segments are deleted. That costs one rewrite of the
history, once per State; it never writes layout 1. Dropping layout 1 is deleting this
module and its calls in :mod:`.minio_store`.

The segment algebra (:func:`live_segments`, :func:`pick_entries`) is a table-driven unit
test (``tests/stores/test_segments.py``).
"""

from __future__ import annotations

import contextlib
import re
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .. import jsonl
from .objects import Objects, Vanished
from .slots import INFO, LAYOUT, Header, Lines, doc_bytes, encode_piece, slot_name

__all__ = [
    "LEGACY_LAYOUT",
    "Converted",
    "Segment",
    "check_doc",
    "convert",
    "live_segments",
    "parse_lines",
    "parse_segment_name",
    "pick_entries",
    "read_lines",
    "segment_name",
]

LEGACY_LAYOUT = 1
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


def check_doc(doc: dict[str, Any]) -> None:
    """Raise ValueError for a layout-1 info.json that lacks what a read needs."""
    if not isinstance(doc.get("info"), dict):
        raise ValueError("not a MinioStore info document")
    int(doc["committed"]), int(doc["epoch"]), str(doc["incarnation"])


def read_lines(objects: Objects, folder: str, doc: dict[str, Any], deadline: float) -> Lines | None:
    """The committed entries of a layout-1 State, or None if a merge raced the read (read
    again). ``ValueError`` for a damaged one."""
    committed = int(doc["committed"])
    prefix = f"{folder}h-{doc['incarnation']}/"
    listed = [parse_segment_name(key, prefix) for key, _, _ in objects.list(prefix, deadline)]
    segments = [segment for segment in listed if segment is not None]
    live = live_segments(segments, committed, int(doc["epoch"]))
    try:
        bodies = objects.fetch_all([s.key for s in live], deadline)
    except Vanished:
        return None
    fetched = [(s, parse_lines(s, bodies[s.key])) for s in live]
    entries = pick_entries(fetched, committed)
    if len(entries) != committed:
        missing = sorted(set(range(committed)) - {seq for seq, _ in entries})
        raise ValueError(
            f"{committed} entries are committed, but its segments lack {len(missing)} of "
            f"them (seqs {missing[:5]}...)"
        )
    return entries


@dataclass(frozen=True)
class Converted:
    """A layout-1 State converted to layout 2: its chain is slot 0, written by ``token``."""

    incarnation: str
    token: str
    epoch: int
    count: int  # entries, all in slot 0
    info: dict[str, Any]


def convert(
    objects: Objects,
    folder: str,
    doc: dict[str, Any],
    etag: str,
    deadline: float,
    *,
    get_doc: Callable[[], tuple[dict[str, Any], str] | None],
    changed_since_read: Callable[[], BaseException] | None,
    missing: Callable[[], BaseException],
    attempts: int,
) -> Converted | None:
    """Convert the layout-1 State in ``folder`` (``doc``, read at ``etag``) to layout 2.

    ``None`` when someone else converted it meanwhile (take the layout-2 State over). A
    lost race raises ``changed_since_read()`` when the caller read the State (it must load
    it again), ``missing()`` when the State is gone; otherwise it retries on what is saved
    now, up to ``attempts`` times, then raises ``TimeoutError``.
    """
    for _ in range(attempts):
        lines = read_lines(objects, folder, doc, deadline)
        if lines is None:
            continue  # a layout-1 merge raced the read
        incarnation, token = secrets.token_hex(8), secrets.token_hex(8)
        epoch = int(doc["epoch"]) + 1
        key = f"{folder}h-{incarnation}/{slot_name(0)}"
        info = dict(doc["info"])
        header = Header(0, len(lines) - 1, epoch, token, info, "save", True)
        objects.put(key, encode_piece(header, (line for _, line in lines)), deadline)
        new_doc = {"store": LAYOUT, "incarnation": incarnation, "writer": token}
        put = objects.put_conditional(folder + INFO, doc_bytes(new_doc), deadline, if_match=etag)
        if put is not None:
            break
        got = get_doc()  # our own PUT, its answer lost?
        if got is not None and got[0].get("writer") == token:
            break
        with contextlib.suppress(Exception):
            objects.remove([key], deadline)
        if got is None:
            raise missing()
        if changed_since_read is not None:
            raise changed_since_read()
        if got[0].get("store") == LAYOUT:  # someone converted it meanwhile
            return None
        doc, etag = got
    else:
        raise TimeoutError("it kept changing while it was converted")
    with contextlib.suppress(Exception):  # the layout-1 segments nobody reads now
        old = f"{folder}h-{doc['incarnation']}/"
        objects.remove([k for k, _, _ in objects.list(old, deadline)], deadline)
    return Converted(incarnation, token, epoch, len(lines), info)


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
