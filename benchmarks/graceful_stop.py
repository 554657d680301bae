"""How long a runner takes from SIGTERM to its exit, idle and on a busy CPU.

Run from the repository root::

    python benchmarks/graceful_stop.py [--repeats 3] [--load 2]

A runner is started as a pod starts it (``python -m alpineagents run``, a FileStore, the
scripted model server through the real ``anthropic`` client) and stopped with SIGTERM in
the middle of a model call the server holds (a streamed long reply) or of a shell tool
call. The figures are the wall time from the signal to the process's exit and the CPU
time the process spent in between (its rusage at exit less what it had used before).

On a busy node a pod with a small CPU request gets a small share of a CPU: here the
runner runs at ``nice 19`` (CFS weight 15 against 1024) while ``--load`` busy processes
at nice 0 keep the CPUs full, so it gets about 1.5% of a CPU, as a 10m-request pod next to
busy neighbours does. The load starts once the runner is in its call (a pod that was
running when the node got busy) and stops at its exit.

Two ways to end the process are compared: ``python -m alpineagents`` as the pod runs it
(it ends at once once the run reported: ``alpineagents.runner.run.end_process``), and the
same command ended through Python's own finalization, which is how every runner ended
before (``raise SystemExit(main())``). Results go to ``benchmarks/results/graceful_stop.md``.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import date
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "operator"), str(REPO)]

from alpineagents.testing import ModelServer, hold, reply, tool_use  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "graceful_stop.md"
DEADLINE = 300.0  # seconds a runner may take to reach its call or to stop: a safety net
EXITS = {
    "end_process (python -m alpineagents)": ["-m", "alpineagents"],
    "Python's finalization (before)": [
        "-c",
        "from alpineagents.cli import main; raise SystemExit(main())",
    ],
}
CALLS = ("model call", "tool call")


def manifest(folder: Path, call: str) -> Path:
    spec: dict[str, object] = {"model": "claude-sonnet-5", "prompt": "Do the job."}
    if call == "tool call":
        spec["tools"] = ["shell"]
    else:
        spec["maxTokens"] = 32000  # a long reply: streamed, as a real one would be
    path = folder / "job.yaml"
    body = {"apiVersion": "alpineagents.dev/v1", "kind": "AgentRun", "metadata": {"name": "job"}}
    path.write_text(yaml.safe_dump({**body, "spec": spec}))
    return path


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def low_priority_group() -> None:
    os.setpgid(0, 0)
    os.nice(19)


@contextmanager
def busy_cpus(count: int) -> Iterator[None]:
    """``count`` processes spinning at nice 0 for the length of the block."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        time.sleep(0.5)  # the scheduler sees them busy before the signal
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def one_stop(
    server: ModelServer, work: Path, exit_args: list[str], call: str, load: int
) -> tuple[float, float]:
    """Wall and CPU seconds from SIGTERM to the exit of one runner."""
    if call == "tool call":
        server.add(reply(tool_use("shell", {"command": "echo started > started; sleep 600"})))
    else:
        server.add(hold(reply("A long essay.")))
    folder = Path(tempfile.mkdtemp(dir=work))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ALPINEAGENTS_", "ANTHROPIC_"))}
    env.update(
        ANTHROPIC_BASE_URL=server.url,
        ANTHROPIC_API_KEY="test",
        PYTHONPATH=str(REPO / "operator"),
        TERMINATION_MESSAGE_PATH=str(folder / "termination-log"),
    )
    requests = len(server.requests)
    runner = subprocess.Popen(
        [
            sys.executable,
            *exit_args,
            "run",
            str(manifest(folder, call)),
            "--store",
            str(folder / "runs"),
        ],
        cwd=folder,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        # A process group of its own (its shell command too is killed at the end), in the
        # benchmark's session: a new session would be a scheduling group of its own
        # (autogroup), where its nice value would weigh nothing against the load.
        preexec_fn=low_priority_group,
    )
    try:
        server.wait_for_requests(requests + 1, timeout=DEADLINE)
        if call == "tool call":
            deadline = time.monotonic() + DEADLINE
            while not (folder / "started").exists():
                if time.monotonic() > deadline:
                    raise TimeoutError("the tool call never started")
                time.sleep(0.05)
        with busy_cpus(load) if load else _nothing():
            before = cpu_seconds(runner.pid)
            started = time.perf_counter()
            runner.send_signal(signal.SIGTERM)
            _, status, usage = os.wait4(runner.pid, 0)
            wall = time.perf_counter() - started
        code = os.waitstatus_to_exitcode(status)
        if code != 143:
            raise RuntimeError(f"the runner exited {code}, not 143")
        return wall, usage.ru_utime + usage.ru_stime - before
    finally:
        server.release()
        if runner.returncode is None and runner.poll() is None:
            runner.kill()
            runner.wait()
        with suppress(ProcessLookupError):
            os.killpg(runner.pid, signal.SIGKILL)


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def median(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--load", type=int, default=os.cpu_count() or 2, help="busy processes")
    args = parser.parse_args()
    load_at_start = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory() as scratch, ModelServer() as server:
        work = Path(scratch)
        for call in CALLS:
            for load in (0, args.load):
                for name, exit_args in EXITS.items():
                    walls, cpus = [], []
                    for _ in range(args.repeats):
                        wall, cpu = one_stop(server, work, exit_args, call, load)
                        walls.append(wall)
                        cpus.append(cpu)
                        print(
                            f"{call}, load {load}, {name}: wall {wall:.2f} s, cpu {cpu:.3f} s",
                            flush=True,
                        )
                    rows.append((call, load, name, walls, cpus))
    lines = [
        "# A runner's graceful stop: SIGTERM to exit",
        "",
        f"Written by `benchmarks/graceful_stop.py` on {date.today().isoformat()}, "
        f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
        f"load average {' / '.join(f'{x:.1f}' for x in load_at_start)} at the start (a shared "
        f"machine). Median (lowest-highest) of {args.repeats} stops each. The runner runs at "
        f"nice 19; under load, {args.load} busy processes at nice 0 keep every CPU full from "
        "just before the signal to the exit (the runner then gets about 1.5% of a CPU, like a "
        "10m-request pod next to busy neighbours).",
        "",
        "| stopped in | CPU load | how the process ends | SIGTERM → exit, wall (s) | CPU spent (s) |",
        "|---|---|---|---:|---:|",
    ]
    for call, load, name, walls, cpus in rows:
        busy = f"{load} busy processes" if load else "idle"
        lines.append(f"| {call} | {busy} | {name} | {median(walls)} | {median(cpus)} |")
    lines += [
        "",
        "Before, nearly all of a stop was Python's finalization: its garbage collection "
        "over every object the runner had loaded (the anthropic SDK, the store's client), "
        "after the State was saved and the termination message written. At a few percent "
        "of a CPU that alone outlasts a 30 s grace period. Now the runner sends its last "
        "spans (at most 5 s), flushes its streams and ends (`os._exit`). The model call "
        "is not waited for in either: the request is cancelled and its connection closed.",
        "",
    ]
    RESULTS.write_text("\n".join(lines))
    print(RESULTS.read_text())


if __name__ == "__main__":
    main()
