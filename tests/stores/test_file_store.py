"""FileStore on disk: torn writes, ids that try to escape, appends of new entries only."""

from __future__ import annotations

from pathlib import Path

import pytest

from alpineagents import FileStore, Message, State


def saved_state(store: FileStore, state_id: str = "report", messages: int = 3) -> State:
    state = State(id=state_id, messages=[Message.user(f"message {n}") for n in range(messages)])
    store.save(state)
    return state


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
    assert history.read_bytes().count(b"\n") == 4


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
    assert history.read_bytes().count(b"\n") == 2


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
