"""The persistence contract, section by section of survive-crashes-and-restarts.md.

Every test runs against each store of the ``store`` fixture (FileStore, the spec's
MemoryStore, MinioStore, ...) with the real anthropic client and the scripted model.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import stat
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from alpineagents import Agent, FileStore, Message, Permissions, State, Store, tool
from alpineagents.context import Compaction
from alpineagents.state import UNKNOWN_RESULT
from alpineagents.testing import ModelServer, error, hold, reply, tool_use
from tests.agents import interrupt_child
from tests.bench import forked
from tests.bench.stores import AsyncMemory, ChildStore
from tests.runtime.contract_tools import NO_SPACE, Watched, fail_once, has_kind

STATE_ID = "nightly-report"

MODEL = "claude-sonnet-5"
WAIT = 120.0  # seconds an awaited event may take on a loaded machine: a safety net, not a measure


# Every test's Agent (and child process) reaches the scripted model.
pytestmark = pytest.mark.usefixtures("model_endpoint")


@pytest.fixture
def watched(store: Store) -> Watched:
    return Watched(store)


def agent_for(store: Store, *tools: Any, **options: Any) -> Agent:
    options.setdefault("max_tokens", 1024)
    return Agent(model=MODEL, store=store, tools=tools, **options)


def new_state(state_id: str = "nightly-report", text: str = "Write the nightly report") -> State:
    return State(id=state_id, messages=[Message.user(text)])


def assert_closed_at_the_last_saved_time(loaded: State, kinds: list[str]) -> None:
    """``load`` closed the open turn with ``kinds``, stamped with the last saved entry's time."""
    saved, closing = loaded.history[: loaded.saved_entries], loaded.history[loaded.saved_entries :]
    assert [e.kind for e in closing] == kinds
    assert {e.time for e in closing} == {saved[-1].time}


@tool
def lookup(key: str) -> str:
    """Looks a key up."""
    return f"value of {key}"


# ------------------------------------------------------------------ When the Agent saves
class TestWhenTheAgentSaves:
    def test_save_points_of_a_run_with_one_tool(
        self, watched: Watched, model_server: ModelServer
    ) -> None:
        model_server.add(
            reply("Checking.", tool_use("lookup", {"key": "a"})), reply("Done: value of a.")
        )
        state = new_state()
        assert agent_for(watched, lookup).run(state) == "Done: value of a."
        assert watched.writes == [
            (["message"], True),  # run starts: the new State, created
            (["model_request"], False),  # before think
            (["model_reply"], False),  # after think
            (["tool_result"], False),  # after the tool result, right away
            (["model_request"], False),
            (["model_reply"], False),
            (["stop"], False),  # run ends
        ]
        assert watched.saved_kinds(state.id) == [e.kind for e in state.history]

    def test_a_save_writes_nothing_when_nothing_changed(
        self, watched: Watched, model_server: ModelServer
    ) -> None:
        model_server.add(reply("Hello."))
        state = new_state()
        agent_for(watched).run(state)
        before = len(watched.writes)
        watched.save(state)
        asyncio.run(watched.asave(state))
        assert len(watched.writes) == before

    def test_store_save_writes_changes_made_outside_the_agent(
        self, store: Store, model_server: ModelServer
    ) -> None:
        model_server.add(reply("Hello."))
        state = new_state()
        agent_for(store).run(state)
        state.send("One more thing")
        store.save(state)
        assert store.load(state.id).messages[-1] == Message.user("One more thing")

    def test_each_tool_result_is_saved_while_other_tools_of_the_turn_still_run(
        self, store: Store, model_server: ModelServer
    ) -> None:
        seen_while_running: list[list[str]] = []

        @tool
        def quick() -> str:
            """Returns at once."""
            return "quick result"

        @tool
        def long() -> str:
            """Waits until the quick result is in the store."""
            deadline = time.monotonic() + WAIT
            while time.monotonic() < deadline:
                record = store.read("nightly-report")
                kinds = (
                    [e["data"].get("name") for e in record.entries if e["kind"] == "tool_result"]
                    if record
                    else []
                )
                if "quick" in kinds:
                    seen_while_running.append(kinds)
                    return "long result"
                time.sleep(0.01)
            return "quick result never saved"

        model_server.add(reply(tool_use("long"), tool_use("quick")), reply("Both done."))
        agent_for(store, quick, long).run(new_state())
        assert seen_while_running == [["quick"]]

    def test_permission_records_are_saved_before_any_tool_of_the_turn_runs(
        self, store: Store, model_server: ModelServer
    ) -> None:
        saved_at_tool_start: list[list[str]] = []

        @tool
        def read_mail() -> str:
            """Reads mail."""
            record = store.read("nightly-report")
            assert record is not None
            saved_at_tool_start.append([e["kind"] for e in record.entries])
            return "no mail"

        @tool
        def send_mail() -> str:
            """Sends mail."""
            return "sent"

        model_server.add(
            reply(tool_use("read_mail"), tool_use("send_mail")), reply("Read, not sent.")
        )
        agent = agent_for(
            store,
            read_mail,
            send_mail,
            permissions=Permissions(refuse=["send_mail"], ask=["read_mail"]),
            ask=lambda call: True,
        )
        state = new_state()
        agent.run(state)
        assert saved_at_tool_start and "permission" in saved_at_tool_start[0]
        refused = [e for e in state.history if e.kind == "tool_result" and e.outcome == "refused"]
        assert [e.data["name"] for e in refused] == ["send_mail"]
        assert "tool_result" in saved_at_tool_start[0]  # the refusal, before read_mail ran


