"""The spec page's code examples, run as written (only the model endpoint is ours)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from alpineagents import FileStore
from alpineagents.testing import ModelServer, hold, reply
from tests.paths import REPO

EXAMPLES = REPO / "tests" / "spec"
SPEC = REPO / "docs" / "survive-crashes-and-restarts.md"
WAIT = 120.0  # seconds a child may take on a loaded machine: a safety net, not a measure


def _code_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


@pytest.mark.parametrize("example", ["sigterm_example.py", "memory_store_example.py"])
def test_the_examples_are_copied_verbatim_from_the_spec(example: str) -> None:
    spec = "\n".join(_code_lines(SPEC.read_text()))
    assert "\n".join(_code_lines((EXAMPLES / example).read_text())) in spec


def run_example(name: str, cwd: Path, model: ModelServer) -> subprocess.Popen[str]:
    env = {**os.environ, **model.env, "PYTHONPATH": str(REPO / "operator")}
    return subprocess.Popen(
        [sys.executable, str(EXAMPLES / name)],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_the_sigterm_recipe_closes_calls_saves_and_exits_143(
    tmp_path: Path, model_server: ModelServer
) -> None:
    model_server.add(hold())
    process = run_example("sigterm_example.py", tmp_path, model_server)
    model_server.wait_for_requests(1)
    process.send_signal(signal.SIGTERM)
    assert process.wait(WAIT) == 143
    model_server.release()
    state = FileStore(tmp_path / ".agent-runs").load("nightly-report")
    assert [(e.kind, e.text) for e in state.history[1:]] == [
        ("model_request", "asking claude-sonnet-5"),
        ("model_error", "(aborted: SystemExit)"),
        ("stop", "stopped: SystemExit: 143"),
    ]


def test_the_sigterm_example_runs_to_its_answer(tmp_path: Path, model_server: ModelServer) -> None:
    model_server.add(reply("The nightly report: all green."))
    process = run_example("sigterm_example.py", tmp_path, model_server)
    out, err = process.communicate(timeout=WAIT)
    assert process.returncode == 0, err
    assert out == "The nightly report: all green.\n"


def test_the_memory_store_example_prints_the_answer(
    tmp_path: Path, model_server: ModelServer
) -> None:
    model_server.add(reply("Hello!"))
    process = run_example("memory_store_example.py", tmp_path, model_server)
    out, err = process.communicate(timeout=WAIT)
    assert process.returncode == 0, err
    assert out == "Hello!\n"


def test_the_list_and_delete_example(tmp_path: Path, model_server: ModelServer) -> None:
    model_server.add(reply("Reviewed."), reply("Reported."))
    for state_id, text in [("review-pr-42", "Review PR 42"), ("nightly", "Report")]:
        from alpineagents import Agent, Message, State

        os.environ.update(model_server.env)
        Agent(
            model="claude-sonnet-5", store=FileStore(tmp_path / ".agent-runs"), max_tokens=512
        ).run(State(id=state_id, messages=[Message.user(text)]))
    process = run_example("list_and_delete_example.py", tmp_path, model_server)
    out, err = process.communicate(timeout=WAIT)
    assert process.returncode == 0, err
    lines = out.splitlines()
    assert re.match(r"nightly Report \d{4}-\d\d-\d\d .* answered", lines[0])
    assert lines[1].startswith("review-pr-42 Review PR 42 ")
    assert lines[2] == "['nightly']"
