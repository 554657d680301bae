"""Reading States that MinioStore saved in its layout 1 (until 2026-12).

Layout 1 kept a commit point, ``info.json`` (``{"store": 1, "incarnation", "epoch",
"committed", "info", ...}``), rewritten on every save, next to segments
``h-<incarnation>/<first>-<last>-<epoch>.jsonl``. A read keeps, for each seq below
``committed``, the entry of the segment with the highest epoch that holds it (see
:mod:`.segments`). This version reads such States as they are, and converts one to
layout 2 on its first write (see :mod:`.minio_store`); it never writes layout 1.
"""

from __future__ import annotations

from typing import Any

from .objects import Objects, Vanished
from .segments import Lines, live_segments, parse_lines, parse_segment_name, pick_entries

__all__ = ["LAYOUT", "check_doc", "read_lines"]

LAYOUT = 1


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