# ------------------------------------------------------------------ If the process stops
class TestIfTheProcessStops:
    """Loading a State saved mid-turn (the real-process kills are in test_crash.py)."""

    def test_load_replays_exactly_what_was_saved_and_twice_gives_the_same_state(
        self, store: Store, model_server: ModelServer
    ) -> None:
        model_server.add(reply("Looking.", tool_use("lookup", {"key": "k"})), reply("Done."))
        state = new_state()
        agent_for(store, lookup).run(state)
        first, second = store.load(state.id), store.load(state.id)
        assert first == second == state
        assert first.messages == state.messages
        assert first.answer == "Done." and first.stopped == "answered"

    def test_the_error_of_entries_is_none_after_loading_and_text_keeps_it(
        self, store: Store, model_server: ModelServer
    ) -> None:
        @tool
        def broken() -> str:
            """Always fails."""
            raise ValueError("disk on fire")

        model_server.add(reply(tool_use("broken")), reply("It failed."))
        state = new_state()
        agent_for(store, broken).run(state)
        live = next(e for e in state.history if e.kind == "tool_result")
        loaded = next(e for e in store.load(state.id).history if e.kind == "tool_result")
        assert isinstance(live.error, ValueError) and loaded.error is None
        assert loaded.outcome == "error" and loaded.text == "ValueError: disk on fire"

    def test_a_state_loaded_twice_from_a_save_mid_tool_is_the_same_state(
        self, store: Store, model_server: ModelServer
    ) -> None:
        loads: list[State] = []

        @tool
        def check() -> str:
            """Loads the State twice while this call runs (its result is not saved yet)."""
            loads.extend([store.load("nightly-report"), store.load("nightly-report")])
            return "checked"

        model_server.add(reply(tool_use("check", id="toolu_check")), reply("Checked."))
        agent_for(store, check).run(new_state())
        first, second = loads
        assert first == second
        assert_closed_at_the_last_saved_time(first, ["tool_result"])

    def test_a_state_loaded_twice_from_a_save_mid_request_is_the_same_state(
        self, store: Store, model_server: ModelServer
    ) -> None:
        model_server.add(hold(reply("Done.")))
        state = new_state()
        running = threading.Thread(target=agent_for(store).run, args=(state,))
        running.start()
        try:
            model_server.wait_for_requests(1, timeout=WAIT)
            first, second = store.load(state.id), store.load(state.id)
        finally:
            model_server.release()
            running.join(WAIT)
        assert first == second
        assert_closed_at_the_last_saved_time(first, ["model_error"])
        assert state.answer == "Done."


