"""Operator failover: from the leader's loss to the next reconcile, by the standby.

Run from the repository root::

    python -m benchmarks.failover [--trials 20] [--runs 20]

Part of ``python -m benchmarks`` too (section ``failover``; section ``failover-node`` is
the same on the real node, :mod:`benchmarks.node_failover`). It needs only a control plane
(the bench's etcd + kube-apiserver, no node: pods stay Pending, which is all "the run has
its pod" asks) and runs the operator as its own processes, two at a time, each a replica
with the chart's Lease election settings (``operator.leaderElection`` in
``charts/alpineagents/values.yaml``). ``--runs`` AgentRuns exist throughout, so each new
leader resumes them all while it takes over.

Each trial: the standby has read the Lease; the leader is SIGKILLed (a lost pod or node:
no Lease handed back) and at once an AgentRun is created. *Lease taken*: kill → the
Lease's MODIFIED event naming the standby; *next reconcile*: kill → the new run's pod
ADDED, both from watches held here. Then a new process starts as the next standby. The
same again with SIGTERM (a drain or a rolling upgrade: the leader hands the Lease back).
After the trials every run has exactly one pod (checked: a failover re-ran nothing).
Results go to ``benchmarks/results/failover.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import REPO

if TYPE_CHECKING:
    from .results_page import Page
    from .sizes import Sizes

NAMESPACE = "failover"
LEASE = "alpineagents-operator"
RESULTS = REPO / "benchmarks" / "results" / "failover.md"
_WHY_NOT_PEERING = (
    "Why a Lease of our own and not kopf's peering (read in kopf 1.45's "
    "`_core/engines/peering.py`): peers of the same priority (the replicas of one "
    "Deployment) only warn about each other and all keep acting; a dead peer counts until "
    "its record's lifetime (60 s by default, renewed 5-10 s before it ends) runs out, so "
    "a takeover takes about a minute; a paused peer still finishes the handlers it "
    "started, and a peer cut off from the API server never pauses itself; and it needs "
    "kopf's peering CRDs. The Lease needs only get and update on one object, takes over "
    "in the lease's time, and a leader that cannot renew exits before its lease can be "
    "taken."
)


@dataclass
class Failovers:
    """Seconds from the leader's loss, per trial."""

    lease_taken: list[float] = field(default_factory=list)
    next_reconcile: list[float] = field(default_factory=list)


@dataclass
class Measured:
    killed: Failovers = field(default_factory=Failovers)
    stopped: Failovers = field(default_factory=Failovers)
    runs: int = 0
    timing: Any = None  # the LeaseTiming the replicas ran with
    pods: int = 0  # pods ADDED over the whole benchmark
    new_runs: int = 0


@contextlib.contextmanager
def _plane(workdir: Path) -> Iterator[Any]:
    from tests.bench.control_plane import start_control_plane

    with contextlib.ExitStack() as stack:
        plane = start_control_plane(stack, workdir / "plane")
        plane.apply_crds()
        plane.kubectl("create", "namespace", NAMESPACE)
        yield plane


def chart_timing() -> Any:
    """The chart's default Lease settings, as the bench's operator processes take them."""
    import yaml
    from tests.bench.operator_process import LeaseTiming

    values = yaml.safe_load((REPO / "charts" / "alpineagents" / "values.yaml").read_text())
    election = values["operator"]["leaderElection"]
    return LeaseTiming(
        int(election["leaseSeconds"]),
        float(election["renewDeadlineSeconds"]),
        float(election["retrySeconds"]),
    )


def measure(workdir: Path, trials: int, runs: int) -> Measured:
    """``trials`` SIGKILLed leaders and ``trials`` SIGTERMed ones, ``runs`` runs around."""
    from tests.bench.operator_process import (
        EventLog,
        OperatorProcess,
        agentrun,
        held_by,
        operator_kubeconfig,
        pod_added,
    )

    result = Measured(runs=runs, timing=chart_timing())
    store = workdir / "runs"
    store.mkdir()
    with _plane(workdir) as plane:
        kubeconfigs = [operator_kubeconfig(plane, NAMESPACE, n, workdir) for n in ("a", "b")]
        started: list[OperatorProcess] = []

        def replica(number: int) -> OperatorProcess:
            process = OperatorProcess(
                f"replica-{number}",
                kubeconfigs[number % 2],
                NAMESPACE,
                store,
                workdir / f"replica-{number}.log",
                lease=f"{NAMESPACE}/{LEASE}",
                timing=result.timing,
            )
            process.start()
            started.append(process)
            return process

        api = plane.api_client()
        with (
            EventLog(api, NAMESPACE, "leases") as leases,
            EventLog(api, NAMESPACE, "pods") as pods,
        ):
            try:
                leader = replica(0)
                leases.wait_for(held_by("replica-0"))
                names = [f"run-{n:03d}" for n in range(runs)]
                plane.kubectl(
                    "create", "-f", "-", input="\n".join(agentrun(NAMESPACE, n) for n in names)
                )
                for name in names:
                    pods.wait_for(pod_added(name))
                number = 1
                for kind, failovers in (("kill", result.killed), ("stop", result.stopped)):
                    for _ in range(trials):
                        standby = replica(number)
                        _wait_standing_by(standby)
                        new_run = f"after-{number:03d}"
                        lost_at = time.monotonic()
                        if kind == "kill":
                            leader.kill()
                        else:
                            leader.stop()  # returns once it exited: the Lease handed back
                        plane.kubectl("create", "-f", "-", input=agentrun(NAMESPACE, new_run))
                        taken = leases.wait_for(held_by(f"replica-{number}"), after=lost_at)
                        pod = pods.wait_for(pod_added(new_run))
                        failovers.lease_taken.append(taken.at - lost_at)
                        failovers.next_reconcile.append(pod.at - lost_at)
                        result.new_runs += 1
                        leader, number = standby, number + 1
            finally:
                for process in started:
                    process.stop()
            result.pods = sum(1 for e in pods.events if e.type == "ADDED")
    if result.pods != result.runs + result.new_runs:
        raise RuntimeError(
            f"{result.pods} pods for {result.runs + result.new_runs} runs: a failover "
            "created a pod twice"
        )
    return result


