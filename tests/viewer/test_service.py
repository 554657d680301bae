"""The run viewer's plain functions, without a browser: the timeline a run's history makes,
following a run by reading only what is new, the runs list, and approvals.

Histories come from real runs: the Agent with the scripted model server, and a child
process killed with SIGKILL in the middle of a tool call (tests/agents/crash_child.py).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anthropic
import pytest

from alpineagents import Agent, FileStore, Message, Permissions, Record, State, StateInfo, tool
from alpineagents.testing import ModelServer, reply, tool_use
from alpineagents.viewer import RunViewer, Timeline, ViewerError, service
from alpineagents.viewer.cluster import Answer, ClusterRun, approvals_patch
from alpineagents.viewer.row_filter import RowFilter
from alpineagents.viewer.service import run_listings
from tests.bench.browser import write_long_run
from tests.paths import REPO


def rows_of(store: FileStore, state_id: str) -> list[dict[str, Any]]:
    record = store.read(state_id)
    assert record is not None
    timeline = Timeline()
    timeline.add(record.entries)
    return [row.to_json() for row in timeline.rows]


def test_concurrent_tools_are_rows_of_their_turn_with_their_outcomes(
    tmp_path: Path, model_server: ModelServer, model_client: anthropic.Anthropic
) -> None:
    @tool
    def fetch(url: str) -> str:
        """Fetches.

        Args:
            url: what
        """
        return "<html>"

    @tool
    def grep(pattern: str) -> str:
        """Greps.

        Args:
            pattern: what
        """
        raise RuntimeError("no such file")

    store = FileStore(tmp_path)
    agent = Agent("claude-sonnet-5", store, tools=[fetch, grep], client=model_client)
    model_server.add(
        reply("Both.", tool_use("fetch", {"url": "u"}), tool_use("grep", {"pattern": "p"})),
        reply("Done."),
    )
    agent.run(State("two-tools", [Message.user("Go")]))
    rows = rows_of(store, "two-tools")
    assert [(r["kind"], r["title"], r["status"]) for r in rows] == [
        ("message", "user", ""),
        ("model", "claude-sonnet-5", "ok"),
        ("call", "fetch", "ok"),
        ("call", "grep", "error"),
        ("model", "claude-sonnet-5", "answer"),
        ("stop", "stop", "ok"),
    ]
    model, fetch_row, grep_row = rows[1:4]
    # Both calls start with the reply that asked for them and share the model's turn.
    assert fetch_row["start"] == grep_row["start"] == model["end"]
    assert fetch_row["turn"] == grep_row["turn"] == model["turn"]
    assert grep_row["text"].endswith("RuntimeError: no such file")
    assert model["tokens"]["input_tokens"] > 0


def test_a_killed_process_leaves_an_aborted_call_after_an_attempt_boundary(
    tmp_path: Path, model_server: ModelServer, model_client: anthropic.Anthropic
) -> None:
    folder = tmp_path / "runs"
    model_server.add(reply("On it.", tool_use("slow", id="toolu_slow")))
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.agents.crash_child", str(folder), "report", "tool"],
        cwd=REPO,
        env={**os.environ, **model_server.env},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    for line in child.stdout:
        if line.startswith("started slow"):
            break
    child.send_signal(signal.SIGKILL)
    assert child.wait(60) == -signal.SIGKILL

    store = FileStore(folder)
    state = store.load("report")
    model_server.add(reply("It may not have run."))
    Agent("claude-sonnet-5", store, client=model_client).run(state)

    rows = rows_of(store, "report")
    kinds = [(r["kind"], r["status"]) for r in rows]
    assert kinds == [
        ("message", ""),
        ("model", "ok"),
        ("call", "aborted"),
        ("attempt", "lost"),
        ("model", "answer"),
        ("stop", "ok"),
    ]
    call, boundary = rows[2], rows[3]
    assert call["lost"] is True
    assert boundary["title"] == "attempt 2"
    assert boundary["text"].endswith("what it left running is marked aborted above")
    record = store.read("report")
    assert record is not None
    closing = next(e for e in record.entries if e["kind"] == "tool_result")
    after = record.entries[closing["seq"] + 1]
    # The call's bar ends at the lost process's last save (the time its closing entry
    # carries): a lower bound. The new attempt begins with the new process's first entry.
    assert call["end"] == closing["time"] == record.entries[closing["seq"] - 1]["time"]
    assert boundary["start"] == after["time"] > call["end"]
    assert call["seq"] == closing["seq"]  # the row's # is the result's entry
    # The runs list (store mode) counts what the page draws: the crash shows there too.
    listed = asyncio.run(RunViewer(store).runs())["runs"]
    assert [(r["id"], r["attempts"], r["aborted_calls"]) for r in listed] == [("report", 2, 1)]


def test_a_stopped_run_run_again_is_a_new_attempt(
    tmp_path: Path, model_server: ModelServer, model_client: anthropic.Anthropic
) -> None:
    store = FileStore(tmp_path)
    agent = Agent("claude-sonnet-5", store, client=model_client, max_turns=1)
    model_server.add(reply(tool_use("missing_tool")), reply("Answered."))
    state = State("twice", [Message.user("Go")])
    agent.run(state)  # stops at max_turns
    agent.max_turns = None
    agent.run(store.load("twice"))
    rows = rows_of(store, "twice")
    boundaries = [r for r in rows if r["kind"] == "attempt"]
    assert [(b["status"], b["text"]) for b in boundaries] == [
        ("resumed", "run again after it stopped (max_turns)")
    ]
    assert rows[-1]["attempt"] == 2
    listed = asyncio.run(RunViewer(store).runs())["runs"]
    assert [(r["attempts"], r["aborted_calls"]) for r in listed] == [(2, 0)]


def test_a_timeline_fed_in_pieces_ends_as_the_one_fed_at_once(
    tmp_path: Path, model_server: ModelServer, model_client: anthropic.Anthropic
) -> None:
    store = FileStore(tmp_path)

    @tool
    def step(n: int) -> str:
        """Steps.

        Args:
            n: which
        """
        return f"step {n}"

    agent = Agent("claude-sonnet-5", store, tools=[step], client=model_client)
    model_server.add(
        reply(tool_use("step", {"n": 1}), tool_use("step", {"n": 2})),
        reply(tool_use("step", {"n": 3})),
        reply("Three steps."),
    )
    agent.run(State("pieces", [Message.user("Go")]))
    record = store.read("pieces")
    assert record is not None
    whole = Timeline()
    whole.add(record.entries)
    pieces, latest = Timeline(), {}
    for entry in record.entries:
        for row in pieces.add([entry, *record.entries[: entry["seq"]]]):  # with repeats
            latest[row.id] = row.to_json()
    assert latest == {row.id: row.to_json() for row in whole.rows}
    assert pieces.summary == whole.summary
    with pytest.raises(ValueError, match="entry 9 is missing"):
        Timeline().add(record.entries[:9] + record.entries[10:])


class CountingStore(FileStore):
    """A FileStore that counts whole-history reads and tail reads."""

    def __init__(self, folder: Path) -> None:
        super().__init__(folder)
        self.reads = 0
        self.tails: list[int] = []

    def read(self, state_id: str) -> Record | None:
        self.reads += 1
        return super().read(state_id)

    def read_since(self, state_id: str, seq: int) -> Record | None:
        self.tails.append(seq)
        return super().read_since(state_id, seq)


async def test_following_a_run_reads_only_what_is_new(tmp_path: Path) -> None:
    store = CountingStore(tmp_path)
    state = State("live", [Message.user("first")])
    store.save(state)
    viewer = RunViewer(store, fast_poll=0.01, slow_poll=0.01)
    updates = viewer.follow("live")
    first = await anext(updates)
    assert first.reset and [r.text for r in first.rows] == ["first"]
    state.send("second")
    store.save(state)
    second = await asyncio.wait_for(anext(updates), 60)
    assert [r.text for r in second.rows] == ["second"]
    assert second.summary["entries"] == 2
    store.delete("live")
    gone = await asyncio.wait_for(anext(updates), 60)
    assert gone.gone
    await updates.aclose()
    # The first read_since(0) is one whole read; following never makes another.
    assert store.reads == 1
    assert store.tails[0] == 0 and set(store.tails[1:]) <= {1, 2}


async def test_the_runs_list_counts_attempts_reading_only_what_is_new(tmp_path: Path) -> None:
    store = CountingStore(tmp_path)
    state = State("counted", [Message.user("first")])
    store.save(state)
    viewer = RunViewer(store)
    first = (await viewer.runs())["runs"]
    assert [(r["attempts"], r["aborted_calls"]) for r in first] == [(1, 0)]
    state.add("stop", "stopped: interrupted", {"reason": "interrupted"})
    state.send("second")  # run again after the stop: a second attempt
    store.save(state)
    again = (await viewer.runs())["runs"]
    assert [(r["attempts"], r["aborted_calls"]) for r in again] == [(2, 0)]
    await viewer.runs()  # nothing new: nothing read
    # Each list reads an open State's last entry (is it waiting for a resume?); the
    # counts read the whole history at the first list, then only the entries saved since.
    assert store.tails == [0, 0, 2, 1, 2]  # three lists: [0, 0], [2, 1], [2]


async def test_a_long_run_opens_on_its_last_rows_and_gives_the_others_a_page_at_a_time(
    tmp_path: Path,
) -> None:
    store = FileStore(tmp_path)
    write_long_run(store, "long", 2_000)
    record = store.read("long")
    assert record is not None
    whole = Timeline()
    whole.add(record.entries)
    count = len(whole.rows)
    viewer = RunViewer(store)
    updates = viewer.follow("long")
    first = await anext(updates)
    assert first.follow_id is not None
    # The first message holds the rows the page opens on (its end), and what the head shows.
    assert first.summary["entries"] == 2_000 and first.summary["rows"] == count
    assert [row.order for row in first.rows] == list(range(count - len(first.rows), count))
    assert service.FIRST_ROWS <= len(first.rows) < service.FIRST_ROWS + 3  # whole turns
    assert first.rows[-1].kind == "stop" and first.summary["answer"].endswith("files checked.")
    plot = first.summary["usage_over_time"]
    assert len(plot) <= 240 and plot[0][1:] == (0, 0, 0)
    usage = whole.summary.usage
    assert plot[-1][1:] == (
        usage["input_tokens"]
        + usage["cache_creation_input_tokens"]
        + usage["cache_read_input_tokens"],
        usage["output_tokens"],
        usage["cache_read_input_tokens"],
    )
    # Other rows come a page at a time, widened so no turn is cut.
    page = viewer.page("long", first.follow_id, 701, 899)
    columns, rows = page["columns"], page["rows"]
    orders = [row[columns.index("order")] for row in rows]
    assert orders == list(range(orders[0], orders[-1] + 1))
    assert orders[0] <= 701 and orders[-1] >= 898 and page["total_rows"] == count
    assert whole.rows[orders[0] - 1].turn != whole.rows[orders[0]].turn
    assert whole.rows[orders[-1] + 1].turn != whole.rows[orders[-1]].turn
    assert rows == [row.as_list() for row in whole.rows[orders[0] : orders[-1] + 1]]
    with pytest.raises(ViewerError, match="reload") as other:
        viewer.page("other", first.follow_id, 0, 10)
    assert other.value.status == 404
    with pytest.raises(ViewerError, match="rows") as too_many:
        viewer.page("long", first.follow_id, 0, service.PAGE_LIMIT + 1)
    assert too_many.value.status == 400
    await updates.aclose()
    with pytest.raises(ViewerError, match="reload"):  # a follow that ended keeps nothing
        viewer.page("long", first.follow_id, 0, 10)


async def test_a_search_and_errors_only_filter_the_whole_run_a_page_at_a_time(
    tmp_path: Path,
) -> None:
    store = FileStore(tmp_path)
    write_long_run(store, "long", 10_000)  # every 50th turn's lint call fails: 49 of them
    viewer = RunViewer(store)
    updates = viewer.follow("long")
    first = await anext(updates)
    assert first.follow_id is not None
    errors = RowFilter(errors_only=True)
    pages = [viewer.page("long", first.follow_id, at, at + 20, errors) for at in (0, 20, 40)]
    assert [len(page["matches"]) for page in pages] == [20, 20, 9]
    assert {page["total_rows"] for page in pages} == {49}
    kept = [order for page in pages for order in page["matches"]]
    assert kept == sorted(set(kept))  # in timeline order, each once
    for page in pages:
        rows = {row[0]: dict(zip(page["columns"], row, strict=True)) for row in page["rows"]}
        assert all(
            rows[o]["status"] == "error" and rows[o]["title"] == "lint" for o in page["matches"]
        )
        # Each kept row comes with the rest of its turn: its bar is drawn in the turn's window.
        assert {r["turn"] for r in rows.values()} == {rows[o]["turn"] for o in page["matches"]}
        assert {r["kind"] for r in rows.values()} == {"model", "call"}
    # A search is any case, over a row's text; both filters together keep what both keep.
    found = viewer.page("long", first.follow_id, 0, 200, RowFilter("F1234.PY"))
    assert found["total_rows"] == 2
    texts = [dict(zip(found["columns"], r, strict=True))["text"] for r in found["rows"]]
    assert all("f1234.py" in text for text in texts[1:]) and len(texts) == 3
    both = viewer.page("long", first.follow_id, 0, 200, RowFilter("f1250.py", errors_only=True))
    assert both["total_rows"] == 1
    nothing = viewer.page("long", first.follow_id, 0, 200, RowFilter("no such words"))
    assert nothing == {**nothing, "total_rows": 0, "matches": [], "rows": []}
    await updates.aclose()


async def test_entries_gives_whole_entries_and_unknown_ids_say_so(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    store.save(State("one", [Message.user("x" * 5000)]))
    viewer = RunViewer(store)
    [entry] = await viewer.entries("one", [0])
    assert entry["data"]["message"]["content"] == "x" * 5000  # not the row's excerpt
    with pytest.raises(ViewerError, match="no saved State 'nope'") as missing:
        await anext(viewer.follow("nope"))
    assert missing.value.status == 404


def waiting_run(store: FileStore, model: ModelServer, client: anthropic.Anthropic) -> None:
    @tool
    def deploy(env: str) -> str:
        """Deploys.

        Args:
            env: where
        """
        return "deployed"

    agent = Agent(
        "claude-sonnet-5",
        store,
        tools=[deploy],
        permissions=Permissions(ask=["deploy"]),
        client=client,
    )
    model.add(
        reply(
            tool_use("deploy", {"env": "a"}, id="toolu_a"),
            tool_use("deploy", {"env": "b"}, id="toolu_b"),
        )
    )
    agent.run(State("ship", [Message.user("Ship")]))


async def test_approvals_are_refused_read_only_and_taken_whole_when_on(
    tmp_path: Path, model_server: ModelServer, model_client: anthropic.Anthropic
) -> None:
    store = FileStore(tmp_path)
    await asyncio.to_thread(waiting_run, store, model_server, model_client)
    both = [Answer("toolu_a", True), Answer("toolu_b", False, "not b")]
    with pytest.raises(ViewerError, match="read-only") as refused:
        await RunViewer(store).approve("ship", both)
    assert refused.value.status == 403
    viewer = RunViewer(store, allow_approvals=True)
    with pytest.raises(ViewerError, match="answer every waiting call"):
        await viewer.approve("ship", both[:1])
    with pytest.raises(ViewerError, match="toolu_zzz"):
        await viewer.approve("ship", [Answer("toolu_zzz", True)])
    assert await viewer.approve("ship", both) == f"State ship in {store!r}"
    saved = store.read("ship")
    assert saved is not None
    assert [(e["kind"], e["data"].get("allow")) for e in saved.entries[-2:]] == [
        ("permission", True),
        ("permission", False),
    ]
    with pytest.raises(ViewerError, match="does not wait"):
        await viewer.approve("ship", both)


async def test_an_answered_run_waits_for_a_resume_and_the_resume_is_its_next_attempt(
    tmp_path: Path, model_server: ModelServer, model_client: anthropic.Anthropic
) -> None:
    store = FileStore(tmp_path)
    await asyncio.to_thread(waiting_run, store, model_server, model_client)
    viewer = RunViewer(store, allow_approvals=True)
    await viewer.approve("ship", [Answer("toolu_a", True), Answer("toolu_b", False, "not b")])

    record = store.read("ship")
    assert record is not None
    timeline = Timeline()
    timeline.add(record.entries)
    summary = timeline.summary.to_json()
    # Nothing runs: no second attempt, the run is not open, the allowed call not running.
    assert summary["stopped"] == "waiting_for_resume"
    assert summary["attempts"] == 1
    calls = {r.call_id: r.status for r in timeline.rows if r.kind == "call"}
    assert calls == {"toolu_a": "approved", "toolu_b": "refused"}
    (listed,) = (await viewer.runs())["runs"]
    assert (listed["stopped"], listed["process"]) == (None, "waiting_for_resume")

    model_server.add(reply("Shipped a."))
    state = store.load("ship")
    agent = Agent("claude-sonnet-5", store, client=model_client)
    await asyncio.to_thread(agent.run, state)
    record = store.read("ship")
    assert record is not None
    timeline = Timeline()
    timeline.add(record.entries)
    assert timeline.summary.stopped == "answered"
    (boundary,) = [r for r in timeline.rows if r.kind == "attempt"]
    assert boundary.text == "run again after it stopped (waiting_for_approval)"
    # The attempt begins with the resumed process's first entry, after the answers.
    answers = [e for e in record.entries if e["kind"] == "permission"]
    first_of_attempt = record.entries[answers[-1]["seq"] + 1]
    assert boundary.start == first_of_attempt["time"]


def info(state_id: str, parent: str | None = None, minute: int = 0) -> StateInfo:
    return StateInfo.from_info(
        state_id,
        {"parent_id": parent, "updated_at": f"2026-03-01T10:{minute:02d}:00+00:00", "entries": 3},
    )


def test_the_runs_list_nests_subagents_and_joins_agentruns() -> None:
    infos = [
        info("b", minute=9),
        info("a.call2", "a", minute=8),
        info("a.call1", "a", minute=7),
        info("a.call1.x", "a.call1", minute=6),
        info("a", minute=5),
        info("orphan.c", "gone", minute=4),
    ]
    run = ClusterRun(namespace="ns", name="a-run", state_id="a", phase="Running", attempt=2)
    pending = ClusterRun(namespace="ns", name="new", state_id="ns.new.12345678")
    listing = run_listings(infos, [run, pending])
    assert [(r.id, r.depth) for r in listing] == [
        ("ns.new.12345678", 0),
        ("b", 0),
        ("a", 0),
        ("a.call1", 1),
        ("a.call1.x", 2),
        ("a.call2", 1),
        ("orphan.c", 0),  # its parent is not in the store: shown at the top level
    ]
    assert listing[0].saved is False
    by_id = {r.id: r for r in listing}
    assert by_id["a"].cluster == run and by_id["a"].children == 2


def test_an_approval_patch_keeps_earlier_answers_and_the_resource_version() -> None:
    run = ClusterRun(
        namespace="ns",
        name="r",
        state_id="s",
        approvals=({"callId": "old", "allow": False}, {"callId": "c1", "allow": False}),
        resource_version="42",
    )
    assert approvals_patch(run, [Answer("c1", True, "ok")]) == {
        "metadata": {"resourceVersion": "42"},
        "spec": {
            "approvals": [
                {"callId": "old", "allow": False},
                {"callId": "c1", "allow": True, "note": "ok"},
            ]
        },
    }