# ------------------------------------------------------------------ Stop cleanly on SIGTERM
class TestExceptionsEndTheRunTheUsualWay:
    def test_sys_exit_in_a_tool_closes_running_calls_and_saves(
        self, store: Store, model_server: ModelServer
    ) -> None:
        started = threading.Event()

        @tool
        def blocking() -> str:
            """Blocks forever."""
            started.set()
            threading.Event().wait()
            return "never"

        @tool
        async def leave() -> str:
            """Exits the process."""
            await asyncio.to_thread(started.wait)
            sys.exit(3)

        model_server.add(reply(tool_use("blocking"), tool_use("leave")))
        state = new_state()
        with pytest.raises(SystemExit) as exit_info:
            agent_for(store, blocking, leave).run(state)
        assert exit_info.value.code == 3
        loaded = store.load(state.id)
        results = [e for e in loaded.history if e.kind == "tool_result"]
        assert {(e.data["name"], e.outcome, e.text) for e in results} == {
            ("blocking", "aborted", "(aborted: SystemExit)"),
            ("leave", "aborted", "(aborted: SystemExit)"),
        }
        assert loaded.stopped == "interrupted"

    def test_a_model_error_propagates_and_the_request_is_taken_back(
        self, store: Store, model_server: ModelServer
    ) -> None:
        import anthropic

        model_server.add(error(400, "bad request"))
        state = new_state()
        with pytest.raises(anthropic.BadRequestError):
            agent_for(store).run(state)
        loaded = store.load(state.id)
        assert [e.kind for e in loaded.history] == [
            "message",
            "model_request",
            "model_error",
            "stop",
        ]
        assert loaded.history[2].text.startswith("BadRequestError: ")
        assert loaded.messages == [Message.user("Write the nightly report")]

    def test_arun_is_cancellable_like_sigterm(
        self, store: Store, model_server: ModelServer
    ) -> None:
        model_server.add(hold())

        async def scenario() -> State:
            state = new_state()
            task = asyncio.create_task(agent_for(store).arun(state))
            await asyncio.to_thread(model_server.wait_for_requests, 1, WAIT)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return state

        state = asyncio.run(scenario())
        model_server.release()
        loaded = store.load(state.id)
        assert [(e.kind, e.text) for e in loaded.history[2:]] == [
            ("model_error", "(aborted: CancelledError)"),
            ("stop", "stopped: CancelledError: "),
        ]

    def test_transient_model_errors_are_retried_before_think_fails(
        self, store: Store, model_server: ModelServer
    ) -> None:
        from alpineagents.model import Retry

        model_server.add(error(529), error(429, retry_after=0), error(500), reply("Made it."))
        state = new_state()
        agent = agent_for(store, retry=Retry(attempts=4, first_delay=0.01))
        assert agent.run(state) == "Made it."
        assert [e.kind for e in state.history].count("model_error") == 0
        assert len(model_server.requests) == 4


# ------------------------------------------------------------------ Ctrl+C at every instant
# A real SIGINT to a real child process, paused at each instant of a run's first moments
# (tests/agents/interrupt_child.py, forked from a server that has imported the library).
# Later instants, at random, are in tests/runtime/test_campaign.py.
FIRST_MOMENTS = ["run", "client", "save", "write", "written"]


def ctrl_c_at(where: ChildStore, model_server: ModelServer, instant: str, mode: str) -> Any:
    """Run a child to ``instant``, send it SIGINT there, and return its report."""
    model_server.add(reply("Hello."))
    ours, theirs = multiprocessing.Pipe()
    env = {**model_server.env, **where.env}
    child = forked.start(interrupt_child.main, theirs, where.url, STATE_ID, instant, mode, env=env)
    theirs.close()
    try:
        assert ours.poll(WAIT), f"the child did not reach {instant!r}"
        paused = ours.recv()
        assert paused == ("at", instant), f"the child did not pause at {instant!r}: {paused}"
        os.kill(child.pid or 0, signal.SIGINT)
        ours.send("go")
        assert ours.poll(WAIT), "the child sent no report"
        kind, report = ours.recv()
        assert kind == "report", report
        child.join(WAIT)
    finally:
        if child.is_alive():
            child.kill()
            child.join()
    return report


