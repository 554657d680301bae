"""MinioStore's slot algebra (layout 2), table-driven: listed objects → what a read uses,
what a merge takes and what it may then delete.

Pieces are written ``"3"`` (slot 3) or ``"m0-9"`` (slots 0 to 9 merged), with ``:size``
when a row is about sizes. Rows are named after the situation a store meets: a merge
stopped before its delete, two merges racing, a fenced writer's write into a slot a merge
had deleted.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from alpineagents.store.s3.slots import (
    Header,
    Piece,
    cover,
    encode_piece,
    merged_name,
    next_slot,
    parse_header,
    parse_piece_name,
    plan_merge,
    slot_name,
    split_piece,
    unneeded,
)

FOLDER = "runs/nightly/h-0123/"


def piece(text: str) -> Piece:
    """``"3"``, ``"m0-9"``, with an optional ``":size"``."""
    span, _, size = text.partition(":")
    if span.startswith("m"):
        low, high = (int(n) for n in span[1:].split("-"))
        key = FOLDER + merged_name(low, high, low * 10, high * 10 + 9)
        return Piece(key, low, high, True, int(size or 0), low * 10, high * 10 + 9)
    slot = int(span)
    return Piece(FOLDER + slot_name(slot), slot, slot, False, int(size or 0))


def names(pieces: list[Piece] | None) -> list[str] | None:
    if pieces is None:
        return None
    return [f"m{p.low}-{p.high}" if p.merged else str(p.low) for p in pieces]


# ------------------------------------------------------------------------------ reads
@dataclass
class CoverRow:
    name: str
    listed: list[str]
    used: list[str] | None


COVERS = [
    CoverRow("a new State: slot 0", ["0"], ["0"]),
    CoverRow("slots in a row", ["0", "1", "2"], ["0", "1", "2"]),
    CoverRow("a merged object stands for its slots", ["m0-2", "3", "4"], ["m0-2", "3", "4"]),
    CoverRow(
        "a merge stopped before its delete: the slots are still there, unused",
        ["0", "1", "2", "m0-2", "3"],
        ["m0-2", "3"],
    ),
    CoverRow(
        "fence posts kept next to the merged copy are not read",
        ["0", "m0-5", "4", "6"],
        ["m0-5", "6"],
    ),
    CoverRow(
        "a fenced writer's write into a slot a merge deleted loses to the merged copy",
        ["m0-3", "3", "4"],
        ["m0-3", "4"],
    ),
    CoverRow(
        "two merges racing: each step takes the one reaching furthest",
        ["m0-3", "m2-6", "7"],
        ["m0-3", "m2-6", "7"],
    ),
    CoverRow("a gap (an object deleted under the listing): read again", ["0", "2"], None),
    CoverRow("nothing listed", [], []),
]


@pytest.mark.parametrize("row", COVERS, ids=[row.name for row in COVERS])
def test_a_read_uses_the_fewest_pieces(row: CoverRow) -> None:
    assert names(cover([piece(text) for text in row.listed])) == row.used


def test_the_next_slot_follows_the_highest_one_held() -> None:
    assert next_slot([]) == 0
    assert next_slot([piece("m0-9"), piece("3")]) == 10
    assert next_slot([piece("m0-9"), piece("10")]) == 11


# ----------------------------------------------------------------------------- merges
@dataclass
class MergeRow:
    name: str
    covering: list[str]
    cap: int
    inputs: list[str]


MERGES = [
    MergeRow("one slot: nothing to merge", ["0:500"], 1000, []),
    MergeRow(
        "the slots since the last merge join", ["0:50", "1:50", "2:50"], 1000, ["0", "1", "2"]
    ),
    MergeRow(
        "an older merged object of a like size joins (size-tiered)",
        ["m0-3:200", "4:50", "5:50", "6:50"],
        1000,
        ["m0-3", "4", "5", "6"],
    ),
    MergeRow(
        "a much bigger older object stays",
        ["m0-99:5000", "100:50", "101:50"],
        100_000,
        ["100", "101"],
    ),
    MergeRow(
        "tiers cascade while each is at most twice what is merged so far",
        ["m0-63:640", "m64-95:320", "m96-111:160", "112:80", "113:80"],
        10_000,
        ["m0-63", "m64-95", "m96-111", "112", "113"],
    ),
    MergeRow(
        "no merged object grows past the cap",
        ["m0-63:640", "m64-95:320", "m96-111:160", "112:80", "113:80"],
        700,
        ["m64-95", "m96-111", "112", "113"],
    ),
    MergeRow("one merged object and nothing since", ["m0-9:100"], 1000, []),
]


@pytest.mark.parametrize("row", MERGES, ids=[row.name for row in MERGES])
def test_a_merge_plan(row: MergeRow) -> None:
    assert names(plan_merge([piece(text) for text in row.covering], row.cap)) == row.inputs


@dataclass
class UnneededRow:
    name: str
    listed: list[str]
    merged_away: list[str]
    slots: list[str]


UNNEEDED = [
    UnneededRow("nothing merged: every slot is used", ["0", "1"], [], []),
    UnneededRow("the slots of a merged object", ["m0-2", "0", "1", "2", "3"], [], ["0", "1", "2"]),
    UnneededRow("a smaller merged object inside a bigger one", ["m0-5", "m0-2", "6"], ["m0-2"], []),
    UnneededRow("a slot after the merged range stays", ["m0-2", "3", "4"], [], []),
]


@pytest.mark.parametrize("row", UNNEEDED, ids=[row.name for row in UNNEEDED])
def test_what_a_merge_may_delete(row: UnneededRow) -> None:
    listed = [piece(text) for text in row.listed]
    covering = cover(listed)
    assert covering is not None
    merged, slots = unneeded(listed, covering)
    assert (names(merged), names(slots)) == (row.merged_away, row.slots)


# ------------------------------------------------------------------------ the objects
@pytest.mark.parametrize(
    ("name", "parsed"),
    [
        ("s-000000000007.jsonl", (7, 7, False)),
        ("m-000000000000-000000000009-000000000000-000000000041.jsonl", (0, 9, True)),
        ("m-000000000009-000000000000-000000000000-000000000041.jsonl", None),  # low > high
        ("000000000000-000000000009-0000000001.jsonl", None),  # a layout-1 segment
        ("s-7.jsonl", None),
        ("info.json", None),
    ],
)
def test_piece_names_parse_back(name: str, parsed: tuple[int, int, bool] | None) -> None:
    got = parse_piece_name(FOLDER + name, FOLDER)
    assert (None if got is None else (got.low, got.high, got.merged)) == parsed


def test_an_object_is_its_header_then_its_entries() -> None:
    header = Header(5, 6, 2, "token", {"entries": 7}, "save", False)
    body = encode_piece(header, [b'{"seq":5,"a":1}', b'{"seq":6,"b":"\\u00e9"}'])
    assert split_piece("k", body) == (
        header,
        [(5, b'{"seq":5,"a":1}'), (6, b'{"seq":6,"b":"\\u00e9"}')],
    )
    assert parse_header("k", body.split(b"\n")[0]) == header
    empty = Header(7, 6, 3, "other", None, "claim", True)
    assert split_piece("k", encode_piece(empty, [])) == (empty, [])


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b"not json\n", "no valid header"),
        (b'{"first":0}\n', "no valid header"),
        (
            encode_piece(Header(0, 1, 1, "t", {}, "save", True), [b'{"seq":0}'])[:-1],
            "cut short",
        ),
        (encode_piece(Header(0, 1, 1, "t", {}, "save", True), [b'{"seq":0}']), "0..1, but"),
        (encode_piece(Header(0, 0, 1, "t", {}, "save", True), [b'{"seq":3}']), r"\[3\]"),
    ],
)
def test_a_damaged_object_is_named(body: bytes, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        split_piece("runs/x/h-1/s-000000000000.jsonl", body)
