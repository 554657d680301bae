"""FileStore on disk: torn writes, ids that try to escape, appends of new entries only."""

from __future__ import annotations

from pathlib import Path

import pytest

from alpineagents import FileStore, Message, State


def saved_state(store: FileStore, state_id: str = "report", messages: int = 3) -> State:
    state = State(id=state_id, messages=[Message.user(f"message {n}") for n in range(messages)])
    store.save(state)
    return state


def entry_lines(history: Path) -> int:
    """Complete entry lines in a history file (its other lines carry the info)."""
    return sum(1 for line in history.read_bytes().split(b"\n")[:-1] if line.startswith(b'{"seq":'))


def test_a_torn_last_line_never_hides_or_corrupts_a_saved_entry(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    state = saved_state(store)
    history = next(tmp_path.glob("*/history.jsonl"))
    with history.open("ab") as file:  # a crash in the middle of writing entry 3
        file.write(b'{"seq":3,"kind":"message","ti')
    assert store.load("report") == state
    state.send("message 3")
    store.save(state)  # the next save cuts the torn line and appends whole entries
    loaded = store.load("report")
    assert loaded == state and [m.text for m in loaded.messages][-1] == "message 3"
    assert entry_lines(history) == 4


def test_each_save_appends_only_the_new_entries(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    state = saved_state(store, messages=1)
    history = next(tmp_path.glob("*/history.jsonl"))
    first = history.read_bytes()
    state.send("second")
    store.save(state)
    assert history.read_bytes().startswith(first)
    store.write(
        "report", [e.to_dict() for e in state.history], state.to_record().info
    )  # all sent again
    assert entry_lines(history) == 2


@pytest.mark.parametrize("state_id", ["../escape", "..", ".", "a/b", "/etc/passwd", "ünï cödé"])
def test_ids_cannot_escape_the_folder(tmp_path: Path, state_id: str) -> None:
    folder = tmp_path / "runs"
    store = FileStore(folder)
    saved_state(store, state_id)
    assert [p.parent for p in tmp_path.rglob("*.json*")] == [
        p.parent for p in folder.rglob("*.json*")
    ]
    assert all(p.parent.parent == folder for p in folder.rglob("history.jsonl"))
    assert store.load(state_id).id == state_id
    assert [s.id for s in store.list()] == [state_id]


def test_an_empty_or_too_long_id_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        State(id="")
    with pytest.raises(ValueError, match="too long"):
        saved_state(FileStore(tmp_path), "x" * 300)


def test_a_save_is_one_append_and_the_info_follows_across_rewrites(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    state = saved_state(store, messages=1)
    folder = next(tmp_path.glob("report"))
    info_json = (folder / "info.json").read_bytes()
    for n in range(400):  # past several rewrites of info.json (one per 64 KiB of lines)
        state.send(f"message {n}: " + "x" * 300)
        store.save(state)
        if n == 0:  # the common save appends its entry and touches nothing else
            assert (folder / "info.json").read_bytes() == info_json
    wanted = state.to_record().info
    for reader in (store, FileStore(tmp_path)):  # this store, and a new one (a new process)
        record = reader.read("report")
        assert record is not None and record.info == wanted
        assert reader.list()[0].entries == len(state.history) == wanted["entries"]
    assert FileStore(tmp_path).load("report") == state


def test_an_info_rewrite_without_its_mark_reads_the_same(tmp_path: Path) -> None:
    # A crash after info.json was rewritten but before its mark line reached the disk.
    store = FileStore(tmp_path)
    state = saved_state(store, messages=1)
    for n in range(300):
        state.send(f"message {n}: " + "x" * 300)
        store.save(state)
    history = tmp_path / "report" / "history.jsonl"
    lines = history.read_bytes().split(b"\n")
    marks = [i for i, line in enumerate(lines) if line == b'{"store":"info.json"}']
    assert len(marks) >= 2  # the one at create, and the rewrites since
    del lines[marks[-1]]
    history.write_bytes(b"\n".join(lines))
    fresh = FileStore(tmp_path)
    record = fresh.read("report")
    assert record is not None and record.info == state.to_record().info
    assert fresh.list()[0].entries == len(state.history)
    state.send("after the crash")
    fresh.save(state)
    assert FileStore(tmp_path).load("report") == state


def test_read_since_reads_the_tail_and_gives_what_a_whole_read_gives(tmp_path: Path) -> None:
    # Saves whose info changes otherwise than the entries say (info lines), past several
    # rewrites of info.json (marks), then a torn last line: what a follower reads from any
    # seq on is what a whole read holds from there, with the same info.
    store = FileStore(tmp_path)
    state = saved_state(store, messages=1)
    for n in range(400):
        state.send(f"message {n}: " + "x" * 300)
        state.send(f"and {n}")
        record = state.to_record()
        store.write("report", record.entries, {**record.info, "turns": n})
    with (tmp_path / "report" / "history.jsonl").open("ab") as file:
        file.write(b'{"seq":801,"kind":"mess')
    whole = FileStore(tmp_path).read("report")
    assert whole is not None and len(whole.entries) == 801 and whole.info["turns"] == 399
    for seq in (0, 1, 400, 790, 800, 801, 900):
        since = FileStore(tmp_path).read_since("report", seq)
        assert since is not None
        assert since.entries == whole.entries[seq:]
        assert since.info == whole.info
    assert FileStore(tmp_path).read_since("nothing", 5) is None


def test_a_state_deleted_and_created_again_elsewhere_is_saved_where_it_now_is(
    tmp_path: Path,
) -> None:
    # This store keeps the history it saved open between saves; another store object (or
    # process) deletes the State, then creates a new one under the same id. A save through
    # the first store must see the new history, never write into the deleted one.
    store = FileStore(tmp_path)
    old = saved_state(store, messages=2)
    other = FileStore(tmp_path)
    other.delete("report")
    old.send("late")
    with pytest.raises(LookupError):
        store.save(old)  # the id is gone: nothing is written where no one would read it
    new = saved_state(other, messages=1)
    new.send("from the second store")
    store.save(new)  # a State of this id the first store never saw: appended to the new one
    assert FileStore(tmp_path).load("report") == new


def test_entries_json_and_orjson_write_differently_load_back_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With the fast extra, lines are written and read with orjson and, where it would not
    # do what json does, with json: NaN (orjson would write null), integers past 64 bits,
    # lone surrogates, non-ASCII text, a None. A history written either way reads the same
    # either way.
    from alpineagents.store import jsonl

    odd: dict[str, object] = {
        "nan": float("nan"),
        "big": 2**70,
        "surrogate": "\udc80",
        "text": "naïve — 東京 🚀",
        "none": None,
        "float": 0.1,
    }
    for writer, reader in [(True, True), (True, False), (False, True)]:
        folder = tmp_path / f"{writer}-{reader}"
        monkeypatch.setattr(jsonl, "orjson", jsonl.orjson if writer else None)
        state = State("odd", [Message.user("start")])
        state.add("tools", "listed", {"source": "s", "tools": [], "odd": odd})
        FileStore(folder).save(state)
        state.send("plain, naïve — 東京 🚀")  # a line orjson writes (as UTF-8)
        FileStore(folder).save(state)
        monkeypatch.setattr(jsonl, "orjson", jsonl.orjson if reader else None)
        loaded = FileStore(folder).load("odd")
        data = loaded.history[1].data["odd"]
        assert data["nan"] != data["nan"]  # NaN is kept as NaN, not null
        assert {k: v for k, v in data.items() if k != "nan"} == {
            k: v for k, v in odd.items() if k != "nan"
        }
        assert [m.text for m in loaded.messages] == ["start", "plain, naïve — 東京 🚀"]
        assert len(loaded.history) == len(state.history)
