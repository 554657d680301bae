"""A real headless browser and the run viewer as a real process, for the viewer's tests.

Fixtures:

- ``browser`` (module): Debian's ``chromium`` (``/usr/bin/chromium``, or
  ``$ALPINEAGENTS_CHROMIUM``) driven by Playwright, with a fresh profile folder; no
  browser is ever downloaded. Missing chromium or playwright skips (fails in CI).
- ``page``: a new page (1280x720) of that browser, closed at teardown.
- ``viewers``: starts ``alpineagents ui`` child processes (:class:`ViewerProcess`), each
  on a free loopback port; stopped at teardown.
- ``screenshots``: :func:`Screenshots` saving PNGs into the test's tmp folder, and into
  ``docs/`` too when ``ALPINEAGENTS_SCREENSHOTS=docs`` (``scripts/screenshots`` sets it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.bench.infra import missing
from tests.paths import REPO

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WAIT_MS = 60_000  # what the page may take to show something: generous on a busy machine


def chromium_path() -> str | None:
    path = os.environ.get("ALPINEAGENTS_CHROMIUM") or "/usr/bin/chromium"
    return path if os.access(path, os.X_OK) else shutil.which("chromium")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A Playwright browser context of Debian's chromium, with a fresh profile.

    One a module, not a session: Playwright's sync API keeps an event loop running on
    the test thread while it is open, and a later module's ``Agent.run`` or
    ``asyncio.run`` would find it there and refuse to start.
    """
    path = chromium_path()
    if path is None:
        missing("chromium", "apt-get install chromium (Debian's package; no browser is downloaded)")
    try:
        from playwright.sync_api import expect, sync_playwright
    except ImportError:
        missing("playwright", "pip install -e '.[test]'")
    expect.set_options(timeout=WAIT_MS)
    with (
        tempfile.TemporaryDirectory(prefix="alpineagents-chromium-") as profile,
        sync_playwright() as playwright,
    ):
        context = playwright.chromium.launch_persistent_context(
            profile,
            executable_path=path,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 720},
        )
        context.set_default_timeout(WAIT_MS)
        yield context
        context.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A new 1280x720 page; page errors fail the test at teardown."""
    tab = browser.new_page()
    tab.set_viewport_size({"width": 1280, "height": 720})
    errors: list[str] = []
    tab.on("pageerror", lambda error: errors.append(str(error)))
    yield tab
    tab.close()
    assert not errors, f"the page raised: {errors}"


class ViewerProcess:
    """``python -m alpineagents ui`` as a child process; ``url`` is where it serves."""

    def __init__(self, args: list[str], env: Mapping[str, str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "alpineagents", "ui", "--port", "0", *args],
            cwd=REPO,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()  # blocks until it serves (or ends)
        if not line.startswith("http://"):
            self.process.wait(30)
            raise AssertionError(f"alpineagents ui did not start: {line}{self.stderr()}")
        self.url = line.strip()

    def stderr(self) -> str:
        assert self.process.stderr is not None
        return self.process.stderr.read() if self.process.poll() is not None else ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class Viewers:
    """Starts viewers for a test and stops them at its end."""

    def __init__(self) -> None:
        self.started: list[ViewerProcess] = []

    def start(self, *args: str, env: Mapping[str, str] | None = None) -> ViewerProcess:
        environment = {
            **{k: v for k, v in os.environ.items() if k != "KUBECONFIG"},
            "PYTHONPATH": os.pathsep.join([str(REPO / "operator"), str(REPO)]),
            **(env or {}),
        }
        viewer = ViewerProcess(list(args), environment)
        self.started.append(viewer)
        return viewer


@pytest.fixture
def viewers() -> Iterator[Viewers]:
    started = Viewers()
    yield started
    for viewer in started.started:
        viewer.stop()


class Screenshots:
    """Saves a page's screenshot as ``<name>.png`` in the test's folder (and in docs/)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.to_docs = os.environ.get("ALPINEAGENTS_SCREENSHOTS") == "docs"

    def take(self, page: Any, name: str) -> Path:
        path = self.folder / f"{name}.png"
        page.screenshot(path=str(path))
        if self.to_docs:
            shutil.copyfile(path, REPO / "docs" / f"{name}.png")
        return path


@pytest.fixture
def screenshots(tmp_path: Path) -> Screenshots:
    return Screenshots(tmp_path)


def write_long_run(store: Any, state_id: str, entries: int = 10_000) -> None:
    """Save a finished run of exactly ``entries`` history entries, as the Agent writes them:
    turns of a model request, a reply calling two tools, and their two results (every
    50th one an error), then the answer."""
    from datetime import UTC, datetime, timedelta

    start = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
    saved: list[dict[str, Any]] = []

    def add(kind: str, text: str, data: dict[str, Any]) -> None:
        moment = start + timedelta(milliseconds=400 * len(saved))
        saved.append(
            {
                "seq": len(saved),
                "kind": kind,
                "time": moment.isoformat(),
                "text": text,
                "data": data,
            }
        )

    message = {"role": "user", "content": "Check every file of the repository"}
    add("message", "user: Check every file of the repository", {"message": message})
    turn = 0
    while len(saved) + 5 <= entries - 3:
        turn += 1
        calls = [
            {
                "type": "tool_use",
                "id": f"toolu_{turn}_a",
                "name": "read_file",
                "input": {"path": f"src/f{turn}.py"},
            },
            {
                "type": "tool_use",
                "id": f"toolu_{turn}_b",
                "name": "lint",
                "input": {"path": f"src/f{turn}.py"},
            },
        ]
        add("model_request", "asking claude-sonnet-5", {"model": "claude-sonnet-5"})
        reply = {
            "role": "assistant",
            "content": [{"type": "text", "text": f"Looking at file {turn}."}, *calls],
        }
        usage = {"input_tokens": 900 + turn, "output_tokens": 60}
        add(
            "model_reply",
            "claude-sonnet-5 calls read_file, lint",
            {
                "message": reply,
                "model": "claude-sonnet-5",
                "stop_reason": "tool_use",
                "usage": usage,
            },
        )
        for call, outcome in ((calls[0], "ok"), (calls[1], "error" if turn % 50 == 0 else "ok")):
            content = f"{call['name']} of f{turn}.py: " + (
                "failed" if outcome == "error" else "fine"
            )
            add(
                "tool_result",
                content,
                {
                    "call_id": call["id"],
                    "name": call["name"],
                    "outcome": outcome,
                    "content": content,
                },
            )
    while len(saved) < entries - 3:
        add("message", "user: go on", {"message": {"role": "user", "content": "go on"}})
    add("model_request", "asking claude-sonnet-5", {"model": "claude-sonnet-5"})
    answer = {
        "role": "assistant",
        "content": [{"type": "text", "text": f"All {turn} files checked."}],
    }
    add(
        "model_reply",
        f"claude-sonnet-5: All {turn} files checked.",
        {
            "message": answer,
            "model": "claude-sonnet-5",
            "stop_reason": "end_turn",
            "usage": {"input_tokens": 2000, "output_tokens": 12},
        },
    )
    add("stop", "stopped: answered", {"reason": "answered"})
    info = {
        "v": 5,
        "first_message": message["content"],
        "updated_at": saved[-1]["time"],
        "stopped": "answered",
        "parent_id": None,
        "entries": len(saved),
        "turns": turn + 1,
        "usage": {"input_tokens": 0, "output_tokens": 0},
        "answer": f"All {turn} files checked.",
    }
    store.write(state_id, saved, info, create=True)
