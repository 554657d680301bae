"""The run viewer (``alpineagents ui``) in a real headless chromium, against real runs.

Runs are made by the real Agent or by ``python -m alpineagents run`` child processes,
talking to the scripted model server through the real ``anthropic`` client; the viewer
is its own process reading the same FileStore. Each test saves a screenshot of what it
shows (``scripts/screenshots`` copies them into docs/).
"""

from __future__ import annotations

import concurrent.futures
import json
import re
import signal
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import anthropic
import pytest

from alpineagents import Agent, FileStore, Message, Permissions, State, tool
from alpineagents.state import UNKNOWN_RESULT
from alpineagents.testing import ModelServer, hold, reply, tool_use
from tests.bench.browser import Screenshots, Viewers, write_long_run
from tests.bench.runner_process import BLOCKING, RunnerProcess, Workspace, child_env, wait_for_file

expect: Any
try:
    from playwright.sync_api import expect
except ImportError:  # the browser fixture skips (or fails in CI) with the reason
    expect = None


def _agents(store: FileStore, client: anthropic.Anthropic) -> tuple[Agent, Agent]:
    @tool
    def read_file(path: str) -> str:
        """Reads a file.

        Args:
            path: the file
        """
        return f"contents of {path}"

    @tool
    def deploy(env: str) -> str:
        """Deploys.

        Args:
            env: where
        """
        return f"deployed to {env}"

    researcher = Agent("claude-sonnet-5", store, tools=[read_file], client=client)
    lead = Agent(
        "claude-sonnet-5",
        store,
        tools=[researcher.as_tool("research", "Researches a question"), deploy],
        permissions=Permissions(ask=["deploy"]),
        client=client,
    )
    return researcher, lead


