"""A standby runner on this machine (no pod): its hand-over, and what it costs waiting.

``python -m benchmarks.standby_local --out X``. The runner's own share of a resume, the
part a warm pool saves besides the pod's start: a local MinIO (the bench's binary) as
the store, the scripted model (echo) on loopback, the runner as a child process.

- *hand-over*: a standby (``ALPINEAGENTS_STANDBY_ID`` set, imported and polling) is
  given an assignment for a saved State; timed from the assignment's PUT to the first
  entry the run saves (the entry's own time stamp).
- *fresh process*: ``alpineagents run`` started for the same kind of State, as a new pod
  runs it; timed from the process's start to its first saved entry. A pod adds its own
  start (sandbox, container) before that, about 1.5 s on the bench's real node
  (``benchmarks/results/resume_latency.md``).
- *idle*: a waiting standby's resident memory, and its CPU time over
  :data:`IDLE_SECONDS` (it asks the store for its assignment five times a second).

Processes here are not in containers and share the machine with whatever runs on it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path

from tests.bench.minio_server import start_minio

from alpineagents import Message, State, open_store
from alpineagents.pod_contract import Assignment
from alpineagents.store.s3.standby_boxes import StandbyBoxes
from alpineagents.testing import ModelServer

from . import REPO
from .measure import load_average, machine, percentile

IDLE_SECONDS = 30.0
DEADLINE = 120.0  # a safety net, never a measurement
SPEC = {"model": "claude-sonnet-5", "prompt": "hi", "maxTurns": 2}


def first_entry_after(url: str, env: dict[str, str], state_id: str, since: float) -> float:
    """The time stamp of the first entry of ``state_id`` saved after ``since`` (waits)."""
    store = open_store(url, env=env)
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        record = store.read(state_id)
        if record is not None:
            times = [datetime.fromisoformat(str(e["time"])).timestamp() for e in record.entries]
            after = [t for t in times if t > since]
            if after:
                return min(after)
        time.sleep(0.05)  # polling the store from outside: not part of what is timed
    raise TimeoutError(f"{state_id}: nothing saved")


def saved_state(url: str, env: dict[str, str]) -> str:
    state_id = f"bench.{uuid.uuid4().hex[:12]}"
    open_store(url, env=env).save(State(state_id, [Message.user("hi")]))
    return state_id


def child(args: list[str], env: dict[str, str], work: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "alpineagents", *args],
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def base_env(model: ModelServer, key: dict[str, str], url: str, tmp: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ALPINEAGENTS_", "ANTHROPIC_", "AWS_"))
    }
    env.update(model.env, **key, ALPINEAGENTS_STORE=url, TMPDIR=str(tmp))
    env["PYTHONPATH"] = str(REPO / "operator")
    env["TERMINATION_MESSAGE_PATH"] = str(tmp / "termination-log")
    return env


def cpu_and_rss(pid: int) -> tuple[float, float]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    rss = next(
        int(line.split()[1]) / 1024
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith("VmRSS:")
    )
    return cpu, rss


def measure(work: Path, rounds: int) -> tuple[list[float], list[float], tuple[float, float]]:
    key = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": uuid.uuid4().hex}
    server = start_minio(work / "minio", key["AWS_ACCESS_KEY_ID"], key["AWS_SECRET_ACCESS_KEY"])
    handed: list[float] = []
    fresh: list[float] = []
    try:
        url = f"s3://pool/runs?endpoint={server.endpoint}&secure=false"
        boxes = StandbyBoxes.open(url, key)
        with ModelServer(echo=True) as model:
            for n in range(rounds + 1):  # the first of each: a warm-up (page cache)
                tmp = work / f"tmp-{n}"
                tmp.mkdir()
                env = base_env(model, key, url, tmp)
                # A standby, imported and polling.
                standby_id = uuid.uuid4().hex
                standby = child(["run"], {**env, "ALPINEAGENTS_STANDBY_ID": standby_id}, tmp)
                time.sleep(5.0)  # its start is not what is timed here
                state_id = saved_state(url, key)
                put_at = time.time()
                boxes.put(standby_id, Assignment("bench", "r", SPEC, state_id, 2, url, None))
                saved = first_entry_after(url, key, state_id, put_at)
                standby.wait(DEADLINE)
                # A fresh process for the same kind of State.
                state_id = saved_state(url, key)
                started_at = time.time()
                spec_env = {
                    "ALPINEAGENTS_SPEC": '{"model": "claude-sonnet-5", "prompt": "hi", "maxTurns": 2}',
                    "ALPINEAGENTS_STATE_ID": state_id,
                    "ALPINEAGENTS_ATTEMPT": "2",
                }
                process = child(["run"], {**env, **spec_env}, tmp)
                first = first_entry_after(url, key, state_id, started_at)
                process.wait(DEADLINE)
                if n:
                    handed.append(saved - put_at)
                    fresh.append(first - started_at)
            # Idle cost of one waiting standby.
            tmp = work / "tmp-idle"
            tmp.mkdir()
            idle = child(
                ["run"], {**base_env(model, key, url, tmp), "ALPINEAGENTS_STANDBY_ID": "idle"}, tmp
            )
            try:
                time.sleep(5.0)  # imported and polling
                cpu_before, _ = cpu_and_rss(idle.pid)
                time.sleep(IDLE_SECONDS)  # the measured interval itself
                cpu_after, rss = cpu_and_rss(idle.pid)
            finally:
                idle.kill()
                idle.wait()
    finally:
        server.stop()
    return handed, fresh, (rss, (cpu_after - cpu_before) / IDLE_SECONDS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.standby_local")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    began = time.time()
    with tempfile.TemporaryDirectory(prefix="alpineagents-standby-") as folder:
        handed, fresh, (rss, cpu) = measure(Path(folder), args.rounds)

    def cell(values: list[float]) -> str:
        return f"{percentile(values, 0.5):.2f} / {percentile(values, 0.95):.2f} s"

    lines = [
        "# A standby runner on this machine (no pod)",
        "",
        f"Measured by `python -m benchmarks.standby_local --rounds {args.rounds}` on "
        f"{time.strftime('%Y-%m-%d', time.gmtime(began))}. Machine: {machine()}; load "
        f"average {load_average()} at the end (the machine is shared).",
        "",
        "The runner's own part of a resume, p50 / p95 (local MinIO, the scripted model):",
        "",
        "| runner | to the first saved entry |",
        "|---|---:|",
        f"| a waiting standby: the assignment's PUT → first saved entry | {cell(handed)} |",
        f"| a fresh `alpineagents run`: process start → first saved entry | {cell(fresh)} |",
        "",
        f"A waiting standby (imported, polling every 0.2 s): {rss:.0f} MiB resident, "
        f"{cpu * 100:.1f} % of one CPU over {IDLE_SECONDS:.0f} s.",
        "",
        "A new pod adds its own start before the fresh process (scheduling, sandbox, "
        "container: about 1.5 s p50 on the bench's real node, "
        "`benchmarks/results/resume_latency.md`); a standby has paid all of it before the loss.",
        "",
    ]
    args.out.write_text("\n".join(lines), encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
