"""A fleet on one key: many ``alpineagents run`` processes share one rate limit.

``python -m benchmarks.fleet [--runs 30,100] [--out benchmarks/results/fleet.md]``

Each run is a real runner process (``alpineagents run``, the shipped defaults) of six model
requests (five tool calls, then an answer) against the scripted Messages API limited like
the real one (:class:`alpineagents.testing.RateLimits`: requests and input tokens per
minute as token buckets with 3 s of burst, ``429 rate_limit_error`` with ``retry-after``,
the ``anthropic-ratelimit-*`` headers on every answer). All start together. Side by side,
in one pass, the fleet is run three ways:

- *before*: the code before pacing (``--before``, a commit; checked out with ``git
  worktree`` beside this one), which retried a 429 five times and exited 75;
- *headers*: this code, each process pacing by the headers alone;
- *shared*: this code with the shared limiter (``alpineagents pacer`` with its defaults:
  limits learned from the answers' headers), two thirds of the runs in share ``team-a``
  and one third in ``team-b``, weighted 1:1.

Figures, judged by code (:data:`GOALS`): runs that answered; 429s among all requests;
makespan (first request to last answer) over the ideal (answered requests / the limit);
the slowest run's time from its first request to its end over the median; and, while both
shares have runs waiting, each share's part of the answered requests (equal weights:
within 10 % of each other).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from alpineagents.testing import ModelServer, RateLimits, reply, tool_use
from alpineagents.testing.script import Turn

from . import REPO
from .measure import load_average, machine, percentile

REQUESTS_PER_RUN = 6
BEFORE = "695ceab"  # the last commit before pacing
LIMITS = {30: 120, 100: 400}  # runs: requests per minute (the ideal makespan: 90 s each)
GOALS = {
    "answered": "every run",
    "refused": "429s at most 5 % of requests",
    "makespan": "at most 1.15x the ideal",
    "slowest": "slowest run at most 1.3x the median",
    "shares": "two shares weighted 1:1 within 10 % of each other",
}
RUN_DEADLINE = 900.0


@dataclass
class Fleet:
    """One pass of one way: what the runs and the server saw."""

    way: str
    runs: int
    per_minute: int
    exit_codes: list[int] = field(default_factory=list)
    requests: int = 0
    refused: int = 0
    answered_at: list[tuple[float, str]] = field(default_factory=list)  # time, share
    run_spans: list[float] = field(default_factory=list)  # first request to end, per run
    first_request: float = 0.0
    last_answer: float = 0.0

    @property
    def answered_runs(self) -> int:
        return sum(1 for code in self.exit_codes if code == 0)

    @property
    def refused_share(self) -> float:
        return self.refused / self.requests if self.requests else 0.0

    @property
    def makespan_ratio(self) -> float:
        answered = len(self.answered_at)
        ideal = answered / (self.per_minute / 60.0)
        return (self.last_answer - self.first_request) / ideal if ideal else 0.0

    @property
    def slowest_ratio(self) -> float:
        if not self.run_spans:
            return 0.0
        return max(self.run_spans) / percentile(self.run_spans, 0.5)

    def shares(self) -> dict[str, int]:
        """Answered requests per share while both shares still had runs going."""
        last: dict[str, float] = {}
        for at, share in self.answered_at:
            last[share] = max(last.get(share, 0.0), at)
        if len(last) < 2:
            return {}
        until = min(last.values())
        counts: dict[str, int] = {share: 0 for share in last}
        for at, share in self.answered_at:
            if at <= until:
                counts[share] += 1
        return counts

    def met(self) -> dict[str, bool]:
        shares = self.shares()
        low, high = (min(shares.values()), max(shares.values())) if shares else (0, 0)
        return {
            "answered": self.answered_runs == self.runs,
            "refused": self.refused_share <= 0.05,
            "makespan": 0 < self.makespan_ratio <= 1.15,
            "slowest": 0 < self.slowest_ratio <= 1.3,
            "shares": bool(shares) and high > 0 and (high - low) / high <= 0.10,
        }


def _responder(share_of: Mapping[str, str], answered: list[tuple[float, str]]) -> Any:
    """Five tool calls, then the answer; each answered request noted with its run's share."""
    lock = threading.Lock()

    def respond(body: Mapping[str, Any]) -> Turn:
        messages = body.get("messages") or []
        first = messages[0]["content"] if messages else ""
        text = first if isinstance(first, str) else first[0].get("text", "")
        run = text.split()[1] if text.startswith("fleet ") else "?"
        with lock:
            answered.append((time.monotonic(), share_of.get(run, "default")))
        calls = sum(1 for m in messages if m.get("role") == "assistant")
        if calls < REQUESTS_PER_RUN - 1:
            return reply("Reading.", tool_use("read_file", {"path": "notes.txt"}))
        return reply("Done.")

    return respond