def assert_saved_and_closed(report: Any, store: Store, where: ChildStore) -> None:
    """The run raised KeyboardInterrupt, and its whole State is saved with nothing open."""
    assert report["raised"] == "KeyboardInterrupt"
    assert report["loaded"] is not None, f"nothing was saved: {report}"
    assert report["saved"] == len(report["kinds"]), f"not all of it was saved: {report}"
    assert report["loaded"]["same"] and report["loaded"]["closing"] == 0, report
    assert report["kinds"][-1] == "stop" and report["stopped"] == "interrupted", report
    if where.url != "memory":  # the child's MemoryStore died with it; the others outlive it
        assert [e.kind for e in store.load(STATE_ID).history] == report["kinds"]


class TestCtrlCInTheFirstMoments:
    """Ctrl+C ends the run the usual way at every instant from the call of run/arun."""

    @pytest.mark.parametrize("mode", ["run", "arun"])
    @pytest.mark.parametrize("instant", FIRST_MOMENTS)
    def test_ctrl_c_leaves_the_state_saved_with_its_calls_closed(
        self,
        store: Store,
        child_store: ChildStore,
        model_server: ModelServer,
        instant: str,
        mode: str,
    ) -> None:
        report = ctrl_c_at(child_store, model_server, instant, mode)
        assert_saved_and_closed(report, store, child_store)

    @pytest.mark.parametrize("mode", ["run", "arun"])
    def test_ctrl_c_during_the_first_fsync_of_a_filestore(
        self, tmp_path: Path, model_server: ModelServer, mode: str
    ) -> None:
        where = ChildStore(f"file://{tmp_path / 'runs'}", {})
        report = ctrl_c_at(where, model_server, "fsync", mode)
        assert_saved_and_closed(report, FileStore(tmp_path / "runs"), where)


# ------------------------------------------------------------------ Sending while it runs
class TestSendingWhileItRuns:
    """``state.send`` returns once the message is saved when a run is live (README)."""

    def test_send_returns_once_the_message_is_saved(
        self, watched: Watched, model_server: ModelServer
    ) -> None:
        # A slow store: today a send that only schedules its save returns long before it.
        watched.before_write = lambda entries: (
            time.sleep(0.5) if has_kind("waiting")(entries) else None
        )
        state = new_state()
        saved_when_send_returned: list[list[str]] = []

        @tool
        def work() -> str:
            """Works; meanwhile the person sends a message."""
            state.send("Also add the weather.")
            saved_when_send_returned.append(watched.saved_kinds(state.id))
            return "worked"

        model_server.add(reply(tool_use("work")), reply("Done, with the weather."))
        agent_for(watched, work).run(state)
        assert saved_when_send_returned[0][-1] == "waiting"
        assert state.messages[-2] == Message.user("Also add the weather.")

    def test_asend_returns_once_the_message_is_saved(
        self, watched: Watched, model_server: ModelServer
    ) -> None:
        watched.before_write = lambda entries: (
            time.sleep(0.5) if has_kind("waiting")(entries) else None
        )
        state = new_state()
        saved_when_send_returned: list[list[str]] = []

        @tool
        async def work() -> str:
            """Works; meanwhile the person sends a message."""
            await state.asend("Also add the weather.")
            saved_when_send_returned.append(watched.saved_kinds(state.id))
            return "worked"

        model_server.add(reply(tool_use("work")), reply("Done, with the weather."))
        asyncio.run(agent_for(watched, work).arun(state))
        assert saved_when_send_returned[0][-1] == "waiting"

    def test_send_on_the_runs_own_event_loop_says_to_use_asend(
        self, store: Store, model_server: ModelServer
    ) -> None:
        state = new_state()

        @tool
        async def work() -> str:
            """Calls the blocking send from async code."""
            state.send("Also this")
            return "unreachable"

        model_server.add(reply(tool_use("work")), reply("It failed."))
        agent_for(store, work).run(state)
        result = next(e for e in state.history if e.kind == "tool_result")
        assert result.outcome == "error" and "await state.asend(" in result.text
        assert state.waiting == [] and "Also this" not in str(store.read(state.id))

    def test_a_send_whose_save_fails_raises_it_and_the_next_save_writes_the_message(
        self, watched: Watched, model_server: ModelServer
    ) -> None:
        watched.fail_when = fail_once(NO_SPACE, has_kind("waiting"))
        state = new_state()
        raised: list[BaseException] = []

        @tool
        def work() -> str:
            """Sends a message the store fails to save."""
            try:
                state.send("Also add the weather.")
            except OSError as error:
                raised.append(error)
            return "worked"

        model_server.add(reply(tool_use("work")), reply("Done."))
        agent_for(watched, work).run(state)
        assert raised == [NO_SPACE]
        assert Message.user("Also add the weather.") in watched.load(state.id).messages


