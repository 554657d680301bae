"""The store conformance suite: the data interface every store keeps, as pytest tests.

Run it on your own store (the spec's "Write your own store") by subclassing
:class:`StoreConformance` in a test module and giving it a ``store`` fixture that makes
a fresh, empty store::

    import pytest
    from alpineagents.testing.conformance import StoreConformance

    class TestMyStore(StoreConformance):
        @pytest.fixture
        def store(self):
            return MyStore(...)

alpineagents runs the same class over FileStore, :class:`~alpineagents.testing.MemoryStore`
and MinioStore on real MinIO and SeaweedFS. It needs ``pytest`` (not a dependency of
alpineagents itself), so ``alpineagents.testing`` does not import it: import this module.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ..forking import fork
from ..messages import Message
from ..state import ForkPoint, Record, State
from ..store.base import Store

__all__ = ["T0", "TRICKY_IDS", "StoreConformance", "a_run", "entry", "info", "seqs"]

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def entry(seq: int, text: str = "") -> dict[str, Any]:
    """A history entry as stores see it (Entry.to_dict of a message entry)."""
    message = Message.user(text or f"message {seq}")
    return {
        "seq": seq,
        "kind": "message",
        "time": (T0 + timedelta(seconds=seq)).isoformat(),
        "text": f"user: {message.text}",
        "data": {"message": message.to_dict()},
    }


def info(count: int, *, updated: datetime = T0, v: int = 5, **extra: Any) -> dict[str, Any]:
    """A State's info as stores see it (``State.to_record().info``), for ``count`` entries."""
    return {
        "v": v,
        "first_message": "message 0",
        "updated_at": updated.isoformat(),
        "stopped": None,
        "parent_id": None,
        "entries": count,
        **extra,
    }


def a_run(state_id: str = "source") -> State:
    """A State with an entry of each kind a fork may start from: the prompt (0), a model
    request (1), a reply calling a tool (2), its result (3), a compaction (4), another
    request (5), the answer (6) and the stop (7)."""
    state = State(state_id, messages=[Message.user("Count the files")])
    call = {"type": "tool_use", "id": "toolu_1", "name": "shell", "input": {"command": "ls"}}
    usage = {"input_tokens": 10, "output_tokens": 5}
    state.add("model_request", "asking", {"model": "claude-sonnet-5", "prompt_chars": 15})
    state.add(
        "model_reply",
        "calls shell",
        {"message": Message.assistant([call]).to_dict(), "usage": usage, "cost_usd": 0.01},
    )
    state.add(
        "tool_result",
        "a b c",
        {"call_id": "toolu_1", "name": "shell", "outcome": "ok", "content": "a b c"},
    )
    state.add("compaction", "compacted", {"summary": "listed the files", "replaced": 3})
    state.add("model_request", "asking", {"model": "claude-sonnet-5", "prompt_chars": 40})
    answer = Message.assistant([{"type": "text", "text": "Three files."}])
    state.add("model_reply", "Three files.", {"message": answer.to_dict(), "usage": usage})
    state.add("stop", "stopped: answered", {"reason": "answered"})
    return state