def _manifest(folder: Path, run: str) -> Path:
    path = folder / f"{run}.yaml"
    spec = {
        "apiVersion": "alpineagents.dev/v1",
        "kind": "AgentRun",
        "metadata": {"name": run},
        "spec": {
            "model": "claude-sonnet-5",
            "prompt": f"fleet {run} read notes",
            "tools": ["read_file"],
        },
    }
    path.write_text(json.dumps(spec))
    return path


def run_fleet(way: str, runs: int, per_minute: int, source: Path, work: Path, pacer: bool) -> Fleet:
    """One fleet of ``runs`` processes of the code at ``source`` against a fresh limit."""
    fleet = Fleet(way, runs, per_minute)
    folder = work / f"{way}-{runs}"
    folder.mkdir(parents=True)
    (folder / "notes.txt").write_text("a line of notes\n")
    names = [f"run-{i:03d}" for i in range(runs)]
    share_of = {name: ("team-a" if i % 3 else "team-b") for i, name in enumerate(names)}
    answered: list[tuple[float, str]] = []
    limits = RateLimits(requests_per_minute=per_minute, input_tokens_per_minute=per_minute * 2000)
    with ModelServer(respond=_responder(share_of, answered), limits=limits) as server:
        env = {**os.environ, **server.env, "PYTHONPATH": str(source / "operator")}
        env.pop("ALPINEAGENTS_PACER", None)
        limiter = None
        if pacer:
            limiter = subprocess.Popen(
                [sys.executable, "-m", "alpineagents", "pacer", "--port", "0"],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            assert limiter.stdout is not None
            env["ALPINEAGENTS_PACER"] = limiter.stdout.readline().strip()
        try:
            processes = []
            for name in names:
                run_env = {**env, "ALPINEAGENTS_PACER_SHARE": share_of[name]}
                command = [
                    sys.executable,
                    "-m",
                    "alpineagents",
                    "run",
                    str(_manifest(folder, name)),
                    "--store",
                    str(folder / "store"),
                    "--log-format",
                    "json",
                ]
                log = (folder / f"{name}.log").open("w")
                processes.append(
                    (
                        subprocess.Popen(
                            command, cwd=folder, env=run_env, stdout=subprocess.DEVNULL, stderr=log
                        ),
                        log,
                    )
                )
            deadline = time.monotonic() + RUN_DEADLINE
            for process, log in processes:
                try:
                    fleet.exit_codes.append(process.wait(max(1.0, deadline - time.monotonic())))
                except subprocess.TimeoutExpired:
                    process.kill()
                    fleet.exit_codes.append(process.wait())
                log.close()
        finally:
            if limiter is not None:
                limiter.terminate()
                limiter.wait()
        fleet.requests = len(server.requests)
        fleet.refused = server.rate_limited
    fleet.answered_at = sorted(answered)
    fleet.first_request, fleet.last_answer = _span(server, fleet)
    fleet.run_spans = [s for s in (_run_span(folder / f"{n}.log") for n in names) if s is not None]
    return fleet


def _span(server: ModelServer, fleet: Fleet) -> tuple[float, float]:
    times = [outcome.at for outcome in server.answers]
    if not times:
        return 0.0, 0.0
    answered = [at for at, _ in fleet.answered_at]
    return min(times), max(answered) if answered else max(times)


def _run_span(log: Path) -> float | None:
    """A run's time from its first model request (saved before it is sent) to its exit line."""
    first = end = None
    for line in log.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        moment = record.get("time")
        if record.get("kind") == "model_request" and first is None:
            first = moment
        if record.get("event") == "exit":
            end = moment
    if first is None or end is None:
        return None
    from datetime import datetime

    return (datetime.fromisoformat(end) - datetime.fromisoformat(first)).total_seconds()


def _checkout(rev: str, work: Path) -> Path:
    target = work / f"checkout-{rev}"
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", str(target), rev],
        check=True,
        capture_output=True,
    )
    return target