# ------------------------------------------------------------------ If saving fails
class TestIfSavingFails:
    def test_in_a_good_run_the_store_exception_is_raised(
        self, watched: Watched, model_server: ModelServer
    ) -> None:
        model_server.add(reply("Hello."))
        watched.fail_when = fail_once(NO_SPACE, has_kind("model_reply"))
        state = new_state()
        with pytest.raises(OSError) as raised:
            agent_for(watched).run(state)
        assert raised.value is NO_SPACE
        # Nothing that failed to save is lost: the next save writes it.
        watched.save(state)
        assert watched.load(state.id).answer == "Hello."

    def test_in_a_failing_run_the_original_is_raised_with_a_note(
        self, watched: Watched, model_server: ModelServer
    ) -> None:
        import anthropic

        from alpineagents.model import Retry

        model_server.add(error(429, retry_after=0))
        watched.fail_when = lambda entries: NO_SPACE if has_kind("model_error")(entries) else None
        state = new_state()
        with pytest.raises(anthropic.RateLimitError) as raised:
            agent_for(watched, retry=Retry(attempts=1, max_wait=0)).run(state)
        assert raised.value.__notes__ == [
            "saving the state also failed: OSError: [Errno 28] No space left on device"
        ]
        assert [e.kind for e in state.history][-2:] == ["model_error", "stop"]
        watched.fail_when = lambda entries: None
        watched.save(state)
        assert watched.load(state.id) == state

    def test_ctrl_c_while_saving_is_raised_instead_of_the_original(
        self, watched: Watched, model_server: ModelServer
    ) -> None:
        model_server.add(error(400))
        watched.fail_when = fail_once(KeyboardInterrupt(), has_kind("model_error"))
        with pytest.raises(KeyboardInterrupt):
            agent_for(watched).run(new_state())

    def test_a_failed_save_after_one_tool_result_does_not_stop_the_other_tools(
        self, watched: Watched, model_server: ModelServer
    ) -> None:
        first_done = threading.Event()
        ran: list[str] = []

        @tool
        def first() -> str:
            """Returns first."""
            ran.append("first")
            first_done.set()
            return "one"

        @tool
        def second() -> str:
            """Returns after first."""
            first_done.wait(WAIT)
            ran.append("second")
            return "two"

        model_server.add(reply(tool_use("first"), tool_use("second")), reply("Both."))
        watched.fail_when = fail_once(NO_SPACE, has_kind("tool_result"))
        state = new_state()
        assert agent_for(watched, first, second).run(state) == "Both."
        assert sorted(ran) == ["first", "second"]
        # The save at the end of use_tools wrote the result whose own save failed.
        loaded = watched.load(state.id)
        assert sorted(e.data["name"] for e in loaded.history if e.kind == "tool_result") == [
            "first",
            "second",
        ]
        assert loaded == state

    def test_the_save_at_the_end_of_use_tools_raises_if_it_fails(
        self, watched: Watched, model_server: ModelServer
    ) -> None:
        model_server.add(reply(tool_use("lookup", {"key": "x"})))
        watched.fail_when = lambda entries: NO_SPACE if has_kind("tool_result")(entries) else None
        state = new_state()
        with pytest.raises(OSError):
            agent_for(watched, lookup).run(state)
        assert [e.outcome for e in state.history if e.kind == "tool_result"] == ["ok"]


