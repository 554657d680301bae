"""The README's laptop tour, step by step, as a newcomer types it: each command is taken
from the README's own text, run in a copy of ``examples/`` with the offline echo model."""

from __future__ import annotations

import re
import shutil
import signal
import time
from pathlib import Path

import pytest

from alpineagents import FileStore
from alpineagents.runner import ExitCode
from tests.bench.runner_process import DEADLINE, REPO, RunnerProcess, child_env

_TOUR = REPO.joinpath("README.md").read_text(encoding="utf-8").split("## A tour on your laptop")[1]
_TOUR = _TOUR.split("\n## ", 1)[0]


def tour_command(starting: str) -> list[str]:
    """The tour's one backticked command that starts with ``starting``, as argv after
    ``alpineagents`` (so a change to the README changes what this test runs)."""
    text = " ".join(_TOUR.split())  # commands may wrap across lines
    found = sorted({c for c in re.findall(r"`([^`]+)`", text) if c.startswith(starting)})
    assert len(found) == 1, f"the README's tour has {len(found)} commands starting {starting!r}"
    words = found[0].split()
    assert words[0] == "alpineagents", found[0]
    return words[1:]


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A folder holding a copy of the repository's examples, as a fresh clone's root."""
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    return tmp_path


def cli(args: list[str], workdir: Path, runners: list[RunnerProcess]) -> RunnerProcess:
    process = RunnerProcess(args, workdir=workdir, env=child_env(None))
    runners.append(process)
    process.wait()
    return process


def test_step_1_run_then_show_and_list(workdir: Path, runners: list[RunnerProcess]) -> None:
    run = cli(tour_command("alpineagents run examples/hello.yaml"), workdir, runners)
    assert run.process.returncode == 0, run.stderr
    show = cli(tour_command("alpineagents show hello"), workdir, runners)
    assert show.stdout.startswith("hello: "), show.stdout
    assert "answered" in show.stdout.splitlines()[0]
    assert "simulated (the offline echo model" in show.stdout.splitlines()[0]
    listed = cli(tour_command("alpineagents list"), workdir, runners)
    assert listed.stdout.split()[0] == "hello"


def test_step_2_a_killed_run_is_lost_then_resumes_with_the_call_aborted(
    workdir: Path, runners: list[RunnerProcess]
) -> None:
    args = tour_command("alpineagents run examples/slow-report.yaml")
    first = RunnerProcess(args, workdir=workdir, env=child_env(None))
    runners.append(first)
    store = FileStore(workdir / ".agent-runs")
    deadline = time.monotonic() + DEADLINE
    while not _has_open_call(store, "slow-report"):
        assert first.process.poll() is None, "the run ended before its 20-second call"
        assert time.monotonic() < deadline, "the run never saved its shell call"
        time.sleep(0.1)
    first.signal(signal.SIGKILL)  # the README's pkill -KILL, aimed at this run only
    first.process.wait(DEADLINE)  # not its pipes: the orphaned shell command still holds them
    listed = cli(tour_command("alpineagents list"), workdir, runners)
    assert "lost" in listed.stdout.splitlines()[0], listed.stdout

    again = cli(args, workdir, runners)
    assert again.process.returncode == 0, again.stderr
    state = store.load("slow-report")
    results = [e for e in state.history if e.kind == "tool_result"]
    assert [r.outcome for r in results] == ["aborted"]
    assert "may or may not have run" in again.stdout


def _has_open_call(store: FileStore, state_id: str) -> bool:
    """The saved history holds the model's tool call and no result yet (read raw: a load
    would close the open call, as it does for a crashed run)."""
    record = store.read(state_id)
    kinds = [entry["kind"] for entry in record.entries] if record is not None else []
    return "model_reply" in kinds and "tool_result" not in kinds


def test_step_3_approve_with_the_printed_next_step(
    workdir: Path, runners: list[RunnerProcess]
) -> None:
    args = tour_command("alpineagents run examples/deploy.yaml")
    waiting = cli(args, workdir, runners)
    assert waiting.process.returncode == ExitCode.WAITING_FOR_APPROVAL, waiting.stderr
    hints = dict(
        line.split(": ", 1)
        for line in waiting.stderr.splitlines()
        if line.startswith(("next", "then"))
    )
    approve = hints["next"].split("   (or")[0].split()
    assert approve[:3] == ["alpineagents", "approve", "deploy"]
    assert cli(approve[1:], workdir, runners).process.returncode == 0
    then = hints["then"].split()
    assert then[1:] == args, "the hint keeps the flags the user gave"
    done = cli(then[1:], workdir, runners)
    assert done.process.returncode == 0, done.stderr
    assert "deployed release 1.2.3" in done.stdout


def test_step_4_a_budget_stops_the_run_and_a_raised_one_goes_on(
    workdir: Path, runners: list[RunnerProcess]
) -> None:
    args = tour_command("alpineagents run examples/budget.yaml")
    stopped = cli(args, workdir, runners)
    assert stopped.process.returncode == ExitCode.BUDGET_EXCEEDED, stopped.stderr
    saved = FileStore(workdir / ".agent-runs").load("budget")
    assert saved.stopped == "budget_exceeded"
    manifest = workdir / "examples" / "budget.yaml"
    manifest.write_text(
        manifest.read_text().replace("maxOutputTokens: 20", "maxOutputTokens: 2000")
    )
    went_on = cli(args, workdir, runners)
    assert went_on.process.returncode == 0, went_on.stderr
    after = FileStore(workdir / ".agent-runs").load("budget")
    assert after.history[: len(saved.history)] == saved.history
    assert after.answer