def _sorted(record: Record | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    assert record is not None
    return sorted(record.entries, key=lambda e: int(e["seq"])), record.info


def seqs(store: Store, state_id: str) -> list[int]:
    """The seqs a store holds for ``state_id``, in the order it gives them."""
    record = store.read(state_id)
    assert record is not None
    return [int(e["seq"]) for e in record.entries]


TRICKY_IDS = [
    "reports/2026/03",
    "..",
    ".",
    "../../escape",
    "a/../../b",
    "/absolute",
    "ünïcode-日本語-✓",
    "per%2Fcent",
    "space and tab",
    "a" * 200,
]


class StoreConformance:
    """The conformance tests; subclass it as ``Test...`` and give it a ``store`` fixture."""

    def check_ids_stay_inside(self, store: Store) -> None:
        """Override to check that the tricky ids of
        :meth:`test_ids_are_kept_exactly_and_cannot_escape` wrote nothing outside the
        store's own place (a folder, a key prefix); called while they are all saved."""

    def test_what_is_written_is_read_back(self, store: Store) -> None:
        entries = [entry(0), entry(1, 'ünïcode ✓ and "quotes"\nnewline')]
        store.write("run", entries, info(2, answer="hi"), create=True)
        record = store.read("run")
        assert record is not None
        assert sorted(record.entries, key=lambda e: e["seq"]) == entries
        assert record.info == info(2, answer="hi")

    def test_a_state_saved_and_loaded_is_the_same_state(self, store: Store) -> None:
        state = State("nightly-report", messages=[Message.user("Write the nightly report")])
        store.save(state)
        state.send("And add the weekly numbers")
        store.save(state)
        loaded = store.load("nightly-report")
        assert loaded == state
        assert [m.text for m in loaded.messages] == [
            "Write the nightly report",
            "And add the weekly numbers",
        ]
        assert store.load("nightly-report") == loaded

    def test_entries_sent_again_are_skipped(self, store: Store) -> None:
        store.write("run", [entry(0), entry(1)], info(2), create=True)
        # After a failed write the Agent sends the unsaved tail again, overlapping what landed.
        store.write("run", [entry(1), entry(2), entry(3)], info(4))
        store.write("run", [entry(2), entry(3)], info(4))
        assert seqs(store, "run") == [0, 1, 2, 3]

    def test_an_info_only_write_keeps_the_entries(self, store: Store) -> None:
        store.write("run", [entry(0)], info(1), create=True)
        store.write("run", [], info(1, stopped="done"))
        record = store.read("run")
        assert record is not None
        assert [e["seq"] for e in record.entries] == [0]
        assert record.info["stopped"] == "done"

    def test_read_since_gives_only_what_is_new(self, store: Store) -> None:
        assert store.read_since("run", 0) is None
        store.write("run", [entry(0), entry(1)], info(2), create=True)
        assert store.read_since("run", 2) == ([], info(2))
        # A line longer than one read window, so a tail reader has to look further back.
        later = [entry(2, "long " * 5000), entry(3), entry(4)]
        store.write("run", later, info(5, stopped="answered"))
        for seq in (0, 1, 2, 3, 5):
            record = store.read_since("run", seq)
            assert record is not None
            got = sorted(record.entries, key=lambda e: e["seq"])
            assert got == [entry(0), entry(1), *later][seq:]
            assert record.info == info(5, stopped="answered")

    def test_aread_since_gives_only_what_is_new(self, store: Store) -> None:
        # asyncio.run rather than an async test: the suite needs no pytest plugin.
        store.write("run", [entry(0), entry(1), entry(2)], info(3), create=True)
        record = asyncio.run(store.aread_since("run", 1))
        assert record is not None
        assert sorted(record.entries, key=lambda e: e["seq"]) == [entry(1), entry(2)]
        assert asyncio.run(store.aread_since("other", 0)) is None

    def test_create_refuses_an_existing_id_and_writes_nothing(self, store: Store) -> None:
        store.write("run", [entry(0), entry(1)], info(2), create=True)
        before = store.read("run")
        with pytest.raises(ValueError, match="run"):
            store.write("run", [entry(0, "another run")], info(1, first_message="x"), create=True)
        assert store.read("run") == before
        assert [saved.id for saved in store.list()] == ["run"]

    def test_an_unknown_id_is_refused_without_create(self, store: Store) -> None:
        with pytest.raises(LookupError):
            store.write("never-created", [entry(0)], info(1))
        assert store.read("never-created") is None
        assert store.list() == []

    def test_load_of_an_unknown_id_raises_lookup_error(self, store: Store) -> None:
        assert store.read("nobody") is None
        with pytest.raises(LookupError, match="nobody"):
            store.load("nobody")

    def test_list_shows_the_infos_most_recently_updated_first(self, store: Store) -> None:
        for name, minutes in [("old", 0), ("newest", 30), ("middle", 10)]:
            store.write(
                name, [entry(0)], info(1, updated=T0 + timedelta(minutes=minutes)), create=True
            )
        # What list shows comes from the info alone, not from the history.
        store.write("middle", [entry(1)], info(77, updated=T0 + timedelta(minutes=20)))
        listed = store.list()
        assert [saved.id for saved in listed] == ["newest", "middle", "old"]
        assert listed[1].entries == 77
        assert listed[1].updated_at == T0 + timedelta(minutes=20)

    def test_delete_removes_only_that_state(self, store: Store) -> None:
        for name in ["a", "ab", "a/b", "b"]:
            store.write(name, [entry(0)], info(1), create=True)
        store.delete("a")
        assert store.read("a") is None
        assert sorted(saved.id for saved in store.list()) == ["a/b", "ab", "b"]
        assert seqs(store, "ab") == [0]
        store.delete("a")  # deleting an unknown id does nothing
        # The id is free again: a new State may take it.
        store.write("a", [entry(0, "again")], info(1), create=True)
        record = store.read("a")
        assert record is not None
        assert [e["text"] for e in record.entries] == ["user: again"]

    def test_ids_are_kept_exactly_and_cannot_escape(self, store: Store) -> None:
        for number, state_id in enumerate(TRICKY_IDS):
            store.write(state_id, [entry(0, f"for {number}")], info(1), create=True)
        for number, state_id in enumerate(TRICKY_IDS):
            record = store.read(state_id)
            assert record is not None
            assert [e["text"] for e in record.entries] == [f"user: for {number}"]
        assert sorted(saved.id for saved in store.list()) == sorted(TRICKY_IDS)
        self.check_ids_stay_inside(store)
        for state_id in TRICKY_IDS:
            store.delete(state_id)
        assert store.list() == []

    @pytest.mark.parametrize("version", [3, 6])
    def test_a_state_of_another_format_is_refused_on_load(self, store: Store, version: int) -> None:
        store.write("old", [entry(0)], info(1, v=version), create=True)
        with pytest.raises(ValueError, match=f"format {version}"):
            store.load("old")

    def test_a_fork_at_any_entry_runs_on_and_leaves_the_source_as_it_was(
        self, store: Store
    ) -> None:
        source = a_run()
        store.save(source)
        before = _sorted(store.read("source"))
        for at in range(len(source.history)):
            forked = fork(store, "source", at, f"fork-{at}")
            loaded = store.load(f"fork-{at}")
            assert loaded == forked and loaded.forked_from == ForkPoint("source", at)
            copied = [e.to_dict() for e in loaded.history[: at + 1]]
            assert copied == before[0][: at + 1]
            # What was open at the fork's last entry is closed as after a crash.
            pending = {1: ("model_error",), 2: ("tool_result",), 5: ("model_error",)}.get(at, ())
            assert tuple(e.kind for e in loaded.history[at + 1 :]) == pending
            if at == 2:
                assert loaded.history[-1].outcome == "aborted"
            # It runs on: a new message, saved and loaded back.
            loaded.send("Now count the folders")
            store.save(loaded)
            assert store.load(f"fork-{at}").history[-1].text.endswith("Now count the folders")
        # A fork of a fork, and the source byte for byte as it was.
        again = fork(store, "fork-3", 3, "fork-of-fork")
        assert again.forked_from == ForkPoint("fork-3", 3)
        assert _sorted(store.read("source")) == before