# ------------------------------------------------------------------ Rules
class TestRules:
    def test_a_state_runs_only_with_the_store_it_is_saved_in(
        self, store: Store, tmp_path: Path, model_server: ModelServer
    ) -> None:
        model_server.add(reply("Hello."))
        state = new_state()
        agent_for(store).run(state)
        with pytest.raises(ValueError, match="saved in one store"):
            agent_for(FileStore(tmp_path / "other")).run(store.load(state.id))
        assert len(model_server.requests) == 1

    def test_two_filestores_for_one_folder_are_the_same_store(
        self, tmp_path: Path, model_server: ModelServer
    ) -> None:
        model_server.add(reply("Hello."), reply("Again."))
        state = new_state()
        agent_for(FileStore(tmp_path / "runs")).run(state)
        state.send("And again?")
        assert agent_for(FileStore(str(tmp_path / "runs") + "/")).run(state) == "Again."

    def test_a_new_state_with_a_taken_id_is_refused_before_any_model_request(
        self, store: Store, model_server: ModelServer
    ) -> None:
        model_server.add(reply("Hello."))
        agent_for(store).run(new_state())
        saved = store.read("nightly-report")
        with pytest.raises(ValueError):
            agent_for(store).run(new_state(text="Something else"))
        assert len(model_server.requests) == 1
        assert store.read("nightly-report") == saved

    @pytest.mark.parametrize("version", [3, 6, None])
    def test_other_format_versions_are_refused(self, store: Store, version: int | None) -> None:
        state = new_state()
        store.save(state)
        record = store.read(state.id)
        assert record is not None
        info = dict(record.info, v=version)
        store.delete(state.id)
        store.write(state.id, record.entries, info, create=True)
        with pytest.raises(ValueError, match=f"format {version!r}"):
            store.load(state.id)

    def test_a_format_4_state_loads_and_is_saved_on_as_format_5(
        self, tmp_path: Path, model_server: ModelServer
    ) -> None:
        import shutil

        shutil.copytree(Path(__file__).parent / "fixtures" / "format4", tmp_path / "runs")
        store = FileStore(tmp_path / "runs")
        state = store.load("weekly-digest")
        assert state.parent_id is None and state.answer == "Three PRs merged this week."
        state.send("And last week?")
        model_server.add(reply("Two."))
        assert agent_for(store).run(state) == "Two."
        record = store.read("weekly-digest")
        assert record is not None and record.info["v"] == 5

    def test_filestore_files_are_readable_only_by_their_owner(
        self, tmp_path: Path, model_server: ModelServer
    ) -> None:
        model_server.add(reply("Hello."))
        folder = tmp_path / "runs"
        agent_for(FileStore(folder)).run(new_state())
        modes = {
            p.relative_to(folder).as_posix(): stat.S_IMODE(p.stat().st_mode)
            for p in folder.rglob("*")
        }
        assert modes and all(
            mode == (0o700 if (folder / p).is_dir() else 0o600) for p, mode in modes.items()
        )
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700

    def test_images_in_tool_results_are_saved_as_base64(
        self, store: Store, model_server: ModelServer
    ) -> None:
        pixel = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="

        @tool
        def screenshot() -> list[dict[str, Any]]:
            """Takes a screenshot."""
            return [
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": pixel},
                }
            ]

        model_server.add(reply(tool_use("screenshot")), reply("A single pixel."))
        state = new_state()
        agent_for(store, screenshot).run(state)
        record = store.read(state.id)
        assert record is not None
        result = next(e for e in record.entries if e["kind"] == "tool_result")
        assert result["data"]["content"][0]["source"]["data"] == pixel
        sent = model_server.requests[1].body["messages"][-1]["content"][0]
        assert sent["content"][0]["source"]["data"] == pixel


