"""Whole-process start-up: CLI commands, and a runner's first save after it starts.

Every figure is a wall time of a fresh ``python -m alpineagents ...`` process (this
checkout's code, through ``PYTHONPATH``), taken in rounds with the floor (``python -c
pass``, the interpreter alone) in the same round, after one warm-up round.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from alpineagents.testing import ModelServer, hold

from . import REPO
from .measure import Spread

DEADLINE = 120.0  # seconds any child may take (a safety net, never a measurement)


def child_env(**extra: str) -> dict[str, str]:
    """This environment without alpineagents/model settings, importing this checkout."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ALPINEAGENTS_", "ANTHROPIC_", "AWS_"))
        and k not in ("TERMINATION_MESSAGE_PATH", "PYTHONPATH")
    }
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "operator"), str(REPO)])
    env.update(extra)
    return env


def timed(args: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """Wall seconds from starting ``args`` to its exit, and the CPU seconds (user + system)
    it used, which a busy machine inflates much less. The command must succeed."""
    with tempfile.TemporaryFile() as errors:
        begin = time.perf_counter()
        child = subprocess.Popen(args, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=errors)
        _, status, usage = os.wait4(child.pid, 0)
        took = time.perf_counter() - begin
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode != 0:
            errors.seek(0)
            raise AssertionError(f"{' '.join(args)} failed: {errors.read().decode()[-500:]}")
    return took, usage.ru_utime + usage.ru_stime


def cli_start(store: Path, show_id: str, rounds: int) -> dict[str, Spread]:
    """``list`` and ``show`` against a FileStore folder, next to ``python -c pass``.

    Keys: the command's name (wall seconds) and ``"<name> cpu"`` (CPU seconds)."""
    env = child_env()
    commands = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "list": [sys.executable, "-m", "alpineagents", "list", "--store", str(store)],
        "show": [sys.executable, "-m", "alpineagents", "show", show_id, "--store", str(store)],
    }
    figures = {key: Spread() for name in commands for key in (name, f"{name} cpu")}
    for round_ in range(rounds + 1):  # round 0 warms the page cache and .pyc files
        for name, args in commands.items():
            took, cpu = timed(args, env, store.parent)
            if round_:
                figures[name].add(took)
                figures[f"{name} cpu"].add(cpu)
    return figures


def manifest(folder: Path, name: str) -> Path:
    path = folder / f"{name}.yaml"
    spec = {"model": "claude-sonnet-5", "prompt": "Say hello.", "maxTurns": 3}
    document = {
        "apiVersion": "alpineagents.dev/v1",
        "kind": "AgentRun",
        "metadata": {"name": name},
        "spec": spec,
    }
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    return path


def _history(store: Path, state_id: str) -> Path:
    return store / state_id / "history.jsonl"


def _lines(path: Path) -> int:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return 0
    return data.count(b"\n")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a running process has used so far (Linux ``/proc``)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wait(condition: Any, what: str) -> float:
    """Poll ``condition`` every millisecond; return the perf_counter time it held."""
    deadline = time.monotonic() + DEADLINE
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.001)
    return time.perf_counter()


def first_saves(work: Path, rounds: int) -> dict[str, Spread]:
    """A runner's first saved entry, counted from its process start (keys: wall seconds;
    ``"<name> cpu"``: the CPU seconds the process had used by then).

    Per round: a new run (``run``, its first save creates the State), killed with
    SIGKILL while it waits for the model; then its resume (the load closes the open
    model request with an entry of its own, and the first save writes it).
    """
    store = work / "first-save-runs"
    figures = {
        key: Spread() for name in ("new run", "resumed run") for key in (name, f"{name} cpu")
    }
    with ModelServer() as model:
        env = child_env(ANTHROPIC_BASE_URL=model.url, ANTHROPIC_API_KEY="benchmark")
        for round_ in range(rounds + 1):
            name = f"start-{round_}"
            path = manifest(work, name)
            args = [sys.executable, "-m", "alpineagents", "run", str(path), "--store", str(store)]
            model.add(hold(), "Done.")
            history = _history(store, name)
            asked = len(model.requests) + 1
            begin = time.perf_counter()
            first = subprocess.Popen(
                args, env=env, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            try:
                saved = _wait(lambda h=history: _lines(h) >= 1, "the new run's first save")
                saved_cpu = cpu_seconds(first.pid)
                model.wait_for_requests(asked, timeout=DEADLINE)
            finally:
                first.send_signal(signal.SIGKILL)
                first.wait(timeout=DEADLINE)
            had = _lines(history)
            begin_resume = time.perf_counter()
            second = subprocess.Popen(
                args, env=env, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            try:
                resumed = _wait(lambda h=history, n=had: _lines(h) > n, "the resumed run's save")
                resumed_cpu = cpu_seconds(second.pid)
            finally:
                code = second.wait(timeout=DEADLINE)
            if code != 0:
                raise AssertionError(f"the resumed run exited {code}")
            if round_:
                figures["new run"].add(saved - begin)
                figures["new run cpu"].add(saved_cpu)
                figures["resumed run"].add(resumed - begin_resume)
                figures["resumed run cpu"].add(resumed_cpu)
    return figures
