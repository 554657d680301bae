"""A run whose process is gone is drawn as lost, not as running forever: the viewer reads
the run lock a real ``alpineagents run`` process holds, and sees it go when the process
is killed with SIGKILL."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from alpineagents import FileStore, Message, State
from alpineagents.testing import ModelServer, hold, reply
from alpineagents.viewer import RunViewer
from tests.bench.runner_process import Workspace


def test_a_killed_run_is_lost_in_the_list_and_on_its_page(
    workspace: Workspace, model_server: ModelServer
) -> None:
    model_server.add(reply("Done."))
    assert workspace.run(workspace.manifest("finished", prompt="Hi.")).process.returncode == 0
    model_server.add(hold(reply("Never sent.")))
    run = workspace.start(workspace.manifest(prompt="Take your time."))
    model_server.wait_for_requests(2)
    viewer = RunViewer(FileStore(workspace.runs), fast_poll=0.05)

    async def watch() -> list[str | None]:
        listed = {r["id"]: r["process"] for r in (await viewer.runs())["runs"]}
        assert listed == {"job": "running", "finished": None}  # finished: nothing to tell
        seen = []
        updates = viewer.follow("job")
        first = await anext(updates)
        seen.append(first.process)
        run.signal(signal.SIGKILL)
        async for update in updates:
            seen.append(update.process)
            if update.process == "lost":
                break
        await updates.aclose()
        listed = {r["id"]: r["process"] for r in (await viewer.runs())["runs"]}
        assert listed == {"job": "lost", "finished": None}
        return seen

    seen = asyncio.run(watch())
    assert seen[0] == "running" and seen[-1] == "lost"
    assert run.wait() == -signal.SIGKILL
    model_server.release()


def test_a_run_no_runner_ran_is_neither_running_nor_lost(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    store.save(State("library-run", [Message.user("hi")]))  # as agent.run saves it
    viewer = RunViewer(store)
    (row,) = asyncio.run(viewer.runs())["runs"]
    assert row["process"] is None
