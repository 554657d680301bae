"""``kubectl drain`` of a real node carrying 20 runs: how long until every run resumed.

Run from the repository root (root, the bench's real node; see
:mod:`benchmarks.resume_latency`)::

    flock /tmp/real-node.lock python -m benchmarks.drain [--runs 20]

Part of ``python -m benchmarks`` too (section ``drain``). The bench's cluster runs three
kubelets: ``node-0`` (the chart, installed with its defaults: two operator replicas with
their PodDisruptionBudget, the bundled MinIO, the echo model) and the workers ``node-1``
and ``node-2``. The runs start on ``node-1`` (the other two cordoned meanwhile), each held
in its one tool call by the bench's :class:`~tests.bench.tool_gate.ToolGate`. Then
``kubectl drain node-1 --ignore-daemonsets --delete-emptydir-data``: every pod is
evicted (SIGTERM: the runner saves the call as aborted and exits 143), and the operator
resumes each run in a new pod on another node.

Times, from just before the drain command:

- *drain done*: ``kubectl drain`` returned (every evicted pod gone);
- *replacement created*: the ADDED event of a run's second pod, on a pod watch held here;
- *resumed*: the first entry the second pod saved (its ``time`` stamp, read back from the
  store once the runs finished): the run goes on from where it was.

After the runs end: every run Succeeded in attempt 2 on a node that was not drained, its
call started once in all (the gate's count) and its history kept every entry saved before
the drain. Results go to ``benchmarks/results/drain.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from . import REPO
from .resume_latency import (
    NAMESPACE,
    NodeUnavailable,
    PodWatch,
    entry_times,
    kubelet_version,
    pod_added,
    real_node,
    run_manifest,
    wait_all_succeeded,
)
from .sizes import ORDER

if TYPE_CHECKING:
    from .results_page import Page
    from .sizes import Sizes

RESULTS = REPO / "benchmarks" / "results" / "drain.md"
CONTROL_PLANE_NODE, DRAINED, OTHER_WORKER = "node-0", "node-1", "node-2"


@dataclass
class Drained:
    """Seconds from the start of the drain, per run, and what the runs ended as."""

    runs: int
    drain_done: float = 0.0
    created: list[float] = field(default_factory=list)
    resumed: list[float] = field(default_factory=list)
    landed: dict[str, int] = field(default_factory=dict)  # node → runs resumed there
    load: tuple[float, float, float] = (0.0, 0.0, 0.0)


def _pods(cluster: Any) -> dict[str, dict[str, Any]]:
    listing = cluster.kubectl("get", "pods", "-n", NAMESPACE, "-o", "json").stdout
    return {p["metadata"]["name"]: p for p in json.loads(listing)["items"]}


def measure(workdir: Path, runs: int) -> Drained:
    """Drain a node carrying ``runs`` held runs; see the module docstring."""
    from tests.bench.node_network import TEST_SERVERS_ADDRESS
    from tests.bench.tool_gate import ToolGate

    result = Drained(runs)
    with real_node(workdir) as cluster:
        cluster.add_node(DRAINED)
        cluster.add_node(OTHER_WORKER)
        gate = ToolGate(TEST_SERVERS_ADDRESS)
        gate.start()
        watch = PodWatch(cluster.plane.api_client())
        try:
            watch.start()
            names = [f"drain-{uuid.uuid4().hex[:6]}" for _ in range(runs)]
            cluster.kubectl("cordon", CONTROL_PLANE_NODE, OTHER_WORKER)
            try:
                documents = [run_manifest(n, gate.command(n)) for n in names]
                cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(documents))
                for name in names:
                    gate.wait_started(name, timeout=600)
            finally:
                cluster.kubectl("uncordon", CONTROL_PLANE_NODE, OTHER_WORKER)
            pods = _pods(cluster)
            misplaced = [n for n in names if pods[f"{n}-1"]["spec"]["nodeName"] != DRAINED]
            if misplaced:
                raise RuntimeError(f"runs not on {DRAINED}: {misplaced}")
            # What each run saved before the drain (its State id is in its status).
            listing = json.loads(
                cluster.kubectl("get", "agentruns", "-n", NAMESPACE, "-o", "json").stdout
            )
            state_ids = {
                r["metadata"]["name"]: r["status"]["stateId"]
                for r in listing["items"]
                if r["metadata"]["name"] in names
            }
            # Each entry's time stands for the entry: a lost one shows as a missing time.
            before = entry_times(cluster, list(state_ids.values()))

            result.load = os.getloadavg()
            started = time.time()
            cluster.kubectl(
                "drain", DRAINED, "--ignore-daemonsets", "--delete-emptydir-data",
                "--timeout=600s", timeout=660,
            )  # fmt: skip
            result.drain_done = time.time() - started
            created = {n: watch.wait_for(pod_added(f"{n}-2"), f"{n}-2 created").at for n in names}
            states = wait_all_succeeded(cluster, names)
            after = entry_times(cluster, list(states.values()))
            pods = _pods(cluster)
            listing = json.loads(
                cluster.kubectl("get", "agentruns", "-n", NAMESPACE, "-o", "json").stdout
            )
            statuses = {r["metadata"]["name"]: r["status"] for r in listing["items"]}
            for name in names:
                status, state_id = statuses[name], states[name]
                # A drain is a disruption, not a failure: it counts no restart.
                resumes = (status.get("attempt"), status.get("disruptions"), status.get("restarts"))
                if resumes not in ((2, 1, None), (2, 1, 0)):
                    raise RuntimeError(f"{name} did not resume exactly once: {status}")
                if gate.starts(name) != 1:
                    raise RuntimeError(f"{name}: its call started {gate.starts(name)} times")
                if after[state_id][: len(before[state_id])] != before[state_id]:
                    raise RuntimeError(f"{name}: entries saved before the drain were lost")
                node = pods[f"{name}-2"]["spec"]["nodeName"]
                if node == DRAINED:
                    raise RuntimeError(f"{name} resumed on the drained node")
                result.landed[node] = result.landed.get(node, 0) + 1
                result.created.append(created[name] - started)
                resumed = [t for t in after[state_id] if t > created[name]]
                if not resumed:
                    raise RuntimeError(f"{name}: nothing saved after its resume")
                result.resumed.append(min(resumed) - started)
            cluster.kubectl("delete", "agentruns", *names, "-n", NAMESPACE, "--wait=false")
        finally:
            watch.stop()
            gate.stop()
    return result


def report(result: Drained) -> list[str]:
    """The results as Markdown lines."""
    from .measure import percentile
    from .results_page import table

    def line(label: str, values: list[float]) -> list[str]:
        return [
            label,
            f"{percentile(values, 0.5):.1f} s",
            f"{percentile(values, 0.95):.1f} s",
            f"{max(values):.1f} s",
        ]

    landed = ", ".join(f"{n} on {node}" for node, n in sorted(result.landed.items()))
    return [
        f"## Drain of a node carrying {result.runs} runs (real nodes)",
        "",
        *table(
            ["from the start of `kubectl drain`", "p50", "p95", "all (max)"],
            [
                line("a run's replacement pod created", result.created),
                line("a run resumed (first entry its new pod saved)", result.resumed),
            ],
        ),
        "",
        f"`kubectl drain` itself returned after {result.drain_done:.1f} s (every pod "
        f"evicted and gone). {kubelet_version()}, three nodes on this machine (each a "
        "containerd and a kubelet on its own bridge); the chart with its defaults on "
        "`node-0` (two operator replicas and their PodDisruptionBudget, which the drain of "
        "a worker leaves alone; the bundled MinIO; the echo model); the runs, each held in "
        "its one tool call, on `node-1`, requesting 10m CPU. Every run resumed once, on a "
        f"node that was not drained ({landed}), its call started once in all and its "
        "history kept every entry saved before the drain. Load average (1 / 5 / 15 min) "
        f"at the drain: {' / '.join(f'{v:.1f}' for v in result.load)}; the machine's 2 CPUs "
        f"start {result.runs} pods at once, which is most of the time.",
    ]


def section(page: Page, work: Path, repeats: int, sizes: Sizes, postgres: str | None) -> None:
    """Drain of a node carrying 20 runs (``repeats`` unused)."""
    from .results_page import Row

    del repeats, postgres
    page.order = ORDER
    what = "real nodes: `kubectl drain` of a node carrying 20 runs → every run resumed elsewhere"
    goal = "all resumed, none re-ran a call, no entry lost"
    what = what.replace("20 runs", f"{sizes.drain_runs} runs")
    try:
        result = measure(work, sizes.drain_runs)
    except NodeUnavailable as error:
        page.rows["drain"] = Row(what, "-", goal, None)
        page.not_measured.append(f"Drain: {error}")
        return
    except RuntimeError as error:  # measure's checks: a run lost, re-run or misplaced
        page.rows["drain"] = Row(what, f"failed: {error}", goal, False, "1 pass")
        return
    resumed = len(result.resumed)
    page.rows["drain"] = Row(
        what,
        f"{resumed} of {result.runs} resumed, the last {max(result.resumed):.1f} s after the "
        "drain began",
        goal,
        resumed == result.runs,  # measure raises on a re-run call or a lost entry
        "1 pass",
    )
    page.sections.append(report(result))


def main() -> None:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="runs on the drained node (20)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="alpineagents-drain-") as folder:
        result = measure(Path(folder), args.runs)
    from .measure import machine

    lines = [
        "# Drain of a node carrying runs",
        "",
        f"Measured by `python -m benchmarks.drain --runs {args.runs}` on "
        f"{time.strftime('%Y-%m-%d')}. Machine: {machine()} (shared).",
        "",
        *report(result)[2:],
    ]
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