# ------------------------------------------------------------------ List and delete
class TestListAndDelete:
    def test_list_shows_each_state_most_recent_first_and_delete_removes_one(
        self, store: Store, model_server: ModelServer
    ) -> None:
        model_server.add(reply("One."), reply("Two."))
        agent_for(store).run(new_state("first", "First task"))
        agent_for(store).run(new_state("review-pr-42", "Review PR 42"))
        listed = store.list()
        assert [(s.id, s.first_message, s.stopped, s.parent_id) for s in listed] == [
            ("review-pr-42", "Review PR 42", "answered", None),
            ("first", "First task", "answered", None),
        ]
        store.delete("review-pr-42")
        assert [s.id for s in store.list()] == ["first"]
        with pytest.raises(LookupError):
            store.load("review-pr-42")

    def test_subagents_are_states_of_their_own_kept_when_the_parent_is_deleted(
        self, store: Store, model_server: ModelServer
    ) -> None:
        researcher = agent_for(store, lookup)
        lead = agent_for(store, researcher.as_tool("research", "Researches a question"))
        model_server.add(
            reply(tool_use("research", {"task": "Find the numbers"}, id="toolu_research1")),
            reply("The numbers are 1, 2, 3."),  # the subagent's answer
            reply("Report: 1, 2, 3."),
        )
        state = new_state()
        assert lead.run(state) == "Report: 1, 2, 3."
        children = [s for s in store.list() if s.parent_id == "nightly-report"]
        assert [c.id for c in children] == ["nightly-report.toolu_research1"]
        assert [s.id for s in store.list() if s.parent_id is None] == ["nightly-report"]
        store.delete("nightly-report")
        assert store.load(children[0].id).answer == "The numbers are 1, 2, 3."


# ------------------------------------------------------------------ Write your own store
class TestWriteYourOwnStore:
    def test_an_async_only_store_runs_with_arun_and_run_says_so(
        self, model_server: ModelServer
    ) -> None:
        store = AsyncMemory()
        with pytest.raises(TypeError, match=r"async-only.*arun"):
            agent_for(store).run(new_state())
        model_server.add(reply("Hello."))
        assert asyncio.run(agent_for(store).arun(new_state())) == "Hello."
        assert asyncio.run(store.aload("nightly-report")).answer == "Hello."
        with pytest.raises(TypeError, match="async-only"):
            store.load("nightly-report")

    def test_a_sync_store_works_with_arun(self, store: Store, model_server: ModelServer) -> None:
        model_server.add(reply("Hello."))
        assert asyncio.run(agent_for(store).arun(new_state())) == "Hello."
        assert store.load("nightly-report").answer == "Hello."


