"""Forking a saved run (``alpineagents.fork``, ``alpineagents fork``): a new State from the
first entries of another, edited, run on by the real Agent against the scripted model;
the source is untouched. Every store's share of it is in the conformance suite
(``StoreConformance.test_a_fork_at_any_entry_runs_on_and_leaves_the_source_as_it_was``).
"""

from __future__ import annotations

from pathlib import Path

import anthropic
import pytest

from alpineagents import (
    Agent,
    FileStore,
    ForkPoint,
    Message,
    State,
    StateExistsError,
    fork,
    tool,
)
from alpineagents.testing import ModelServer, reply
from alpineagents.testing.conformance import a_run
from tests.bench.runner_process import RunnerProcess, child_env

MODEL = "claude-sonnet-5"


@tool
def shell(command: str) -> str:
    """Runs a command.

    Args:
        command: the command
    """
    return f"ran {command}"


@pytest.fixture
def store(tmp_path: Path) -> FileStore:
    store = FileStore(tmp_path / "runs")
    store.save(a_run())
    return store


def test_a_fork_at_a_call_in_flight_runs_on_with_the_call_aborted_never_run(
    store: FileStore,
) -> None:
    forked = fork(store, "source", 2, "retry")  # the reply calling shell, no result yet
    # Usage and turns start from the source's at the fork: its one reply.
    assert forked.turns == 1 and forked.usage["input_tokens"] == 10
    with ModelServer([reply("Checked instead.")]) as server:
        client = anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0)
        agent = Agent(MODEL, store, tools=[shell], client=client)
        assert agent.run(forked) == "Checked instead."
        # The model was told the call may or may not have run; shell never ran here.
        (result,) = server.requests[0].body["messages"][-1]["content"]
        assert result["is_error"] and "may or may not have run" in result["content"]
    loaded = store.load("retry")
    assert loaded.forked_from == ForkPoint("source", 2)
    assert [e.outcome for e in loaded.history if e.kind == "tool_result"] == ["aborted"]


def test_a_fork_with_its_prompt_replaced_asks_the_new_question(store: FileStore) -> None:
    forked = fork(store, "source", 0, "folders", message="Count the folders")
    assert [m.text for m in forked.messages] == ["Count the folders"]
    with ModelServer([reply("Two folders.")]) as server:
        client = anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0)
        assert Agent(MODEL, store, client=client).run(forked) == "Two folders."
        (asked,) = server.requests[0].body["messages"]
        assert [block["text"] for block in asked["content"]] == ["Count the folders"]
    assert store.load("source").first_message == "Count the files"


def test_a_fork_with_a_tool_result_replaced_gives_the_model_the_new_result(
    store: FileStore,
) -> None:
    forked = fork(store, "source", 3, "other", results={"toolu_1": "a b c d e"})
    with ModelServer([reply("Five files.")]) as server:
        client = anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0)
        assert Agent(MODEL, store, client=client).run(forked) == "Five files."
        (result,) = server.requests[0].body["messages"][-1]["content"]
        assert result["content"] == "a b c d e" and not result.get("is_error")


@pytest.mark.parametrize(
    ("at", "kwargs", "error"),
    [
        (8, {}, "cannot fork 'source' at entry 8: it has entries 0 to 7"),
        (-1, {}, "cannot fork 'source' at entry -1: it has entries 0 to 7"),
        (2, {"message": "hi"}, "entry 2 of 'source' is a model_reply entry, not a user's message"),
        (1, {"results": {"toolu_1": "x"}}, "no result of call 'toolu_1' in entries 0 to 1"),
    ],
)
def test_a_fork_that_cannot_be_made_says_why_and_writes_nothing(
    store: FileStore, at: int, kwargs: dict[str, object], error: str
) -> None:
    with pytest.raises(ValueError, match="^" + error.replace("(", r"\(")):
        fork(store, "source", at, "nope", **kwargs)  # type: ignore[arg-type]
    assert [i.id for i in store.list()] == ["source"]


def test_a_fork_never_writes_over_a_state_that_exists(store: FileStore) -> None:
    store.save(State("taken", [Message.user("mine")]))
    with pytest.raises(StateExistsError):
        fork(store, "source", 3, "taken")
    assert store.load("taken").messages[0].text == "mine"
    with pytest.raises(LookupError, match="no saved State 'missing' to fork"):
        fork(store, "missing", 0, "new")


def test_alpineagents_fork_on_the_command_line(
    store: FileStore, tmp_path: Path, runners: list[RunnerProcess]
) -> None:
    command = RunnerProcess(
        ["fork", "source", "--at", "3", "--result", "toolu_1=none", "--store", str(store.folder)],
        workdir=tmp_path,
        env=child_env(None),
    )
    runners.append(command)
    assert command.wait() == 0, command.stderr
    assert command.stderr.startswith("forked source at entry 3 as source-fork-3 (4 entries)")
    assert store.load("source-fork-3").history[3].data["content"] == "none"
    again = RunnerProcess(
        ["fork", "source", "--at", "30", "--store", str(store.folder)],
        workdir=tmp_path,
        env=child_env(None),
    )
    runners.append(again)
    assert again.wait() == 65
    assert "it has entries 0 to 7" in again.stderr