def run_off_the_loop(agent: Agent, state: State) -> str | None:
    """agent.run on a thread of its own: Playwright's sync API keeps an event loop running
    on this one, and Agent.run refuses to start inside a running loop."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(agent.run, state).result(timeout=120)


def make_runs(store: FileStore, model: ModelServer, client: anthropic.Anthropic) -> None:
    """A run with a subagent, a run waiting for approval, and a plain answered run."""
    _, lead = _agents(store, client)
    model.add(
        reply("I'll ask a researcher.", tool_use("research", {"task": "Find the weather in Bern"})),
        reply("Reading the forecast.", tool_use("read_file", {"path": "forecast.txt"})),
        reply("Bern: sunny, 21 °C."),
        reply("The weather report: Bern is sunny at 21 °C."),
    )
    run_off_the_loop(lead, State("weather-report", [Message.user("Write the weather report")]))
    model.add(reply("Deploying now.", tool_use("deploy", {"env": "production"}, id="toolu_deploy")))
    run_off_the_loop(lead, State("release-2-4", [Message.user("Ship release 2.4 to production")]))
    model.add(reply("Hello! How can I help?"))
    run_off_the_loop(lead, State("greeting", [Message.user("Say hello")]))


def test_the_runs_list_nests_subagents_and_filters(
    tmp_path: Path,
    model_server: ModelServer,
    model_client: anthropic.Anthropic,
    viewers: Viewers,
    page: Any,
    screenshots: Screenshots,
) -> None:
    store = FileStore(tmp_path / "runs")
    make_runs(store, model_server, model_client)
    viewer = viewers.start("--store", str(store.folder), "--no-cluster")

    page.goto(viewer.url)
    rows = page.locator("#runs tbody tr")
    expect(rows).to_have_count(4)
    ids = [row.get_attribute("data-id") for row in rows.all()]
    child = next(i for i in ids if i and i.startswith("weather-report."))
    # The subagent comes right after its parent, nested.
    assert ids.index(child) == ids.index("weather-report") + 1
    expect(page.locator(f'tr[data-id="{child}"] td.id')).to_contain_text("↳")
    expect(page.locator('tr[data-id="weather-report"]')).to_contain_text("1 subagent")
    expect(page.locator('tr[data-id="release-2-4"]')).to_contain_text("waiting for approval")
    expect(page.locator("#mode")).to_have_text("read-only")
    screenshots.take(page, "ui-runs")

    page.fill("#search", "production")
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-id", "release-2-4")
    page.fill("#search", "")
    page.click('#chips button[data-filter="answered"]')
    expect(rows).to_have_count(3)
    page.click('#chips button[data-filter="waiting"]')
    expect(rows).to_have_count(1)

    page.click('#chips button[data-filter="all"]')
    page.click(f'tr[data-id="{child}"] a')
    expect(page.locator(".run-head h1")).to_contain_text(child)
    expect(page.locator("#facts")).to_contain_text("subagent of weather-report")


def test_a_crashed_and_resumed_run_shows_the_aborted_call_and_the_new_attempt(
    workspace: Workspace,
    model_server: ModelServer,
    leftover_commands: list[int],
    viewers: Viewers,
    page: Any,
    screenshots: Screenshots,
) -> None:
    model_server.add(
        reply(
            "Running the migration.", tool_use("shell", {"command": BLOCKING}, id="toolu_migrate")
        )
    )
    manifest = workspace.manifest(tools=["shell"], prompt="Migrate the orders table.")
    runner = workspace.start(manifest)
    leftover_commands.append(int(wait_for_file(workspace.work / "started")))
    runner.signal(signal.SIGKILL)  # lost without a chance to save: like an OOM kill
    assert runner.wait() == -signal.SIGKILL

    # Before it is resumed: lost, not running; its call's bar does not grow.
    viewer = viewers.start("--store", str(workspace.runs), "--no-cluster")
    page.goto(f"{viewer.url}runs/job")
    expect(page.locator("#run-status")).to_have_text("lost")
    expect(page.locator("#process-note")).to_contain_text("No process runs it")
    call = page.locator(".tl-row.call", has_text="shell")
    expect(call.locator(".badge")).to_have_text("lost")  # not "running": nothing runs it
    page.goto(viewer.url)
    expect(page.locator('#runs tr[data-id="job"]')).to_contain_text("lost")
    screenshots.take(page, "ui-runs-lost")

    model_server.add(
        reply(
            "The migration may or may not have run; checking first.",
            tool_use("shell", {"command": "echo 'orders: migrated'"}, id="toolu_check"),
        ),
        reply("The orders table is migrated (checked after the crash)."),
    )
    again = workspace.run(manifest)
    assert again.process.returncode == 0, again.stderr

    # The list (store mode: no AgentRun counts attempts) tells the crash too.
    page.goto(viewer.url)
    expect(page.locator("#runs thead")).to_contain_text("Attempts")
    job = page.locator('#runs tr[data-id="job"]')
    expect(job.locator("td.attempts")).to_have_text("2")
    expect(job.locator("td.aborted")).to_have_text("1")
    expect(job.locator("td.aborted")).to_have_class(re.compile(r"\bcrashed\b"))

    page.goto(f"{viewer.url}runs/job")
    expect(page.locator("#answer")).to_contain_text("The orders table is migrated")
    expect(page.locator("#facts")).to_contain_text("2 attempts")
    aborted = page.locator(".tl-row.call", has_text="aborted").first
    expect(aborted).to_contain_text("shell")
    boundary = page.locator(".tl-row.attempt")
    expect(boundary).to_have_count(1)
    expect(boundary).to_contain_text("attempt 2")
    expect(boundary).to_contain_text("lost without stopping")
    expect(boundary).to_contain_text("marked aborted above")
    # The call ran at least until the lost process's last save: a lower bound.
    expect(aborted.locator(".dur")).to_contain_text("≥ ")
    # The boundary is drawn where it happened: after the call's start, before its closing.
    assert boundary.bounding_box()["y"] > aborted.bounding_box()["y"]
    screenshots.take(page, "ui-run-crash")

    aborted.click()
    expect(page.locator("#detail-body")).to_contain_text(UNKNOWN_RESULT[:40])
    expect(page.locator("#detail-body")).to_contain_text('"outcome": "aborted"')
    screenshots.take(page, "ui-entry")

    # "Fork from here" on the aborted result shows the command; run as shown, it forks.
    entry = page.locator("#detail-body .entry", has_text='"outcome": "aborted"').first
    entry.locator("details.fork summary").click()
    command = entry.locator(".fork-command").inner_text().split()
    assert command[:4] == ["alpineagents", "fork", "job", "--at"]
    seq = int(command[4])
    assert workspace.store.load("job").history[seq].outcome == "aborted"
    forked = RunnerProcess(
        [*command[1:], "--store", str(workspace.runs)],
        workdir=workspace.runs.parent,
        env=child_env(None),
    )
    assert forked.wait() == 0, forked.stderr
    assert workspace.store.load(f"job-fork-{seq}").forked_from is not None

    # The smallest laptop screens: nothing spills sideways, and the timeline still shows.
    page.keyboard.press("Escape")
    page.set_viewport_size({"width": 1024, "height": 600})
    expect(page.locator(".tl-row.attempt")).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    screenshots.take(page, "ui-run-small-screen")


def test_a_running_run_updates_live(
    tmp_path: Path,
    model_server: ModelServer,
    model_client: anthropic.Anthropic,
    viewers: Viewers,
    page: Any,
    screenshots: Screenshots,
) -> None:
    import threading

    go = threading.Event()

    @tool
    def build(target: str) -> str:
        """Builds a target.

        Args:
            target: what to build
        """
        go.wait(120)
        return f"built {target}"

    @tool
    def lint() -> str:
        """Lints."""
        return "2 warnings"

    store = FileStore(tmp_path / "runs")
    agent = Agent("claude-sonnet-5", store, tools=[build, lint], client=model_client)
    model_server.add(
        reply("Building and linting.", tool_use("build", {"target": "web"}), tool_use("lint")),
        hold(reply("Built web; lint found 2 warnings.")),
        reply("The bundle is 412 kB."),
    )
    state = State("build-web", [Message.user("Build the web target")])
    run = threading.Thread(target=agent.run, args=(state,), daemon=True)
    run.start()
    viewer = viewers.start("--store", str(store.folder), "--no-cluster")
    try:
        page.goto(f"{viewer.url}runs/build-web")
        build_row = page.locator(".tl-row.call", has_text="build")
        expect(build_row).to_contain_text("running")
        expect(page.locator(".tl-row.call", has_text="lint")).to_contain_text("ok")
        expect(page.locator("#run-status")).to_contain_text("running")
        screenshots.take(page, "ui-run-live")

        go.set()  # the tool returns: its result is saved, and the page shows it
        expect(build_row).to_contain_text("built web")
        expect(page.locator(".tl-row.model").last).to_contain_text("running")
        model_server.wait_for_requests(2, timeout=60)
        state.send("Also tell me the bundle size.")  # a message sent while it runs
        expect(page.locator(".tl-row.sent")).to_contain_text("bundle size")
        model_server.release()
        expect(page.locator(".tl-row.sent")).to_contain_text("joined")
        expect(page.locator("#answer")).to_contain_text("The bundle is 412 kB.")
        expect(page.locator("#run-status")).to_contain_text("answered")
    finally:
        go.set()
        model_server.release()
        run.join(60)


def test_an_approval_is_refused_by_a_read_only_viewer(
    tmp_path: Path,
    model_server: ModelServer,
    model_client: anthropic.Anthropic,
    viewers: Viewers,
    page: Any,
) -> None:
    store = FileStore(tmp_path / "runs")
    make_runs(store, model_server, model_client)
    viewer = viewers.start("--store", str(store.folder), "--no-cluster")
    page.goto(f"{viewer.url}runs/release-2-4")
    box = page.locator("#approvals")
    expect(box).to_contain_text("production")
    expect(box.locator("button.allow")).to_be_disabled()
    expect(box).to_contain_text("--allow-approvals")
    request = urllib.request.Request(
        f"{viewer.url}api/runs/release-2-4/approvals",
        data=json.dumps({"answers": [{"call_id": "toolu_deploy", "allow": True}]}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)
    assert refused.value.code == 403
    assert store.load("release-2-4").awaiting_approval  # nothing was recorded


def test_a_local_approval_is_recorded_in_the_state(
    tmp_path: Path,
    model_server: ModelServer,
    model_client: anthropic.Anthropic,
    viewers: Viewers,
    page: Any,
) -> None:
    store = FileStore(tmp_path / "runs")
    make_runs(store, model_server, model_client)
    viewer = viewers.start("--store", str(store.folder), "--no-cluster", "--allow-approvals")
    # Another site's page cannot answer for the user (its Origin is not this viewer's).
    forged = urllib.request.Request(
        f"{viewer.url}api/runs/release-2-4/approvals",
        data=json.dumps({"answers": [{"call_id": "toolu_deploy", "allow": True}]}).encode(),
        headers={"Content-Type": "application/json", "Origin": "http://evil.example"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(forged, timeout=60)
    assert refused.value.code == 403

    page.goto(f"{viewer.url}runs/release-2-4?token={viewer.token}")  # as printed
    expect(page).to_have_url(f"{viewer.url}runs/release-2-4")  # the token left the address bar
    page.locator("#approvals button.refuse").click()
    expect(page.locator("#approval-result")).to_contain_text("recorded in State release-2-4")
    expect(page.locator("#approvals")).to_be_hidden()  # the answer is in the history now
    # Nothing runs until it is resumed: no second attempt, and the page says what to do.
    expect(page.locator("#run-status")).to_have_text("answered: waits for a resume")
    expect(page.locator("#process-note")).to_contain_text(
        "alpineagents run FILE.yaml --id release-2-4"
    )
    expect(page.locator(".tl-row.attempt")).to_have_count(0)
    expect(page.locator(".tl-row.call", has_text="deploy")).to_contain_text("refused")
    saved = store.read("release-2-4")
    assert saved is not None
    assert saved.entries[-1]["kind"] == "permission"
    assert saved.entries[-1]["data"] == {
        "call_id": "toolu_deploy",
        "allow": False,
        "by": "person",
        "note": "",
        "marks_start": True,  # a run saves a `started` entry before it runs an approved call
    }


def test_a_run_of_ten_thousand_entries_opens_and_scrolls(
    tmp_path: Path, viewers: Viewers, page: Any, screenshots: Screenshots
) -> None:
    store = FileStore(tmp_path / "runs")
    write_long_run(store, "long-run", 10_000)
    viewer = viewers.start("--store", str(store.folder), "--no-cluster")
    page.goto(f"{viewer.url}runs/long-run")
    expect(page.locator("#facts")).to_contain_text("10000 entries")
    expect(page.locator("#answer")).to_contain_text("files checked")
    # Only the rows in view are in the page, however long the history.
    assert page.locator(".tl-row").count() < 120
    page.eval_on_selector("#viewport", "v => { v.scrollTop = v.scrollHeight / 2; }")
    expect(page.locator(".tl-row .seq", has_text=re.compile(r"^50\d\d$")).first).to_be_visible()
    seqs = [int(s) for s in page.locator(".tl-row .seq").all_inner_texts() if s.strip()]
    assert min(seqs) > 4000 and max(seqs) < 6000
    page.locator(".tl-row.call", has_text="error").first.click()
    expect(page.locator("#detail-body")).to_contain_text("failed")
    screenshots.take(page, "ui-run-10k")


def test_a_long_run_is_searched_and_filtered_to_its_errors(
    tmp_path: Path, viewers: Viewers, page: Any, screenshots: Screenshots
) -> None:
    store = FileStore(tmp_path / "runs")
    write_long_run(store, "long-run", 10_000)  # every 50th turn's lint call fails: 49
    viewer = viewers.start("--store", str(store.folder), "--no-cluster")
    page.goto(f"{viewer.url}runs/long-run")
    expect(page.locator("#facts")).to_contain_text("10000 entries")
    count = page.locator("#row-count")

    # The page holds only the rows in view: the server filters the whole run.
    page.check("#errors-only")
    expect(count).to_have_text(re.compile(r"^49 of \d+ rows$"))
    expect(page.locator(".tl-row .seq").first).to_have_text("200")  # turn 50's lint result
    expect(page.locator(".tl-row.pending")).to_have_count(0)
    shown = page.locator(".tl-row").all_inner_texts()
    assert shown and all("lint" in text and "error" in text for text in shown)
    assert page.eval_on_selector("#spacer", "s => s.style.height") == f"{49 * 28}px"
    screenshots.take(page, "ui-run-errors")
    page.locator(".tl-row").nth(1).click()  # a filtered row opens its own entries
    expect(page.locator("#detail-body")).to_contain_text("lint of f100.py: failed")
    page.keyboard.press("Escape")

    # A search (any case) with errors only, then alone.
    page.fill("#row-search", "F1250.PY")
    expect(count).to_have_text(re.compile(r"^1 of \d+ rows$"))
    expect(page.locator(".tl-row")).to_have_count(1)
    expect(page.locator(".tl-row")).to_contain_text("lint of f1250.py: failed")
    page.uncheck("#errors-only")
    expect(count).to_have_text(re.compile(r"^2 of \d+ rows$"))
    expect(page.locator(".tl-row", has_text="read_file of f1250.py: fine")).to_be_visible()
    page.fill("#row-search", "no such words")
    expect(count).to_have_text(re.compile(r"^0 of \d+ rows match$"))
    expect(page.locator(".tl-row")).to_have_count(0)

    # No filter: the whole run again, at its end.
    page.fill("#row-search", "")
    expect(count).to_have_text("")
    expect(page.locator(".tl-row.stop")).to_be_visible()


def _shows_whole(page: Any, selector: str) -> bool:
    """Whether the element's text is drawn whole: not cut by an ellipsis, nor by a box
    around it that hides what overflows, nor by the window's edge."""
    return bool(
        page.eval_on_selector(
            selector,
            """e => {
                const box = e.getBoundingClientRect();
                if (box.width === 0 || box.right > window.innerWidth + 1) return false;
                for (let a = e; a; a = a.parentElement) {
                    const clips = a === e || getComputedStyle(a).overflowX !== "visible";
                    if (clips && a.scrollWidth > a.clientWidth + 1 && a.clientWidth > 0) return false;
                }
                return true;
            }""",
        )
    )


