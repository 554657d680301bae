"""MinioStore's segment algebra, table-driven: (segments, committed, epoch) → what a read
uses (layout 1, which this version reads and converts but never writes).

Segments are written ``"first-last@epoch"``. Rows are named after the situation a store
meets: a save whose ``info.json`` PUT never happened, a fenced writer's leftovers, a
merge stopped half-way, a newer owner's segments.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from alpineagents.store.s3.legacy import (
    Segment,
    live_segments,
    parse_lines,
    parse_segment_name,
    pick_entries,
    segment_name,
)
from alpineagents.store.s3.objects import checked_prefix
from alpineagents.store.s3.slots import lines_of, new_entries

FOLDER = "runs/nightly/h-0123/"


def seg(text: str) -> Segment:
    """``"10-19@2"``: entries 10 to 19 written at epoch 2, under FOLDER."""
    span, epoch = text.split("@")
    first, last = (int(n) for n in span.split("-"))
    return Segment(FOLDER + segment_name(first, last, int(epoch)), first, last, int(epoch))


def names(segments: list[Segment]) -> list[str]:
    return [f"{s.first}-{s.last}@{s.epoch}" for s in segments]


# ----------------------------------------------------------------------------- reads
@dataclass
class ReadRow:
    name: str
    listed: list[str]
    committed: int
    epoch: int
    live: list[str]


READS = [
    ReadRow("one segment, all committed", ["0-9@1"], 10, 1, ["0-9@1"]),
    ReadRow(
        "a segment past committed is invisible (its info.json PUT never happened)",
        ["0-9@1", "10-12@1"],
        10,
        1,
        ["0-9@1"],
    ),
    ReadRow(
        "a newer owner's segment is invisible to the epoch read",
        ["0-9@1", "10-12@3"],
        13,
        2,
        ["0-9@1"],
    ),
    ReadRow(
        "a merged segment hides the segments it holds (a merge stopped before its deletes)",
        ["0-9@1", "10-19@1", "0-19@1"],
        20,
        1,
        ["0-19@1"],
    ),
    ReadRow(
        "a higher epoch hides a fenced writer's segment over the same seqs",
        ["0-9@1", "10-14@1", "10-14@2"],
        15,
        2,
        ["0-9@1", "10-14@2"],
    ),
    ReadRow(
        "a lower epoch never hides a higher one",
        ["0-19@1", "10-14@2"],
        20,
        2,
        ["0-19@1", "10-14@2"],
    ),
]


@pytest.mark.parametrize("row", READS, ids=[row.name for row in READS])
def test_a_read_uses_the_live_segments(row: ReadRow) -> None:
    listed = [seg(text) for text in row.listed]
    assert names(live_segments(listed, row.committed, row.epoch)) == row.live


@dataclass
class PickRow:
    name: str
    segments: dict[str, list[int]]
    """Segment -> the seqs its lines hold (each line is ``b"<segment>:<seq>"``)."""
    committed: int
    picked: list[str]


PICKS = [
    PickRow(
        "for each seq the highest epoch wins",
        {"0-2@1": [0, 1, 2], "1-2@2": [1, 2]},
        3,
        ["0-2@1:0", "1-2@2:1", "1-2@2:2"],
    ),
    PickRow(
        "seqs at or past committed are left out", {"0-3@1": [0, 1, 2, 3]}, 2, ["0-3@1:0", "0-3@1:1"]
    ),
    PickRow(
        "a seq no segment holds is missing, not invented",
        {"0-0@1": [0], "2-2@1": [2]},
        3,
        ["0-0@1:0", "2-2@1:2"],
    ),
]


@pytest.mark.parametrize("row", PICKS, ids=[row.name for row in PICKS])
def test_a_read_picks_each_entry_once(row: PickRow) -> None:
    pairs = [
        (seg(text), [(seq, f"{text}:{seq}".encode()) for seq in seqs])
        for text, seqs in row.segments.items()
    ]
    assert [line.decode() for _, line in pick_entries(pairs, row.committed)] == row.picked


@pytest.mark.parametrize(
    ("key", "segment"),
    [
        (FOLDER + "000000000010-000000000019-0000000002.jsonl", (10, 19, 2)),
        (FOLDER + "000000000019-000000000010-0000000002.jsonl", None),  # first after last
        (FOLDER + "notes.txt", None),
        (FOLDER + "000000000010-000000000019-0000000002.jsonl.tmp", None),
    ],
    ids=["a segment", "first after last", "another object", "a longer name"],
)
def test_segment_names_parse_back(key: str, segment: tuple[int, int, int] | None) -> None:
    parsed = parse_segment_name(key, FOLDER)
    assert (None if parsed is None else (parsed.first, parsed.last, parsed.epoch)) == segment
    if parsed is not None:
        assert parsed.key == key
        assert segment_name(parsed.first, parsed.last, parsed.epoch) == key[len(FOLDER) :]


def test_lines_are_written_seq_first_and_read_back() -> None:
    entries = [{"kind": "message", "seq": 4, "text": "a"}, {"seq": 5, "kind": "stop"}]
    lines = lines_of(entries)
    assert [seq for seq, _ in lines] == [4, 5]
    assert all(line.startswith(b'{"seq":') for _, line in lines)
    body = b"".join(line + b"\n" for _, line in lines)
    assert parse_lines(seg("4-5@1"), body) == lines
    with pytest.raises(ValueError, match="holds seq 5: damaged"):
        parse_lines(seg("4-4@1"), body)


@pytest.mark.parametrize(
    ("have", "seqs", "new"),
    [(2, [0, 1, 2, 3], [2, 3]), (2, [3, 2], [2, 3]), (4, [0, 1], [])],
    ids=["entries sent again are skipped", "out of order is sorted", "nothing new"],
)
def test_new_entries_follow_on(have: int, seqs: list[int], new: list[int]) -> None:
    assert [e["seq"] for e in new_entries("run", [{"seq": s} for s in seqs], have)] == new


def test_new_entries_with_a_gap_are_refused() -> None:
    with pytest.raises(ValueError, match="the next one is seq 2, not 3"):
        new_entries("run", [{"seq": 3}], 2)


@pytest.mark.parametrize(
    ("prefix", "checked"),
    [("", ""), ("/", ""), ("runs", "runs/"), ("/team/runs/", "team/runs/")],
)
def test_a_plain_prefix_is_kept(prefix: str, checked: str) -> None:
    assert checked_prefix(prefix) == checked


@pytest.mark.parametrize("prefix", ["a/../b", "..", "a//b", "a/./b", "a\\b", "a\x00b"])
def test_a_prefix_that_could_climb_out_is_refused(prefix: str) -> None:
    with pytest.raises(ValueError, match="not a plain key prefix"):
        checked_prefix(prefix)
