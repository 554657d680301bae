"""One operator with up to 10,000 AgentRuns that are running: its memory, its API requests
when nothing changes, its start, and how fast it replaces one lost pod among them all.

Run from the repository root::

    python -m benchmarks.operator_runs [--runs 100,1000,10000] [--idle 90] [--losses 5]

It extends the ``operator`` section (:mod:`.operator_scale`, which measures new runs
arriving) to the steady state, with its parts: the bench's etcd + kube-apiserver only,
the operator as its own process connecting as a user of its own, its requests counted
from the API server's audit log by that user (``apiserver_request_total`` has no user
label, so it could not tell the operator's requests from the benchmark's).

The runs are made as the operator would have left them, without it: one run is created
while the operator runs, and its AgentRun (kopf's annotation, the status) and its pod
are the template for every other one, which the benchmark creates with 16 requests at a
time (the AgentRun, its status, its pod: a pod object on a plane with no node stays
Pending, which is all a running run's pod is to the operator). For each size, smallest
first (each adds runs to the ones before), with the operator stopped meanwhile:

1. **Start**: the operator starts with every run there: process start → it looked at
   every run once (its ``alpineagents_run_checks`` metric of source ``resume``, scraped
   here), with its requests meanwhile.
2. **Idle**: ``--idle`` seconds with nothing changing (three resync rounds at the
   chart's 30 s): the operator's requests per second, by kind; its RSS after.
3. **Losses**: ``--losses`` times, one run's pod deleted (one after another): the pod's
   DELETED → its replacement's ADDED, on a pod watch held here.

Results go to ``benchmarks/results/operator_runs.md``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import REPO
from .operator_checks import free_port, resumed, run_checks
from .operator_scale import (
    NAMESPACE,
    RESYNC_SECONDS,
    Operator,
    Requests,
    _runs_list,
    control_plane,
    cpu_seconds,
)

if TYPE_CHECKING:
    from .results_page import Page
    from .sizes import Sizes

RESULTS = REPO / "benchmarks" / "results" / "operator_runs.md"
TEMPLATE = "template"
CREATORS = 16
"""Requests the benchmark makes at once while it creates runs."""
DEADLINE = 1800.0  # a safety net on a busy machine, not a measure


@dataclass
class AtSize:
    """What was measured with ``runs`` AgentRuns (the template's included)."""

    runs: int
    creating_seconds: float = 0.0
    start_seconds: float = 0.0
    start_requests: Counter[str] = field(default_factory=Counter)
    start_steps: int = 0  # runs the start stepped (not only looked at)
    rss_started_mib: float = 0.0
    idle_seconds: float = 0.0
    idle_requests: Counter[str] = field(default_factory=Counter)
    idle_cpu: float = 0.0
    rss_idle_mib: float = 0.0
    peak_mib: float = 0.0
    losses: list[float] = field(default_factory=list)

    @property
    def idle_rate(self) -> float:
        return sum(self.idle_requests.values()) / self.idle_seconds


class Template:
    """The operator's own work on one run, copied onto runs made without it."""

    def __init__(self, plane: Any) -> None:
        from kubernetes import client

        api = plane.api_client()
        api.configuration.connection_pool_maxsize = CREATORS
        self._custom = client.CustomObjectsApi(api)
        self._core = client.CoreV1Api(api)
        run = self._custom.get_namespaced_custom_object(
            "alpineagents.dev", "v1", NAMESPACE, "agentruns", TEMPLATE
        )
        pod = self._core.read_namespaced_pod(f"{TEMPLATE}-1", NAMESPACE, _preload_content=False)
        self.uid = run["metadata"]["uid"]
        self.annotations = dict(run["metadata"].get("annotations") or {})
        self.spec = run["spec"]
        self.status = json.dumps(run["status"])
        pod_body = json.loads(pod.data)
        meta = pod_body["metadata"]
        kept = ("name", "namespace", "labels", "annotations", "ownerReferences")
        self.pod = json.dumps(
            {
                "metadata": {k: meta[k] for k in kept if k in meta},
                "spec": pod_body["spec"],
                "apiVersion": "v1",
                "kind": "Pod",
            }
        )

    def _for(self, text: str, name: str, uid: str) -> Any:
        from alpineagents_operator.views import state_id_for

        old_state = state_id_for(NAMESPACE, TEMPLATE, self.uid)
        text = text.replace(old_state, state_id_for(NAMESPACE, name, uid))
        return json.loads(text.replace(self.uid, uid).replace(f'"{TEMPLATE}', f'"{name}'))

    def create(self, name: str) -> None:
        """The AgentRun ``name``, its status and its pod, as the operator leaves them."""
        body = {
            "apiVersion": "alpineagents.dev/v1",
            "kind": "AgentRun",
            "metadata": {"name": name, "namespace": NAMESPACE, "annotations": self.annotations},
            "spec": self.spec,
        }
        made = self._custom.create_namespaced_custom_object(
            "alpineagents.dev", "v1", NAMESPACE, "agentruns", body
        )
        uid = made["metadata"]["uid"]
        self._custom.patch_namespaced_custom_object_status(
            "alpineagents.dev", "v1", NAMESPACE, "agentruns", name,
            {"status": self._for(self.status, name, uid)},
        )  # fmt: skip
        pod = self._for(self.pod, name, uid)
        response = self._core.create_namespaced_pod(NAMESPACE, pod, _preload_content=False)
        _ = response.data  # read to its end before the connection goes back to the pool
        response.release_conn()


def _wait(condition: Any, what: str, every: float = 0.5) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(every)  # polling a metrics page or a log: they have no change event


def measure(workdir: Path, sizes: list[int], idle: float, losses: int) -> list[AtSize]:
    from tests.bench.operator_process import EventLog

    results: list[AtSize] = []
    store = workdir / "runs"
    store.mkdir()
    with control_plane(workdir) as plane:
        operator = Operator(plane.client_kubeconfig("operator"), store, workdir / "operator.log")
        port = free_port()
        operator.env["ALPINEAGENTS_METRICS_PORT"] = str(port)
        requests = Requests(plane)
        try:
            operator.start()
            plane.kubectl("create", "-f", "-", input=_runs_list([TEMPLATE]))
            _wait(lambda: _has_pod(plane), "the template run got no pod")
            time.sleep(2.0)  # its status patch and kopf's annotation are written
            operator.stop()
            template = Template(plane)
            made = 1
            lost_runs = 0
            for size in sizes:
                at = AtSize(size)
                began = time.monotonic()
                with ThreadPoolExecutor(CREATORS) as pool:
                    names = [f"run-{n:05d}" for n in range(made - 1, size - 1)]
                    list(pool.map(template.create, names))
                at.creating_seconds = time.monotonic() - began
                made = size

                time.sleep(1.0)
                requests.mark()
                began = time.monotonic()
                operator.start()
                _wait(lambda n=size: resumed(port) >= n, "the operator did not start")
                at.start_seconds = time.monotonic() - began
                at.start_steps = int(run_checks(port).get(("resume", "true"), 0))
                time.sleep(1.0)  # the audit log is written as requests finish
                at.start_requests = requests.since_mark()
                at.rss_started_mib = operator.memory_mib()[0]

                time.sleep(5.0)  # the listing's pod events are handled
                assert operator.process is not None
                cpu = cpu_seconds([operator.process.pid])
                requests.mark()
                time.sleep(idle)
                at.idle_seconds = idle
                at.idle_requests = requests.since_mark()
                at.idle_cpu = cpu_seconds([operator.process.pid]) - cpu
                at.rss_idle_mib, at.peak_mib = operator.memory_mib()

                with EventLog(plane.api_client(), NAMESPACE, "pods") as pods:
                    step = max(1, (size - 1) // losses)
                    for n in range(losses):
                        run = f"run-{(lost_runs * 7919 + n * step) % (size - 1):05d}"
                        at.losses.append(_lose(plane, pods, run))
                    lost_runs += losses
                operator.stop()
                results.append(at)
                print(_summary(at), flush=True)
        finally:
            operator.stop()
    return results


def _has_pod(plane: Any) -> bool:
    listing = plane.kubectl("get", "pods", "-n", NAMESPACE, "-o", "name").stdout
    return f"pod/{TEMPLATE}-1" in listing


def _lose(plane: Any, pods: Any, run: str) -> float:
    """Delete run ``run``'s current pod; seconds from its DELETED to its successor's ADDED."""
    current = json.loads(
        plane.kubectl("get", "agentrun", run, "-n", NAMESPACE, "-o", "json").stdout
    )["status"]
    attempt = int(current["attempt"])
    after = time.monotonic()
    plane.kubectl("delete", "pod", f"{run}-{attempt}", "-n", NAMESPACE, "--wait=false")
    gone = pods.wait_for(lambda e: e.type == "DELETED" and e.name == f"{run}-{attempt}", after)
    added = pods.wait_for(lambda e: e.type == "ADDED" and e.name == f"{run}-{attempt + 1}", after)
    return float(added.at - gone.at)


def _summary(at: AtSize) -> str:
    return (
        f"{at.runs} runs: created in {at.creating_seconds:.0f} s; start {at.start_seconds:.1f} s "
        f"({sum(at.start_requests.values())} requests, {at.start_steps} steps); RSS "
        f"{at.rss_idle_mib:.0f} MiB (peak {at.peak_mib:.0f}); idle {at.idle_rate:.2f} "
        f"requests/s {dict(at.idle_requests)}; losses {[round(x, 3) for x in at.losses]}"
    )


def report(results: list[AtSize], idle: float) -> list[str]:
    """The results as Markdown lines."""
    from .measure import percentile
    from .results_page import table

    def kinds(counts: Counter[str]) -> str:
        return ", ".join(f"{kind} {count:,}" for kind, count in counts.most_common()) or "none"

    rows = [
        [
            f"{at.runs:,}",
            f"{at.start_seconds:.1f} s",
            f"{sum(at.start_requests.values()):,} ({at.start_steps:,} steps)",
            f"{at.rss_started_mib:.0f} MiB",
            f"{at.rss_idle_mib:.0f} MiB ({at.peak_mib:.0f})",
            f"{at.idle_rate:.2f}",
            f"{at.idle_cpu / at.idle_seconds * 100:.1f} %",
            f"{percentile(at.losses, 0.5):.2f} s / {max(at.losses):.2f} s",
        ]
        for at in results
    ]
    return [
        "## The operator with up to 10,000 running AgentRuns",
        "",
        *table(
            [
                "runs",
                "start → every run looked at once",
                "requests at start",
                "RSS started",
                "RSS after idle (peak)",
                "idle requests/s",
                "idle CPU",
                "one lost pod → replacement, p50 / max",
            ],
            rows,
        ),
        "",
        "Idle requests by kind over the window: "
        + "; ".join(f"{at.runs:,} runs: {kinds(at.idle_requests)}" for at in results)
        + ". At start: "
        + "; ".join(f"{at.runs:,} runs: {kinds(at.start_requests)}" for at in results)
        + ".",
        "",
        f"The bench's etcd + kube-apiserver only; `python -m alpineagents_operator` as its "
        f"own process (resync every {RESYNC_SECONDS:.0f} s, the chart's default; a "
        "FileStore; a user of its own, whose requests the API server's audit log counts, "
        "watches included). Every run was made as the operator leaves a running run "
        "(kopf's annotation, status Pending with attempt 1, its pod: Pending, no node), "
        "copied from one run the operator made itself, with the operator stopped; then "
        "the operator starts with them all. *Start*: process start → its "
        '`alpineagents_run_checks_total{source="resume"}` reaches the number of runs '
        "(kopf lists the runs and their pods, in pages; the operator lists the run pods "
        "once itself, in pages, then judges each run kopf resumes from what its watches "
        "and that listing show, and steps only a run whose step would change something; "
        "*steps* are those). *Idle*: "
        f"{idle:.0f} s with nothing changing, requests per second over it, and the "
        "operator's CPU time as a share of it. *One lost pod*: a run's pod deleted "
        "(one at a time, "
        f"{len(results[0].losses) if results else 0} per size): its DELETED → its "
        "replacement's ADDED, on a pod watch held by the benchmark; the operator reads "
        "the run and lists its pods, reads its saved State (none: the pod never ran), "
        "marks it Interrupted and creates the next pod. One pass per size; the machine "
        "is shared.",
    ]


def verdict(results: list[AtSize]) -> tuple[str, bool]:
    """The targets row's figures, and whether they meet the goals: under 500 MiB at the
    largest size, idle requests per second at the largest size at most those at 1,000
    (or the smallest) plus a tenth of a request, one loss replaced at the largest size
    within twice the time at the smallest plus 0.1 s."""
    from .measure import percentile

    base = next((at for at in results if at.runs >= 1_000), results[0])
    small, large = results[0], results[-1]
    loss_small, loss_large = percentile(small.losses, 0.5), percentile(large.losses, 0.5)
    figures = (
        f"RSS {large.peak_mib:.0f} MiB peak at {large.runs:,}; idle "
        + " / ".join(f"{at.idle_rate:.2f}" for at in results)
        + " requests/s at "
        + " / ".join(f"{at.runs:,}" for at in results)
        + f" runs; one lost pod replaced in p50 {loss_small:.2f} s ({small.runs:,}), "
        f"{loss_large:.2f} s ({large.runs:,}); start {large.start_seconds:.0f} s"
    )
    met = (
        large.peak_mib < 500
        and large.idle_rate <= base.idle_rate + 0.1
        and loss_large <= 2 * loss_small + 0.1
    )
    return figures, met


GOAL = "under 500 MiB; idle requests/s flat from 1,000 to 10,000; a loss among 10,000 as fast as among 100"


def section(page: Page, work: Path, repeats: int, sizes: Sizes, postgres: str | None) -> None:
    """The operator with ``sizes.operator_steady`` running AgentRuns (one pass)."""
    from .operator_scale import PlaneUnavailable
    from .results_page import Row
    from .sizes import ORDER

    del repeats, postgres
    page.order = ORDER
    what = "operator with 10,000 running AgentRuns: memory, idle requests, one loss"
    try:
        results = measure(work, sizes.operator_steady, 3 * RESYNC_SECONDS, 5)
    except PlaneUnavailable as error:
        page.rows["operator-runs"] = Row(what, "-", GOAL, None)
        page.not_measured.append(f"Operator with running runs: {error}")
        return
    figures, met = verdict(results)
    page.rows["operator-runs"] = Row(what, figures, GOAL, met)
    page.sections.append(report(results, 3 * RESYNC_SECONDS))


def main() -> None:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", default="100,1000,10000", help="sizes, ascending")
    parser.add_argument("--idle", type=float, default=3 * RESYNC_SECONDS)
    parser.add_argument("--losses", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    sizes = [int(n) for n in args.runs.split(",")]
    with tempfile.TemporaryDirectory(prefix="alpineagents-operator-runs-") as folder:
        results = measure(Path(folder), sizes, args.idle, args.losses)
    from .measure import load_average, machine

    lines = [
        "# The operator with up to 10,000 running AgentRuns",
        "",
        f"Measured by `python -m benchmarks.operator_runs --runs {args.runs} --idle "
        f"{args.idle:.0f} --losses {args.losses}` on {time.strftime('%Y-%m-%d')}. Machine: "
        f"{machine()}; load average {load_average()} at the end (the machine is shared).",
        "",
        *report(results, args.idle)[2:],
    ]
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
