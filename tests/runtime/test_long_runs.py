"""Long runs: prompt caching, the context window kept, cost and budgets (issue #22).

Every test runs the real Agent through the real ``anthropic`` client against the
scripted Messages API (``model_server``), saving to a real FileStore.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from alpineagents import Agent, FileStore, Message, State, open_store, tool
from alpineagents.context import Compaction, UnknownModelWarning
from alpineagents.state import cleared_text
from alpineagents.testing import ModelServer, error, hold, reply, tool_use
from alpineagents.testing.script import Turn
from alpineagents.usage import Budget, cost_usd

MODEL = "claude-sonnet-5"
WAIT = 120.0  # seconds an awaited event may take on a loaded machine: a safety net, not a measure


# Every test's Agent (and child process) reaches the scripted model.
pytestmark = pytest.mark.usefixtures("model_endpoint")


@pytest.fixture
def store(tmp_path: Path) -> FileStore:
    return FileStore(tmp_path / "runs")


@tool
def fetch(page: int) -> str:
    """Fetches a page of about 2 KB.

    Args:
        page: which page
    """
    return f"page {page}: " + "lorem ipsum dolor sit amet " * 75


def agent(store: FileStore, **options: Any) -> Agent:
    options.setdefault("max_tokens", 1024)
    return Agent(MODEL, store, tools=[fetch], system="You fetch pages.", **options)


def pages(first: int, last: int) -> list[Any]:
    return [reply(tool_use("fetch", {"page": n}, id=f"toolu_{n}")) for n in range(first, last)]


def breakpoints(body: Any) -> list[str]:
    """Where a request body carries cache_control, as paths."""
    found: list[str] = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            if "cache_control" in node:
                found.append(path)
            for key, value in node.items():
                walk(value, f"{path}.{key}")
        elif isinstance(node, list):
            for index, value in enumerate(node):
                walk(value, f"{path}[{index}]")

    walk(body, "")
    return found


class TestPromptCaching:
    def test_requests_mark_tools_system_the_previous_end_and_their_own_end(
        self, store: FileStore, model_server: ModelServer
    ) -> None:
        model_server.add(*pages(0, 2), reply("Done."))
        assert agent(store).run(State("r", [Message.user("Fetch two pages")])) == "Done."
        last = model_server.requests[-1].body
        n = len(last["messages"])
        assert breakpoints(last) == [
            f".messages[{n - 3}].content[0]",  # the end of the request before
            f".messages[{n - 1}].content[0]",  # this request's own end
            ".system[0]",
            ".tools[0]",
        ]
        assert last["system"][0]["cache_control"] == {"type": "ephemeral"}
        # The first request has no request before it: three breakpoints.
        assert len(breakpoints(model_server.requests[0].body)) == 3

    def test_one_hour_ttl_and_off(self, store: FileStore, model_server: ModelServer) -> None:
        model_server.add(reply("One."), reply("Two."))
        agent(store, prompt_cache="1h").run(State("a", [Message.user("Hi")]))
        agent(store, prompt_cache=None).run(State("b", [Message.user("Hi")]))
        first, second = (r.body for r in model_server.requests)
        assert first["tools"][0]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
        assert breakpoints(second) == [] and second["system"] == "You fetch pages."
        with pytest.raises(ValueError, match="prompt_cache must be '5m', '1h' or None"):
            agent(store, prompt_cache="10m")  # type: ignore[arg-type]

    def test_a_resumed_run_sends_byte_for_byte_what_the_lost_one_would_have(
        self, store: FileStore, model_server: ModelServer
    ) -> None:
        # One run goes straight through; the other stops after two turns (as a lost pod
        # would after its last save) and a new Agent resumes it from the store.
        model_server.add(*pages(0, 4), reply("Done."))
        agent(store).run(State("straight", [Message.user("Fetch four pages")]))
        straight = [json.dumps(r.body) for r in model_server.requests]
        model_server.add(*pages(0, 2))
        stopped = State("resumed", [Message.user("Fetch four pages")])
        assert agent(store, max_turns=2).run(stopped) is None
        model_server.add(*pages(2, 4), reply("Done."))
        assert agent(store).run(store.load("resumed")) == "Done."
        resumed = [json.dumps(r.body) for r in model_server.requests[len(straight) :]]
        assert resumed == straight

    def test_a_long_run_bills_a_fraction_of_its_uncached_input(
        self, store: FileStore, model_server: ModelServer
    ) -> None:
        # The server bills as the API does: writes 1.25x, reads 0.1x, a 1,024-token minimum.
        model_server.add(*pages(0, 40), reply("Done."))
        state = State("billed", [Message.user("Fetch forty pages")])
        assert agent(store).run(state) == "Done."
        bill = model_server.bill
        assert bill.billed_fraction < 0.2
        assert state.usage["cache_read_input_tokens"] == bill.cache_read_input_tokens > 0
        assert state.usage["cache_creation_input_tokens"] == bill.cache_creation_input_tokens

    def test_a_resumed_runs_first_request_reads_the_lost_runs_cache(
        self, store: FileStore, model_server: ModelServer
    ) -> None:
        model_server.add(*pages(0, 10))
        assert agent(store, max_turns=10).run(State("cached", [Message.user("Go")])) is None
        model_server.add(reply("Done."))
        resumed = store.load("cached")
        assert agent(store).run(resumed) == "Done."
        # The resumed run's only request: its prompt is the lost run's last one plus a turn.
        usage = resumed.history[-1 if resumed.history[-1].kind == "model_reply" else -2].data
        first = usage["usage"]
        prompt = sum(first[k] for k in first if k != "output_tokens")
        assert first["cache_read_input_tokens"] >= 0.9 * prompt


class TestContextWindow:
    def test_older_results_are_cleared_from_requests_and_kept_in_the_history(
        self, store: FileStore, model_server: ModelServer
    ) -> None:
        model_server.add(*pages(0, 12), reply("Done."))
        run = agent(store, context_window=4096, compaction=Compaction(keep_results=2))
        state = State("clears", [Message.user("Fetch twelve pages")])
        assert run.run(state) == "Done."
        cleared = [e for e in state.history if e.kind == "cleared"]
        assert cleared, "a run past 3/4 of its window clears older results"
        # Clearing was enough: no turn was summarized away.
        assert all(e.kind != "compaction" for e in state.history)
        results = {e.data["call_id"]: e for e in state.history if e.kind == "tool_result"}
        assert all(e.data["content"].startswith("page ") for e in results.values())
        last = model_server.requests[-1].body
        sent = {
            b["tool_use_id"]: b["content"]
            for m in last["messages"]
            for b in m["content"]
            if isinstance(b, dict) and b.get("type") == "tool_result"
        }
        # The newest results go as they are; older ones as a placeholder naming their entry.
        assert sent["toolu_11"] == results["toolu_11"].data["content"]
        assert sent["toolu_0"] == cleared_text(results["toolu_0"].seq)
        assert store.load("clears") == state
        assert store.load("clears").messages == state.messages

    def test_a_prompt_the_api_refuses_as_too_long_is_compacted_and_sent_again(
        self, store: FileStore, model_server: ModelServer
    ) -> None:
        too_long = "prompt is too long: 250000 tokens > 200000 maximum"
        model_server.add(
            *pages(0, 4), error(400, too_long), reply("Summary: four pages."), reply("Done.")
        )
        state = State("refused", [Message.user("Fetch four pages")])
        assert agent(store).run(state) == "Done."
        kinds = [e.kind for e in state.history]
        # Measured at 250,000 tokens, clearing the oldest result is not enough: a summary.
        assert kinds.index("model_error") < kinds.index("cleared") < kinds.index("compaction")
        assert state.stopped == "answered"
        summary_request, last = (r.body for r in model_server.requests[-2:])
        assert "Summarize the conversation" in json.dumps(summary_request)
        assert last["messages"][0]["content"][0]["text"].endswith("Summary: four pages.")

    def test_the_newest_results_are_never_cleared(
        self, store: FileStore, model_server: ModelServer
    ) -> None:
        too_long = "prompt is too long: 250000 tokens > 200000 maximum"
        model_server.add(
            *pages(0, 4), error(400, too_long), reply("Summary: four pages."), reply("Done.")
        )
        state = State("kept", [Message.user("Fetch four pages")])
        assert agent(store, compaction=Compaction(keep_results=5)).run(state) == "Done."
        # Fewer results than keep_results: none cleared; a summary makes the room.
        kinds = [e.kind for e in state.history]
        assert "cleared" not in kinds and "compaction" in kinds

    def test_past_clearing_older_turns_are_summarized(
        self, store: FileStore, model_server: ModelServer
    ) -> None:
        # Three 2 KB results pass 0.8 of a 2,048-token window; nothing is cleared, so the
        # turns before the last are summarized.
        model_server.add(*pages(0, 3), reply("Summary: fetched pages 0 to 2."), reply("Done."))
        run = agent(
            store,
            max_tokens=256,
            context_window=2048,
            compaction=Compaction(trigger=0.8, target=0.5, keep_turns=1, clear_results=False),
        )
        state = State("summarizes", [Message.user("Fetch three pages")])
        assert run.run(state) == "Done."
        compaction = next(e for e in state.history if e.kind == "compaction")
        assert compaction.data["summary"] == "Summary: fetched pages 0 to 2."
        assert state.messages[0].text.startswith("Summary of the earlier conversation:")
        assert [m.role for m in state.messages] == ["user", "assistant", "user", "assistant"]
        last = model_server.requests[-1].body["messages"]
        assert last[1]["content"][0]["id"] == "toolu_2"  # the last turn is kept whole
        assert store.load("summarizes") == state

    def test_a_summary_answered_with_a_tool_call_is_asked_again_without_tools(
        self, store: FileStore, model_server: ModelServer
    ) -> None:
        model_server.add(
            *pages(0, 3),
            reply(tool_use("fetch", {"page": 9})),  # not a summary
            reply("Summary: pages 0 to 2."),
            reply("Done."),
        )
        run = agent(
            store,
            max_tokens=256,
            context_window=2048,
            compaction=Compaction(trigger=0.8, target=0.5, keep_turns=1, clear_results=False),
        )
        state = State("retried", [Message.user("Fetch three pages")])
        assert run.run(state) == "Done."
        again = model_server.requests[-2].body
        assert again["tool_choice"] == {"type": "none"}
        assert state.messages[0].text.endswith("Summary: pages 0 to 2.")

    def test_an_unknown_model_gets_a_warning_and_a_small_window(
        self, store: FileStore, model_server: ModelServer
    ) -> None:
        model_server.add(reply("Hi."))
        with pytest.warns(UnknownModelWarning, match="no known context window"):
            Agent("my-own-model", store, max_tokens=1024).run(State("m", [Message.user("Hi")]))


class TestCostAndBudget:
    def test_usage_has_four_numbers_and_each_reply_its_cost(
        self, store: FileStore, model_server: ModelServer
    ) -> None:
        model_server.add(*pages(0, 1), reply("Done."))
        state = State("cost", [Message.user("Fetch a page")])
        agent(store).run(state)
        assert set(state.usage) == {
            "input_tokens",
            "output_tokens",
            "cache_creation_input_tokens",
            "cache_read_input_tokens",
        }
        replies = [e for e in state.history if e.kind == "model_reply"]
        expected = sum(cost_usd(MODEL, e.data["usage"]) for e in replies)
        assert state.cost_usd == pytest.approx(expected) and state.cost_usd > 0
        loaded = store.load("cost")
        assert loaded.cost_usd == pytest.approx(state.cost_usd)
        assert loaded.usage == state.usage

    def test_a_run_at_its_budget_stops_saved_and_goes_on_when_raised(
        self, store: FileStore, model_server: ModelServer
    ) -> None:
        model_server.add(*pages(0, 3))
        state = State("budget", [Message.user("Fetch pages")])
        tight = agent(store, budget=Budget(max_output_tokens=1))
        assert tight.run(state) is None
        assert state.stopped == "budget_exceeded"
        stop = state.history[-1]
        assert stop.kind == "stop" and "output tokens reached the budget of 1" in stop.text
        asked = len(model_server.requests)
        assert asked == 1  # one reply passed the limit; no request after it
        model_server.add(*pages(1, 3), reply("Done."))
        loaded = store.load("budget")
        assert loaded.stopped == "budget_exceeded"
        assert agent(store, budget=Budget(max_output_tokens=10_000)).run(loaded) == "Done."

    def test_a_budget_already_passed_stops_the_run_before_any_request(
        self, store: FileStore, model_server: ModelServer
    ) -> None:
        state = State("broke", [Message.user("Hi")])
        assert agent(store, budget=Budget(max_cost_usd=0)).run(state) is None
        assert model_server.requests == []
        assert state.stopped == "budget_exceeded"
        assert "reached the budget of $0.0000" in state.history[-1].text
        with pytest.raises(ValueError, match=r"Budget\.max_cost_usd must be a number"):
            Budget(max_cost_usd=-1)


def test_no_warning_for_known_models(store: FileStore, model_server: ModelServer) -> None:
    model_server.add(reply("Hi."))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnknownModelWarning)
        agent(store).run(State("known", [Message.user("Hi")]))


class LongRunModel:
    """The model of a long run: a page a turn until ``turns`` pages, then "Done."; a
    summary when asked for one, the first of them held until the test kills its client."""

    def __init__(self, turns: int) -> None:
        self.turns = turns
        self.pages = 0
        self.summaries = 0
        self.held = threading.Event()

    def __call__(self, body: Mapping[str, Any]) -> Turn:
        if "Summarize the conversation" in json.dumps(body["messages"][-1]):
            self.summaries += 1
            summary = reply(f"Summary: pages 0 to {self.pages - 1} fetched.")
            if self.summaries == 1:
                self.held.set()
                return hold(summary)
            return summary
        if self.pages >= self.turns:
            return reply("Done.")
        self.pages += 1
        return reply(tool_use("fetch", {"page": self.pages - 1}))


@pytest.mark.parametrize("kind", ["file", "minio"])
def test_a_long_run_killed_in_the_middle_of_a_compaction_resumes_and_answers(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Suite scale: 300 turns of 2 KB results in an 8,000-token window clear older results
    # and summarize older turns several times (benchmarks/long_runs.py runs 2,000 turns in
    # 200,000). The first summary request is held; the run's process is killed meanwhile.
    turns, window = 300, 8_000
    model = LongRunModel(turns)
    if kind == "file":
        url = (tmp_path / "runs").as_uri()
    else:
        minio, bucket = request.getfixturevalue("minio"), request.getfixturevalue("minio_bucket")
        url = f"s3://{bucket}/runs?endpoint={minio.endpoint}&secure=false"
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", minio.access_key)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", minio.secret_key)
    with ModelServer(respond=model) as server:
        env = {**os.environ, **server.env}
        command = [sys.executable, "-m", "tests.agents.long_run_child", url, "long", str(window)]
        child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
        try:
            assert model.held.wait(WAIT), "the run never asked for a summary"
            child.kill()
        finally:
            child.wait()
        store = open_store(url)
        killed = store.load("long")
        resumed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        assert resumed.returncode == 0, resumed.stderr[-2000:]
        assert resumed.stdout.strip() == "Done."
        bill = server.bill
    state = store.load("long")
    kinds = [e.kind for e in state.history]
    # The summary of the killed process was never saved; the resumed one made its own.
    assert "compaction" not in [e.kind for e in killed.history]
    assert kinds.count("compaction") >= 2 and kinds.count("cleared") >= 2
    assert model.summaries == kinds.count("compaction") + 1
    # Every page was fetched once: no call ran twice, none was lost.
    results = [e.data["content"] for e in state.history if e.kind == "tool_result"]
    assert sorted(int(r.split(":")[0].split()[1]) for r in results) == list(range(turns))
    assert state.answer == "Done." and state.stopped == "answered"
    assert bill.largest_prompt < window