def page(fleets: list[Fleet], before: str) -> str:
    """The results page: every figure of every fleet, judged against :data:`GOALS`."""
    lines = [
        "# A fleet on one key",
        "",
        "Written by `python -m benchmarks.fleet`; each pass below is one run of that command.",
        f"Machine: {machine()}; load average before the pass: {load_average()}.",
        "",
        "| way | runs | limit (rpm) | answered | 429s | makespan / ideal | slowest / median | shares while both ran (1:1) |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for f in fleets:
        met = f.met()
        shares = f.shares()
        share_text = ", ".join(f"{k} {v}" for k, v in sorted(shares.items())) or "-"
        mark = {key: "" if ok else " (not met)" for key, ok in met.items()}
        lines.append(
            f"| {f.way} | {f.runs} | {f.per_minute} | {f.answered_runs}/{f.runs}{mark['answered']} "
            f"| {f.refused}/{f.requests} = {f.refused_share:.1%}{mark['refused']} "
            f"| {f.makespan_ratio:.2f}x{mark['makespan']} | {f.slowest_ratio:.2f}x{mark['slowest']} "
            f"| {share_text}{mark['shares'] if f.way == 'shared' else ''} |"
        )
    lines += [
        "",
        "Goals: " + "; ".join(GOALS.values()) + ". The shares goal applies to the shared limiter "
        "(the other ways have no shares).",
        f"*before* is commit {before}, the code before pacing (five tries of a 429, then exit 75).",
        "Exit codes: "
        + "; ".join(
            f"{f.way} {f.runs}: "
            + ", ".join(f"{c}x{f.exit_codes.count(c)}" for c in sorted(set(f.exit_codes)))
            for f in fleets
        ),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.fleet", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--runs", default="30,100", help="fleet sizes, comma-separated (30 and 100 have limits)"
    )
    parser.add_argument("--ways", default="before,headers,shared")
    parser.add_argument("--before", default=BEFORE, help="the commit of the code before pacing")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "fleet.md")
    args = parser.parse_args(argv)
    sizes = [int(n) for n in args.runs.split(",")]
    ways = args.ways.split(",")
    fleets = []
    with tempfile.TemporaryDirectory(prefix="fleet-") as temp:
        work = Path(temp)
        before = _checkout(args.before, work) if "before" in ways else None
        try:
            for runs in sizes:
                per_minute = LIMITS.get(runs, 120)
                for way in ways:
                    source = before if way == "before" and before is not None else REPO
                    fleet = run_fleet(way, runs, per_minute, source, work, pacer=way == "shared")
                    print(
                        json.dumps(
                            {
                                "way": way,
                                "runs": runs,
                                **fleet.met(),
                                "refused": fleet.refused_share,
                                "makespan": fleet.makespan_ratio,
                                "slowest": fleet.slowest_ratio,
                                "shares": fleet.shares(),
                            }
                        ),
                        flush=True,
                    )
                    fleets.append(fleet)
        finally:
            if before is not None:
                subprocess.run(
                    ["git", "-C", str(REPO), "worktree", "remove", "--force", str(before)],
                    check=False,
                )
                shutil.rmtree(before, ignore_errors=True)
    args.out.write_text(page(fleets, args.before))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
