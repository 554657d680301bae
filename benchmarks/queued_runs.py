"""The operator with 10,000 AgentRuns queued under a cap (issue 41): its memory and idle
CPU against its figures with as many running runs, measured beside them in the same pass
(the ``operator-runs`` live pass at the one size), and how soon a freed place goes to the next run in line.

Part of ``python -m benchmarks`` (section ``queued-runs``). The bench's etcd +
kube-apiserver only (no node: pods stay Pending), the operator as its own process with
the chart's default settings (:func:`.operator_runs.chart_settings`) and a cap of a few
runs per namespace (``admission.maxRunningPerNamespace``), a user of its own whose
requests the API server's audit log counts.

1. **Queue**: the runs are created while the operator runs (16 creates at a time, as
   the ``operator-runs`` live pass does); the first ``cap`` get pods, every other one
   is ``Queued`` (``NamespaceCap``). Settled: every run's status says so and kopf
   marked it handled (the runs listed every 10 s), then one resync period.
2. **Idle**: nothing changes for the idle window: the operator's requests per second,
   its CPU time as a share of the window, its RSS after and its peak (VmHWM).
3. **Admission decisions**: one running run's pod ends (exit 0 with the runner's
   report, written as its kubelet would), one after another: the pod's end written →
   the next run's pod ADDED on a pod watch held here. The operator marks the run
   ``Succeeded``, its place frees, and the first run in line (priority, then age, then
   name) gets it; each decision is checked to have gone to that run.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .operator_checks import free_port
from .operator_runs import (
    CREATORS,
    SETTLE_POLL,
    chart_settings,
    control_plane,
    create_run,
    measure_live,
)
from .operator_scale import (
    HANDLED,
    NAMESPACE,
    RESYNC_SECONDS,
    Operator,
    PlaneUnavailable,
    Requests,
    cpu_seconds,
)

if TYPE_CHECKING:
    from collections import Counter

    from .results_page import Page
    from .sizes import Sizes

DEADLINE = 1800.0  # a safety net on a busy machine, not a measure
MEMORY_SLACK = 1.1
"""Peak RSS may be up to this factor of the running runs' figure: two processes of the
same code differ by a few MiB (where the allocator's arenas fall), which at small sizes is
most of it."""
IDLE_CPU_SLACK = (1.25, 0.5)
"""Idle CPU may be up to this factor of the running runs' figure, or this many points
above it, whichever is more: one idle window on a shared machine varies by that much."""


@dataclass
class Queued:
    """What was measured with ``runs`` AgentRuns, ``cap`` of them running."""

    runs: int
    cap: int
    creating_seconds: float = 0.0
    settled_seconds: float = 0.0
    settle_requests: int = 0
    idle_seconds: float = 0.0
    idle_requests: Counter[str] | None = None
    idle_cpu: float = 0.0
    rss_idle_mib: float = 0.0
    peak_mib: float = 0.0
    decisions: list[float] = field(default_factory=list)
    """Seconds from a pod's end written to the next run's pod ADDED."""
    out_of_order: list[str] = field(default_factory=list)
    """``expected → admitted`` for each decision that did not go to the first in line."""

    @property
    def idle_percent(self) -> float:
        return self.idle_cpu / self.idle_seconds * 100

    @property
    def idle_rate(self) -> float:
        return sum((self.idle_requests or {}).values()) / self.idle_seconds


@dataclass(frozen=True)
class Reference:
    """The operator's figures with as many runs running, from ``operator-runs``."""

    runs: int
    rss_idle_mib: float
    peak_mib: float
    idle_percent: float
    source: str


def _listed(custom: Any) -> list[dict[str, Any]]:
    response = custom.list_namespaced_custom_object(
        "alpineagents.dev", "v1", NAMESPACE, "agentruns", _preload_content=False
    )
    items: list[dict[str, Any]] = json.loads(response.data)["items"]
    response.release_conn()
    return items


def _settled(item: dict[str, Any]) -> bool:
    status = item.get("status") or {}
    handled = HANDLED in (item["metadata"].get("annotations") or {})
    return handled and (
        status.get("phase") == "Queued"
        or (status.get("phase") == "Pending" and bool(status.get("pod")))
    )


def _line(items: list[dict[str, Any]]) -> list[str]:
    """The queued runs in the order they are admitted (priority, then age, then name)."""
    queued = [i for i in items if (i.get("status") or {}).get("phase") == "Queued"]
    queued.sort(
        key=lambda i: (
            -int((i.get("spec") or {}).get("priority") or 0),
            i["metadata"]["creationTimestamp"],
            i["metadata"]["name"],
        )
    )
    return [str(i["metadata"]["name"]) for i in queued]


def _end_pod(core: Any, pod: str) -> None:
    """Write the pod's end as its kubelet would: exit 0 with the runner's report."""
    report = json.dumps({"outcome": "answered", "answer": "done"})
    terminated = {"exitCode": 0, "reason": "Completed", "message": report}
    container = {
        "name": "agent",
        "image": "alpineagents:queued",
        "imageID": "",
        "ready": False,
        "restartCount": 0,
        "state": {"terminated": terminated},
    }
    body = {"status": {"phase": "Succeeded", "containerStatuses": [container]}}
    core.patch_namespaced_pod_status(pod, NAMESPACE, body)


def _wait(condition: Any, what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(SETTLE_POLL)  # a listing of every run: no change event says "all"


def measure(workdir: Path, runs: int, cap: int, idle: float, decisions: int) -> Queued:
    """``runs`` AgentRuns under a cap of ``cap`` per namespace; ``decisions`` places
    freed one after another (at most ``runs - cap``)."""
    from kubernetes import client
    from tests.bench.operator_process import EventLog, run_label

    result = Queued(runs, cap)
    store = workdir / "runs"
    store.mkdir(parents=True)
    with control_plane(workdir) as plane:
        operator = Operator(plane.client_kubeconfig("operator"), store, workdir / "operator.log")
        operator.env.update(chart_settings())
        operator.env["ALPINEAGENTS_METRICS_PORT"] = str(free_port())
        operator.env["ALPINEAGENTS_MAX_RUNNING_PER_NAMESPACE"] = str(cap)
        requests = Requests(plane)
        api = plane.api_client()
        api.configuration.connection_pool_maxsize = CREATORS
        custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        try:
            with EventLog(plane.api_client(), NAMESPACE, "pods") as pods:
                operator.start()
                requests.mark()
                began = time.monotonic()
                names = [f"run-{n:05d}" for n in range(runs)]
                with ThreadPoolExecutor(CREATORS) as pool:
                    list(pool.map(lambda name: create_run(custom, name), names))
                result.creating_seconds = time.monotonic() - began
                _wait(
                    lambda: sum(map(_settled, _listed(custom))) == runs, "the runs did not settle"
                )
                result.settled_seconds = time.monotonic() - began
                time.sleep(RESYNC_SECONDS)  # one resync round: the last follow-ups end
                result.settle_requests = sum(requests.since_mark().values())

                assert operator.process is not None
                cpu = cpu_seconds([operator.process.pid])
                requests.mark()
                time.sleep(idle)  # counting requests and CPU over a window is the measure
                result.idle_seconds = idle
                result.idle_requests = requests.since_mark()
                result.idle_cpu = cpu_seconds([operator.process.pid]) - cpu
                result.rss_idle_mib, result.peak_mib = operator.memory_mib()

                items = _listed(custom)
                line = _line(items)
                running = sorted(
                    str(i["status"]["pod"])
                    for i in items
                    if (i.get("status") or {}).get("phase") == "Pending"
                )
                if len(running) != cap or len(line) != runs - cap:
                    raise RuntimeError(f"{len(running)} runs with a pod, {len(line)} queued")
                for expected in line[:decisions]:
                    pod = running.pop(0)
                    after = time.monotonic()
                    _end_pod(core, pod)
                    added = pods.wait_for(lambda e: e.type == "ADDED", after)
                    result.decisions.append(added.at - after)
                    if run_label(added) != expected:
                        result.out_of_order.append(f"{expected} → {run_label(added)}")
                    running.append(added.name)
        finally:
            operator.stop()
    return result


# --------------------------------------------------------------------------- the reference


def running_reference(workdir: Path, runs: int, idle: float) -> Reference:
    """The same operator with as many runs running, measured in this pass beside the queued
    one (the ``operator-runs`` live pass at the one size, on its own fresh plane): the
    two figures are of the same code on the same machine within minutes."""
    (at,) = measure_live(workdir, [runs], idle, losses=0)
    return Reference(
        runs,
        at.rss_idle_mib,
        at.peak_mib,
        at.idle_cpu / at.idle_seconds * 100,
        f"{runs:,} runs created while the operator ran, all with a pod (the operator-runs "
        "live pass at this one size), measured just before the queued ones in this pass",
    )


# --------------------------------------------------------------------------- the page


def judged(queued: Queued, ref: Reference) -> tuple[str, str, bool]:
    """The row's figures, its goal, and whether they meet it."""
    from .measure import percentile

    d = queued.decisions
    factor, points = IDLE_CPU_SLACK
    cpu_limit = max(ref.idle_percent * factor, ref.idle_percent + points)
    figures = (
        f"peak RSS {queued.peak_mib:.0f} MiB (after idle {queued.rss_idle_mib:.0f}), idle CPU "
        f"{queued.idle_percent:.1f} %, {queued.idle_rate:.2f} requests/s (with {ref.runs:,} "
        f"running, this pass: peak {ref.peak_mib:.0f} MiB, idle CPU {ref.idle_percent:.1f} %)"
    )
    goal = (
        f"within the figures for as many running runs, measured beside them: peak RSS at "
        f"most {MEMORY_SLACK:g}x theirs, idle CPU at most {factor:g}x theirs or {points:g} "
        "points more; each freed place to the first in line"
    )
    met = (
        queued.peak_mib <= ref.peak_mib * MEMORY_SLACK
        and queued.idle_percent <= cpu_limit
        and not queued.out_of_order
        and len(d) > 0
    )
    if d:
        figures += (
            f"; a freed place → the next run's pod p50 {percentile(d, 0.5):.2f} s, p95 "
            f"{percentile(d, 0.95):.2f} s, max {max(d):.2f} s"
        )
    figures += f", {len(d) - len(queued.out_of_order)} of {len(d)} to the first in line"
    return figures, goal, met


def section(page: Page, work: Path, repeats: int, sizes: Sizes, postgres: str | None) -> None:
    """The operator with ``sizes.queued_runs`` AgentRuns, all but a few queued."""
    from .measure import percentile
    from .results_page import Row, table
    from .sizes import ORDER

    del repeats, postgres
    page.order = ORDER
    n, cap = sizes.queued_runs, sizes.queued_cap
    what = (
        f"operator with {n:,} AgentRuns queued under a cap (issue 41): memory, idle CPU, "
        "the time of an admission decision"
    )
    idle = sizes.operator_idle or 3 * RESYNC_SECONDS
    try:
        ref = running_reference(work / "running", n, idle)
        queued = measure(work / "queued", n, cap, idle, min(sizes.operator_losses, n - cap))
    except PlaneUnavailable as error:
        page.rows["queued-runs"] = Row(what, "-", "within the running runs' figures", None)
        page.not_measured.append(f"Queued runs: {error}")
        return
    figures, goal, met = judged(queued, ref)
    page.rows["queued-runs"] = Row(
        what, figures, goal, met, f"1 pass; {len(queued.decisions)} admission decisions"
    )
    d = queued.decisions
    page.sections.append(
        [
            f"## The operator with {n:,} AgentRuns queued",
            "",
            *table(
                [
                    "runs (with a pod)",
                    "created / settled",
                    "requests to settle",
                    "RSS after idle (peak)",
                    "idle requests/s",
                    "idle CPU",
                    "a freed place → next pod, p50 / p95 / max",
                ],
                [
                    [
                        f"{n:,} ({cap})",
                        f"{queued.creating_seconds:.0f} s / {queued.settled_seconds:.0f} s",
                        f"{queued.settle_requests:,}",
                        f"{queued.rss_idle_mib:.0f} MiB ({queued.peak_mib:.0f})",
                        f"{queued.idle_rate:.2f}",
                        f"{queued.idle_percent:.1f} %",
                        f"{percentile(d, 0.5):.2f} s / {percentile(d, 0.95):.2f} s / {max(d):.2f} s"
                        if d
                        else "-",
                    ]
                ],
            ),
            "",
            "The bench's etcd + kube-apiserver only; `python -m alpineagents_operator` as "
            "its own process with the chart's default settings and "
            f"`admission.maxRunningPerNamespace: {cap}`, a FileStore, a user of its own "
            "whose requests the API server's audit log counts. The runs were created while "
            f"it ran ({CREATORS} creates at a time); {cap} got pods (Pending: no node), the "
            "rest are Queued. *Settled*: every run's status Queued or naming its pod, and "
            f"kopf's annotation on it (listed every {SETTLE_POLL:.0f} s), then one resync "
            f"period. *Idle*: the next {idle:.0f} s, nothing changing; CPU as a share of it, "
            "the peak is the process's VmHWM since it started. *A freed place*: a running "
            "run's pod's end written (exit 0 with the runner's report, as its kubelet "
            "would), one at a time, → the next run's pod ADDED on a watch held here; the "
            f"run admitted checked against the line (out of order: "
            f"{', '.join(queued.out_of_order) or 'none'}). Compared with: "
            + f"{ref.source}. One pass each; the machine is shared.",
        ]
    )