def _wait_standing_by(process: Any) -> None:
    """Until the new replica has read the Lease (its log says so: a file, polled)."""
    deadline = time.monotonic() + 300
    while "standing by: Lease" not in process.log_text():
        if time.monotonic() > deadline or (process.process and process.process.poll()):
            raise RuntimeError(f"{process.name} did not stand by:\n{process.log_text()[-2000:]}")
        time.sleep(0.05)


def _line(label: str, values: list[float]) -> list[str]:
    from .measure import percentile

    return [
        label,
        str(len(values)),
        f"{percentile(values, 0.5):.2f} s",
        f"{percentile(values, 0.95):.2f} s",
        f"{max(values):.2f} s",
    ]


def report(result: Measured) -> list[str]:
    """The results as Markdown lines."""
    from .results_page import table

    t = result.timing
    return [
        "## Operator failover (two replicas, Lease election)",
        "",
        *table(
            ["the leader was", "trials", "p50", "p95", "max"],
            [
                _line("SIGKILLed → Lease taken by the standby", result.killed.lease_taken),
                _line("SIGKILLed → next reconcile (a new run's pod)", result.killed.next_reconcile),
                _line("SIGTERMed → Lease taken by the standby", result.stopped.lease_taken),
                _line(
                    "SIGTERMed → next reconcile (a new run's pod)", result.stopped.next_reconcile
                ),
            ],
        ),
        "",
        f"Two `python -m alpineagents_operator` processes on the bench's kube-apiserver, "
        f"{result.runs} AgentRuns around (each new leader resumes them all); lease "
        f"{t.lease_seconds} s, renew deadline {t.renew_deadline_seconds:g} s, retry "
        f"{t.retry_seconds:g} s: the chart's defaults (`operator.leaderElection`). A killed "
        "leader's Lease is "
        "taken once it has not been renewed for the lease, counted on the standby's clock "
        "from when it saw the last renewal; then kopf starts in the standby (already "
        "imported), lists the runs and handles the new one. A stopped leader hands the "
        "Lease back as it exits, so the standby takes it at its next look. "
        f"{result.pods} pods for {result.runs + result.new_runs} runs: no run got a second "
        "pod.",
        "",
        _WHY_NOT_PEERING,
    ]


def section(page: Page, work: Path, repeats: int, sizes: Sizes, postgres: str | None) -> None:
    """Failover of the operator's leader (20 kills and 20 stops; ``repeats`` unused)."""
    from .results_page import Row
    from .sizes import ORDER

    del repeats, postgres
    page.order = ORDER
    what = (
        "operator failover, control plane only (replicas as processes, no pods: nothing says "
        "the leader died, as when it is lost with its node, so the Lease runs out): leader "
        "SIGKILLed → the standby's next reconcile; leader SIGTERMed (a drain, an upgrade: it "
        "hands the Lease back) → the same (p50 / p95)"
    )
    goal = (
        "SIGKILLed: p95 under the lease + retry + 5 s (the takeover's own goal of 5 s "
        "after the Lease can first be taken; a crash the kubelet reports is the "
        "failover-node row, under 5 s); SIGTERMed: p95 under 5 s"
    )
    try:
        result = measure(work, sizes.failover_trials, sizes.failover_runs)
    except Exception as error:  # the control plane's binaries are missing
        page.rows["failover"] = Row(what, "-", goal, None)
        page.not_measured.append(f"Operator failover: {error}")
        return
    from .measure import percentile

    times = result.killed.next_reconcile
    stops = result.stopped.next_reconcile
    t = result.timing
    bound = t.lease_seconds + t.retry_seconds + 5.0
    page.rows["failover"] = Row(
        what,
        f"SIGKILLed: {percentile(times, 0.5):.1f} / {percentile(times, 0.95):.1f} s (Lease "
        f"taken {percentile(result.killed.lease_taken, 0.5):.1f} / "
        f"{percentile(result.killed.lease_taken, 0.95):.1f} s; the bound {bound:g} s); "
        f"SIGTERMed: {percentile(stops, 0.5):.1f} / {percentile(stops, 0.95):.1f} s; "
        f"{result.pods} pods for {result.runs + result.new_runs} runs",
        goal,
        percentile(times, 0.95) < bound and percentile(stops, 0.95) < 5.0,
        f"{len(times)} kills, {len(stops)} stops",
        judged_over=min(len(times), len(stops)),
        setting=f"the chart's Lease {t.lease_seconds} / {t.renew_deadline_seconds:g} / "
        f"{t.retry_seconds:g} s; the bench's control plane, replicas as processes, no node",
    )
    page.sections.append(report(result))


def main() -> None:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=20, help="kills, and stops (20 each)")
    parser.add_argument("--runs", type=int, default=20, help="AgentRuns around (20)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="alpineagents-failover-") as folder:
        result = measure(Path(folder), args.trials, args.runs)
    from .measure import load_average, machine

    lines = [
        "# Operator failover",
        "",
        f"Measured by `python -m benchmarks.failover --trials {args.trials} --runs "
        f"{args.runs}` on {time.strftime('%Y-%m-%d')}. Machine: {machine()}; load average "
        f"{load_average()} at the end (the machine is shared).",
        "",
        *report(result)[2:],
    ]
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