# ------------------------------------------------------------------ Beyond the page: steps
class TestSteps:
    def test_compact_replaces_older_messages_and_history_keeps_everything(
        self, store: Store, model_server: ModelServer
    ) -> None:
        model_server.add(reply("First answer. " * 300))
        state = new_state()
        agent = agent_for(store, context_window=1024, compaction=Compaction(keep_turns=1))
        agent.run(state)
        state.send("Second question")
        model_server.add(
            reply("Summary: asked for the report, got a long answer."), reply("Second answer.")
        )
        assert agent.run(state) == "Second answer."
        assert state.messages[0].text.startswith("Summary of the earlier conversation:")
        assert [e.kind for e in state.history].count("compaction") == 1
        assert store.load(state.id) == state
        last = model_server.requests[-1].body["messages"]
        assert "Summary: asked" in last[0]["content"][0]["text"]

    def test_each_request_sends_the_conversation_as_it_is_also_after_a_compaction(
        self, store: Store, model_server: ModelServer
    ) -> None:
        # The Agent extends its last request's messages instead of converting the whole
        # conversation again each step; a compaction in the middle of a run must start over.
        model_server.add(reply("Part 0: " + "x" * 600))
        state = new_state()
        agent = agent_for(
            store,
            lookup,
            prompt_cache=None,
            context_window=1024,
            compaction=Compaction(clear_results=False, keep_turns=1),
        )
        agent.run(state)
        state.send("Next question")
        model_server.add(
            reply("Part 1: " + "x" * 3000, tool_use("lookup", {"key": "k1"})),
            reply("Summary: parts 0 and 1."),  # the conversation passed 3/4 of the window
            reply("All done."),
        )
        assert agent.run(state) == "All done."
        assert [e.kind for e in state.history].count("compaction") == 1
        asked = [r.body for r in model_server.requests if "Summarize" not in str(r.body)]
        expected: list[dict[str, Any]] = []  # the API wants one message per turn of a role
        for message in state.messages[:-1]:
            if expected and expected[-1]["role"] == message.role:
                expected[-1]["content"] += message.blocks
            else:
                expected.append({"role": message.role, "content": message.blocks})
        assert asked[-1]["messages"] == expected
        first = [block["text"] for block in expected[0]["content"]]
        assert len(first) == 1 and first[0].startswith("Summary of the earlier conversation:")
        # The last turn is kept as it was: the call and its result follow the summary.
        assert expected[1]["content"][-1]["name"] == "lookup"
        assert expected[2]["content"][0]["content"] == "value of k1"

    def test_a_call_waiting_for_a_person_stops_the_run_until_approved(
        self, store: Store, model_server: ModelServer
    ) -> None:
        ran: list[str] = []

        @tool
        def deploy(env: str) -> str:
            """Deploys."""
            ran.append(env)
            return f"deployed to {env}"

        model_server.add(reply(tool_use("deploy", {"env": "prod"}, id="toolu_deploy")))
        agent = agent_for(store, deploy, permissions=Permissions(ask=["deploy"]))
        state = new_state()
        assert agent.run(state) is None
        assert state.stopped == "waiting_for_approval" and ran == []
        loaded = store.load(state.id)
        assert [c.id for c in loaded.awaiting_approval] == ["toolu_deploy"]
        assert not any(e.kind == "tool_result" for e in loaded.history)  # not aborted: it never ran
        loaded.approve("toolu_deploy", True, note="go ahead")
        model_server.add(reply("Deployed."))
        assert agent.run(loaded) == "Deployed."
        assert ran == ["prod"]

    def test_an_approval_saved_elsewhere_is_run_once_and_a_kill_after_it_starts_aborts_it(
        self, store: Store, model_server: ModelServer
    ) -> None:
        ran: list[str] = []
        left_by_a_kill: list[State] = []

        @tool
        def deploy(env: str) -> str:
            """Deploys."""
            ran.append(env)
            left_by_a_kill.append(store.load("nightly-report"))  # a SIGKILL now leaves this
            return f"deployed to {env}"

        model_server.add(reply(tool_use("deploy", {"env": "prod"}, id="toolu_deploy")))
        agent = agent_for(store, deploy, permissions=Permissions(ask=["deploy"]))
        assert agent.run(new_state()) is None
        person = store.load("nightly-report")  # `kubectl patch`, the CLI: another process
        person.approve("toolu_deploy", True)
        store.save(person)

        resumed = store.load("nightly-report")  # the pod that runs it: a third process
        assert resumed == store.load("nightly-report")
        assert [c.id for c in resumed.pending_calls] == ["toolu_deploy"]  # not aborted: not run
        assert not any(e.kind == "tool_result" for e in resumed.history)
        model_server.add(reply("Deployed."))
        assert agent.run(resumed) == "Deployed."
        assert ran == ["prod"]
        closed = [e for e in left_by_a_kill[0].history if e.kind == "tool_result"]
        assert [(e.data["call_id"], e.outcome, e.data["content"]) for e in closed] == [
            ("toolu_deploy", "aborted", UNKNOWN_RESULT)
        ]

    def test_an_approval_saved_by_an_older_version_may_have_run(
        self, store: Store, model_server: ModelServer
    ) -> None:
        @tool
        def deploy(env: str) -> str:
            """Deploys."""
            return f"deployed to {env}"

        model_server.add(reply(tool_use("deploy", {"env": "prod"}, id="toolu_deploy")))
        agent = agent_for(store, deploy, permissions=Permissions(ask=["deploy"]))
        assert agent.run(new_state()) is None
        person = store.load("nightly-report")
        del person.approve("toolu_deploy", True).data["marks_start"]  # as versions before it
        store.save(person)
        loaded = store.load("nightly-report")
        closed = [e for e in loaded.history if e.kind == "tool_result"]
        assert [(e.data["call_id"], e.outcome) for e in closed] == [("toolu_deploy", "aborted")]


def test_a_stream_dropped_mid_way_is_retried(tmp_path: Path, model_server: ModelServer) -> None:
    from alpineagents.model import Retry
    from alpineagents.testing import drop

    model_server.add(drop(), reply("Whole this time."))
    agent = Agent(
        model=MODEL, store=FileStore(tmp_path), max_tokens=16000, retry=Retry(first_delay=0.01)
    )
    assert agent.run(new_state()) == "Whole this time."
    assert [r.stream for r in model_server.requests] == [True, True]
