"""The slot algebra of MinioStore's layout 2: pure functions, no requests.

A State's history is a chain of immutable objects numbered 0, 1, 2, ... (*slots*, see
:mod:`.minio_store`): slot ``k`` is ``s-<k>.jsonl``, and a merged object ``m-<low>-<high>-
<first>-<last>.jsonl`` holds what slots ``low..high`` hold (entries ``first..last``).
Every object starts with a one-line JSON *header*, then its entries as JSON lines. These
functions name and parse them, pick the objects a read needs (:func:`cover`) and plan
merges (:func:`plan_merge`). Each is a row in a table-driven unit test
(``tests/stores/test_slots.py``).
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .. import jsonl

__all__ = [
    "INFO",
    "LAYOUT",
    "MERGE_GROWTH",
    "Header",
    "Lines",
    "Piece",
    "cover",
    "doc_bytes",
    "encode_piece",
    "lines_of",
    "merged_name",
    "new_entries",
    "next_slot",
    "parse_header",
    "parse_piece_name",
    "plan_merge",
    "slot_name",
    "split_piece",
    "unneeded",
]

INFO = "info.json"  # a State's commit point: it exists, and which incarnation is current
LAYOUT = 2  # the "store" field of a layout-2 info.json

Lines = list[tuple[int, bytes]]  # (seq, JSON line without newline), in seq order


def doc_bytes(doc: dict[str, Any]) -> bytes:
    """An ``info.json`` body; a random nonce makes every version's ETag unique (no ABA on
    ``If-Match``)."""
    return json.dumps({**doc, "nonce": secrets.token_hex(8)}).encode()


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


def lines_of(entries: Iterable[dict[str, Any]]) -> Lines:
    """Entries as the (seq, line) pairs of a segment."""
    return [(int(entry["seq"]), jsonl.encode_line(entry)) for entry in entries]


MERGE_GROWTH = 2.0
"""An older object joins a merge while it is at most this many times the merged size."""
_SLOT = re.compile(r"s-(\d{12})\.jsonl")
_MERGED = re.compile(r"m-(\d{12})-(\d{12})-(\d{12})-(\d{12})\.jsonl")


@dataclass(frozen=True)
class Piece:
    """One object of the chain: slots ``low..high`` (one slot, or a merged object)."""

    key: str
    low: int
    high: int
    merged: bool
    size: int = 0  # bytes, as the listing gives them
    first: int = -1  # entries first..last of a merged object (its name says); -1 for a slot
    last: int = -1


@dataclass(frozen=True)
class Header:
    """The first line of every object: what it holds and who wrote it."""

    first: int  # entries first..last (last = first - 1 when it holds none)
    last: int
    epoch: int
    writer: str
    info: dict[str, Any] | None
    kind: str  # "save", "claim" (an epoch's fence post), "deleted", "merged"
    post: bool  # the first slot of its epoch: never deleted by a merge (it is a fence)

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "first": self.first,
                "last": self.last,
                "epoch": self.epoch,
                "writer": self.writer,
                "kind": self.kind,
                "post": self.post,
                "info": self.info,
            },
            separators=(",", ":"),
        ).encode()


def slot_name(slot: int) -> str:
    """The object name of slot ``slot`` (under ``h-<incarnation>/``)."""
    return f"s-{slot:012d}.jsonl"


def merged_name(low: int, high: int, first: int, last: int) -> str:
    """The object name of slots ``low..high`` merged, holding entries ``first..last``."""
    return f"m-{low:012d}-{high:012d}-{first:012d}-{last:012d}.jsonl"


def parse_piece_name(key: str, folder: str, size: int = 0) -> Piece | None:
    """The piece that object ``key`` under ``folder`` (``.../h-<incarnation>/``) is, or
    None for an object that is not one."""
    name = key[len(folder) :]
    match = _SLOT.fullmatch(name)
    if match is not None:
        slot = int(match.group(1))
        return Piece(key, slot, slot, False, size)
    match = _MERGED.fullmatch(name)
    if match is None:
        return None
    low, high, first, last = (int(group) for group in match.groups())
    if low > high or first > last + 1:
        return None
    return Piece(key, low, high, True, size, first, last)


def encode_piece(header: Header, lines: Iterable[bytes]) -> bytes:
    """An object's body: the header line, then each entry line."""
    return b"".join([header.to_json(), b"\n", *(line + b"\n" for line in lines)])