def test_a_run_id_stays_readable_on_a_narrow_window(
    tmp_path: Path,
    model_server: ModelServer,
    model_client: anthropic.Anthropic,
    viewers: Viewers,
    page: Any,
    screenshots: Screenshots,
) -> None:
    store = FileStore(tmp_path / "runs")
    make_runs(store, model_server, model_client)
    viewer = viewers.start("--store", str(store.folder), "--no-cluster")
    page.set_viewport_size({"width": 420, "height": 800})
    page.goto(viewer.url)
    child = page.locator('#runs tbody tr[data-id^="weather-report."]').get_attribute("data-id")
    assert child and len(child) > 20  # a subagent's id: its parent's and a suffix
    screenshots.take(page, "ui-runs-narrow")
    for state_id in ("weather-report", child):
        link = f'#runs tr[data-id="{state_id}"] td.id a'
        expect(page.locator(link)).to_have_attribute("title", state_id)
        assert _shows_whole(page, link), f"{state_id} is cut in the list"
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")

    page.goto(f"{viewer.url}runs/{child}")
    expect(page.locator(".run-head h1 .id")).to_have_text(child)
    expect(page.locator("#answer")).to_contain_text("Bern")
    screenshots.take(page, "ui-run-narrow")
    assert _shows_whole(page, ".run-head h1 .id"), "the id is cut on its page"
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
