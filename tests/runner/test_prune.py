"""``alpineagents prune`` on a FileStore, as a user types it (a real process): old ended
States go, young ones and those that can go on stay unless named, a State a process runs
is never pruned, ``--dry-run`` deletes nothing, and a mistake is one line."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from alpineagents import FileStore, Message, State
from alpineagents.liveness import holding_run
from alpineagents.runner import ExitCode
from tests.bench.runner_process import RunnerProcess, child_env


def saved(store: FileStore, state_id: str, age: timedelta, stop: str | None) -> None:
    """A State last updated ``age`` ago, stopped for ``stop`` (None: left open)."""
    state = State(state_id, [Message.user(f"job {state_id}")])
    if stop is not None:
        state.add("stop", f"stopped: {stop}", {"reason": stop})
    when = datetime.now(UTC) - age
    state.history[:] = [replace(entry, time=when) for entry in state.history]
    store.save(state)


def prune(folder: Path, *args: str) -> RunnerProcess:
    process = RunnerProcess(
        ["prune", "--store", str(folder), *args], workdir=folder.parent, env=child_env(None)
    )
    process.wait()
    return process


@pytest.fixture
def store(tmp_path: Path) -> FileStore:
    store = FileStore(tmp_path / "runs")
    month = timedelta(days=40)
    for state_id, age, stop in (
        ("old-answered", month, "answered"),
        ("old-error", month, "error"),
        ("old-max-turns", month, "max_turns"),
        ("old-interrupted", month, "interrupted"),
        ("old-waiting", month, "waiting_for_approval"),
        ("young-answered", timedelta(hours=1), "answered"),
        ("old-lost", month, None),
        ("old-running", month, None),
    ):
        saved(store, state_id, age, stop)
    with holding_run(store, "old-lost"):
        pass  # its process ran it and is gone: lost
    return store


def ids(store: FileStore) -> set[str]:
    return {info.id for info in store.list()}


def test_prune_deletes_old_ended_states_and_keeps_the_rest(store: FileStore) -> None:
    everything = ids(store)
    dry = prune(store.folder, "--older-than", "30d", "--dry-run")
    assert dry.process.returncode == 0, dry.stderr
    listed = [line.split()[0] for line in dry.stdout.splitlines()]
    assert sorted(listed) == ["old-answered", "old-error", "old-max-turns"]
    assert "would delete 3 State(s)" in dry.stderr
    assert ids(store) == everything  # a dry run deletes nothing

    pruned = prune(store.folder, "--older-than", "30d")
    assert pruned.process.returncode == 0, pruned.stderr
    assert "deleted 3 State(s)" in pruned.stderr
    assert ids(store) == everything - {"old-answered", "old-error", "old-max-turns"}


def test_prune_takes_the_statuses_named_and_never_a_running_state(store: FileStore) -> None:
    with holding_run(store, "old-running"):  # a process runs it now
        pruned = prune(
            store.folder,
            "--older-than", "1d12h",
            "--status", "interrupted,lost",
            "--status", "waiting_for_approval",
            "--status", "open",
        )  # fmt: skip
    assert pruned.process.returncode == 0, pruned.stderr
    gone = {line.split()[0] for line in pruned.stdout.splitlines()}
    assert gone == {"old-interrupted", "old-lost", "old-waiting"}
    assert ids(store) == {
        "old-answered",
        "old-error",
        "old-max-turns",
        "young-answered",
        "old-running",
    }


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--older-than", "30 days"], "alpineagents: --older-than takes an age like 30d, 12h"),
        (["--older-than", "30d", "--status", "done"], "alpineagents: --status done is not a status: use answered,"),
    ],
)  # fmt: skip
def test_a_mistake_in_prune_is_one_line_and_deletes_nothing(
    store: FileStore, args: list[str], expected: str
) -> None:
    everything = ids(store)
    refused = prune(store.folder, *args)
    assert refused.process.returncode == ExitCode.NOT_RETRYABLE
    assert refused.stderr.startswith(expected) and refused.stderr.count("\n") == 1
    assert ids(store) == everything