def parse_header(key: str, head: bytes) -> Header:
    """The header of object ``key`` from its first line; ``ValueError`` if damaged."""
    try:
        raw = json.loads(head)
        info = raw["info"]
        return Header(
            int(raw["first"]),
            int(raw["last"]),
            int(raw["epoch"]),
            str(raw["writer"]),
            dict(info) if info is not None else None,
            str(raw["kind"]),
            bool(raw["post"]),
        )
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"object {key} has no valid header ({error})") from None


def split_piece(key: str, body: bytes) -> tuple[Header, list[tuple[int, bytes]]]:
    """The header and the (seq, line) entries of an object; ``ValueError`` if damaged."""
    head, _, rest = body.partition(b"\n")
    header = parse_header(key, head)
    if rest and not rest.endswith(b"\n"):  # objects are written whole
        raise ValueError(f"object {key} is not JSON lines: it ends mid-line (cut short)")
    lines = []
    for line in jsonl.complete_lines(rest):
        try:
            seq = jsonl.seq_of(line)
        except (ValueError, TypeError, KeyError) as error:
            raise ValueError(f"object {key} is not JSON lines ({error})") from None
        lines.append((seq, line))
    seqs = [seq for seq, _ in lines]
    if seqs != list(range(header.first, header.last + 1)):
        raise ValueError(
            f"object {key} should hold entries {header.first}..{header.last}, but holds "
            f"{len(seqs)} ({seqs[:5]}...)"
        )
    return header, lines


def next_slot(pieces: Iterable[Piece]) -> int:
    """The number of the next slot to write: one past the highest slot any piece holds."""
    return max((piece.high for piece in pieces), default=-1) + 1


def cover(pieces: Iterable[Piece]) -> list[Piece] | None:
    """The fewest pieces that hold slots ``0..next_slot-1``, in order; None for a gap.

    At each slot, the piece reaching furthest wins; a merged one before a single slot that
    reaches as far (a single slot there is a fence post kept next to the merged copy, or a
    fenced writer's write into a slot a merge had already deleted, never the original).
    """
    ordered = sorted(pieces, key=lambda p: (p.low, -p.high, not p.merged))
    end = next_slot(ordered)
    chosen: list[Piece] = []
    position, index, best = 0, 0, None
    while position < end:
        while index < len(ordered) and ordered[index].low <= position:
            piece = ordered[index]
            if (
                best is None
                or piece.high > best.high
                or (piece.high == best.high and piece.merged and not best.merged)
            ):
                best = piece
            index += 1
        if best is None or best.high < position:
            return None
        chosen.append(best)
        position = best.high + 1
    return chosen


def plan_merge(covering: list[Piece], cap: int) -> list[Piece]:
    """Which pieces at the end of a cover to merge into one (none: an empty list).

    The single slots at the end all join; then, size-tiered, older pieces while each is
    at most ``MERGE_GROWTH`` times what is merged so far and the merged object stays
    under ``cap`` bytes. So each entry is rewritten O(log n) times, a merge writes at most
    ``cap`` bytes (or the trailing slots, if they alone are more), and a read needs about
    ``history / cap + log(cap)`` objects.
    """
    start = len(covering)
    merged = 0
    while start > 0 and not covering[start - 1].merged:
        start -= 1
        merged += covering[start].size
    while start > 0:
        older = covering[start - 1].size
        if older > MERGE_GROWTH * merged or merged + older > cap:
            break
        start -= 1
        merged += older
    return covering[start:] if len(covering) - start >= 2 else []


def unneeded(listed: Iterable[Piece], covering: list[Piece]) -> tuple[list[Piece], list[Piece]]:
    """The pieces a read no longer uses, given the cover: (merged ones, single slots).

    Merged ones may go at once. Single slots may go only when they are not fence posts
    (the caller reads their headers to know), since a fenced writer targets exactly the
    first slot of the epoch that fenced it.
    """
    used = {piece.key for piece in covering}
    spans = [(piece.low, piece.high) for piece in covering if piece.merged]
    merged: list[Piece] = []
    single: list[Piece] = []
    for piece in listed:
        if piece.key in used:
            continue
        if any(low <= piece.low and piece.high <= high for low, high in spans):
            (merged if piece.merged else single).append(piece)
    return merged, single
