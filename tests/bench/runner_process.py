"""The runner (``python -m alpineagents``) as a real child process, for tests.

Fixtures:

- ``runners``: a list the test appends :class:`RunnerProcess` objects to; any still
  running at teardown are killed.
- ``leftover_commands``: process groups of shell commands a killed child may have left
  behind (a SIGKILLed runner cannot stop its tool's command); killed at teardown.
- ``workspace``: a :class:`Workspace` (a working folder, a FileStore folder and the
  ``model_server`` to point children at), with ``start``/``run``/``manifest``.

Children get this test's environment without ``ALPINEAGENTS_*``, ``ANTHROPIC_*``,
``AWS_*`` and ``TERMINATION_MESSAGE_PATH``, then ``ANTHROPIC_BASE_URL`` (the scripted
model server), ``ANTHROPIC_API_KEY=test`` and a termination-message file of their own.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from alpineagents import FileStore, State
from alpineagents.testing import ModelServer
from tests.bench.terminal import default_sigint
from tests.paths import REPO

DEADLINE = 120.0  # seconds a child or a file may take; a safety net, never a measurement


def write_manifest(folder: Path, name: str = "job", **spec: Any) -> Path:
    """An AgentRun manifest in ``folder`` with the given spec (model defaults to claude-sonnet-5)."""
    spec.setdefault("model", "claude-sonnet-5")
    path = folder / f"{name}.yaml"
    manifest = {
        "apiVersion": "alpineagents.dev/v1",
        "kind": "AgentRun",
        "metadata": {"name": name},
        "spec": spec,
    }
    path.write_text(yaml.safe_dump(manifest), encoding="utf-8")
    return path


def child_env(model: ModelServer | None, **extra: str) -> dict[str, str]:
    """This test's environment without runner or model settings, pointed at ``model``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ALPINEAGENTS_", "ANTHROPIC_", "AWS_"))
        and k != "TERMINATION_MESSAGE_PATH"
    }
    if model is not None:
        env.update(ANTHROPIC_BASE_URL=model.url, ANTHROPIC_API_KEY="test")
    env.update(extra)
    return env


class RunnerProcess:
    """``python -m alpineagents <args>`` as a child process in ``workdir``."""

    def __init__(
        self,
        args: list[str],
        *,
        workdir: Path,
        env: Mapping[str, str],
        message_path: Path | None = None,
    ) -> None:
        self.message_path = message_path or workdir / "termination-log"
        with contextlib.suppress(FileNotFoundError):
            self.message_path.unlink()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "alpineagents", *args],
            cwd=workdir,
            env={**env, "TERMINATION_MESSAGE_PATH": str(self.message_path)},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=default_sigint,  # tests send it Ctrl+C, also when pytest runs in the background
        )
        self.stdout = ""
        self.stderr = ""

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def wait(self) -> int:
        self.stdout, self.stderr = self.process.communicate(timeout=DEADLINE)
        return self.process.returncode

    @property
    def message(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.message_path.read_text(encoding="utf-8"))
        return data

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.communicate()


@pytest.fixture
def runners() -> Iterator[list[RunnerProcess]]:
    """Children started by a test; killed at teardown if still running."""
    started: list[RunnerProcess] = []
    yield started
    for runner in started:
        runner.stop()


@pytest.fixture
def leftover_commands() -> Iterator[list[int]]:
    """Process groups of shell commands a test's child may have left; killed at teardown."""
    groups: list[int] = []
    yield groups
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)


class Workspace:
    """A temporary working folder and FileStore for one test's runs."""

    def __init__(self, root: Path, model: ModelServer | None, runners: list[RunnerProcess]) -> None:
        self.root = root
        self.work = root / "work"
        self.work.mkdir()
        self.runs = root / "runs"
        self.model = model
        self.runners = runners

    @property
    def store(self) -> FileStore:
        return FileStore(self.runs)

    def start(self, *args: str, **env: str) -> RunnerProcess:
        runner = RunnerProcess(
            ["run", *args, "--store", str(self.runs)],
            workdir=self.work,
            env=child_env(self.model, **env),
        )
        self.runners.append(runner)
        return runner

    def run(self, *args: str, **env: str) -> RunnerProcess:
        runner = self.start(*args, **env)
        runner.wait()
        return runner

    def manifest(self, name: str = "job", **spec: Any) -> str:
        return str(write_manifest(self.root, name, **spec))


@pytest.fixture
def workspace(tmp_path: Path, model_server: ModelServer, runners: list[RunnerProcess]) -> Workspace:
    """A working folder and FileStore folder for runs against ``model_server``."""
    return Workspace(tmp_path, model_server, runners)


def wait_for_file(path: Path) -> str:
    """The content of ``path`` once it holds a complete line (polled, with a deadline)."""
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError):
            text = path.read_text()
            if text.endswith("\n"):
                return text
        time.sleep(0.02)
    raise AssertionError(f"{path} was not written within {DEADLINE}s")


def wait_until_gone(pid: int) -> None:
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.02)
    raise AssertionError(f"process {pid} is still running")


def tool_results(state: State) -> list[Any]:
    return [e for e in state.history if e.kind == "tool_result"]


def last_tool_result_block(request_body: Mapping[str, Any]) -> dict[str, Any]:
    blocks = request_body["messages"][-1]["content"]
    result: dict[str, Any] = next(b for b in blocks if b.get("type") == "tool_result")
    return result


def with_examples() -> str:
    """PYTHONPATH with examples/custom_agent first, so ``notes_agent`` imports."""
    paths = [str(REPO / "examples" / "custom_agent"), os.environ.get("PYTHONPATH", "")]
    return os.pathsep.join(p for p in paths if p)


# A command that records its process group in a marker file, then blocks.
BLOCKING = "echo $$ >> started; exec sleep 30"
