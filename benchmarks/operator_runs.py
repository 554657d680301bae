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

**Live** (``--mode live``): the same sizes reached as users reach them, with the
chart's operator (its command, and its default settings from ``charts/alpineagents/
values.yaml``: log level, resync period, the Lease election) running all along. Plain
AgentRuns are created, 16 requests at a time, up to each size in turn; the operator
makes each run's pod (Pending: no node). Each size is measured once the operator has
settled (every run's status names its pod and kopf marked it handled, then one resync
period): its requests meanwhile, then **Idle** and **Losses** as above; the peak RSS is
the process's own high-water mark since it started. ``--before TREE`` measures the live
pass again with the operator package of another tree (``git archive`` of an earlier
commit) for a before/after table.

Results go to ``benchmarks/results/operator_runs.md`` (each mode rewrites its own sections).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import REPO
from .operator_checks import free_port, resumed, run_checks
from .operator_scale import (
    HANDLED,
    NAMESPACE,
    OPERATOR_USER,
    RESYNC_SECONDS,
    Operator,
    PlaneUnavailable,
    Requests,
    Watch,
    _runs_list,
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
PEAK_GOAL_MIB = 400.0
"""Peak RSS at 10,000 runs, either way they came (the chart's limit is 512 Mi)."""


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
        # The client's raw answers (dicts, and an unread response): Any, as they are used.
        run: Any = self._custom.get_namespaced_custom_object(
            "alpineagents.dev", "v1", NAMESPACE, "agentruns", TEMPLATE
        )
        pod: Any = self._core.read_namespaced_pod(
            f"{TEMPLATE}-1", NAMESPACE, _preload_content=False
        )
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
        from alpineagents_operator.kube.views import state_id_for

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
        made: Any = self._custom.create_namespaced_custom_object(
            "alpineagents.dev", "v1", NAMESPACE, "agentruns", body
        )
        uid = made["metadata"]["uid"]
        self._custom.patch_namespaced_custom_object_status(
            "alpineagents.dev", "v1", NAMESPACE, "agentruns", name,
            {"status": self._for(self.status, name, uid)},
        )  # fmt: skip
        pod = self._for(self.pod, name, uid)
        response: Any = self._core.create_namespaced_pod(NAMESPACE, pod, _preload_content=False)
        _ = response.data  # read to its end before the connection goes back to the pool
        response.release_conn()


@contextlib.contextmanager
def control_plane(workdir: Path) -> Iterator[Any]:
    """:func:`.operator_scale.control_plane` with an audit log that is never rotated: the
    API server rotates it at 100 MB by default, which 10,000 runs created pass, and a
    count from a mark in the old file then read nothing of the new one."""
    from tests.bench.control_plane import PlaneOptions, start_control_plane
    from tests.bench.testbin import ProvisioningError, binary_path

    try:
        for name in ("etcd", "kube-apiserver", "kubectl"):
            binary_path(name)
    except ProvisioningError as error:
        raise PlaneUnavailable(f"run `python -m tests.bench.testbin`: {error}") from error
    options = PlaneOptions(
        clients={"operator": (OPERATOR_USER, "system:masters")},
        apiserver_args=("--audit-log-maxsize=1000000",),  # megabytes
    )
    with contextlib.ExitStack() as stack:
        plane = start_control_plane(stack, workdir / "plane", options)
        plane.apply_crds()
        plane.kubectl("create", "namespace", NAMESPACE)
        yield plane


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
    store.mkdir(parents=True)
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


# --------------------------------------------------------------------------- live
CHART_VALUES = REPO / "charts" / "alpineagents" / "values.yaml"
SETTLE_POLL = 10.0
"""Seconds between two listings of every run while waiting for the operator to settle
(at 10,000 runs one listing is tens of megabytes: not a figure, a cost kept low)."""


@dataclass
class LiveAtSize:
    """What was measured with ``runs`` AgentRuns, created while the operator ran."""

    runs: int
    creating_seconds: float = 0.0  # the benchmark's own creates
    pods_seconds: float = 0.0  # first create → the last run's pod ADDED
    settled_seconds: float = 0.0  # first create → every run handled
    settle_requests: Counter[str] = field(default_factory=Counter)
    settle_resync_steps: int = 0  # runs the resync stepped meanwhile
    rss_settled_mib: float = 0.0
    idle_seconds: float = 0.0
    idle_requests: Counter[str] = field(default_factory=Counter)
    idle_resync_steps: int = 0
    idle_cpu: float = 0.0
    rss_idle_mib: float = 0.0
    peak_mib: float = 0.0
    load: str = ""
    losses: list[float] = field(default_factory=list)

    @property
    def idle_rate(self) -> float:
        return sum(self.idle_requests.values()) / self.idle_seconds


def chart_settings() -> dict[str, str]:
    """The operator's environment as the chart's default values set it, for what the
    bench's plane has (no Secrets, no store server: a FileStore as in the restart pass)."""
    import yaml

    values = yaml.safe_load(CHART_VALUES.read_text())["operator"]
    election = values["leaderElection"]
    return {
        "ALPINEAGENTS_LOG_LEVEL": str(values["logLevel"]),
        "ALPINEAGENTS_RESYNC_SECONDS": str(values["resyncSeconds"]),
        "ALPINEAGENTS_LEADER_LEASE": f"{NAMESPACE}/alpineagents-operator",
        "ALPINEAGENTS_LEASE_SECONDS": str(election["leaseSeconds"]),
        "ALPINEAGENTS_LEASE_RENEW_DEADLINE_SECONDS": str(election["renewDeadlineSeconds"]),
        "ALPINEAGENTS_LEASE_RETRY_SECONDS": str(election["retrySeconds"]),
        "POD_ID": "alpineagents-operator-0",
    }


def create_run(custom: Any, name: str) -> None:
    """Create one plain AgentRun (read to its end, its connection back in the pool)."""
    body = {
        "apiVersion": "alpineagents.dev/v1",
        "kind": "AgentRun",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "model": "claude-sonnet-5",
            "prompt": f"job {name}",
            "restartPolicy": {"initialBackoffSeconds": 0},
        },
    }
    response = custom.create_namespaced_custom_object(
        "alpineagents.dev", "v1", NAMESPACE, "agentruns", body, _preload_content=False
    )
    _ = response.data  # read to its end before the connection goes back to the pool
    response.release_conn()


def _unsettled(custom: Any) -> int:
    """Runs whose status does not name a pod yet, or that kopf has not marked handled."""
    response = custom.list_namespaced_custom_object(
        "alpineagents.dev", "v1", NAMESPACE, "agentruns", _preload_content=False
    )
    items = json.loads(response.data)["items"]
    response.release_conn()
    return sum(
        1
        for item in items
        if HANDLED not in (item["metadata"].get("annotations") or {})
        or not (item.get("status") or {}).get("pod")
    )


def _resync_steps(port: int) -> int:
    return int(run_checks(port).get(("resync", "true"), 0))


def measure_live(
    workdir: Path, sizes: list[int], idle: float, losses: int, tree: Path = REPO
) -> list[LiveAtSize]:
    """The live pass: one operator process (from ``tree``'s ``operator/``) all along,
    runs created up to each size in turn."""
    from kubernetes import client
    from tests.bench.operator_process import EventLog

    from .measure import load_average

    results: list[LiveAtSize] = []
    store = workdir / "runs"
    store.mkdir(parents=True)
    with control_plane(workdir) as plane:
        operator = Operator(plane.client_kubeconfig("operator"), store, workdir / "operator.log")
        port = free_port()
        operator.env.update(chart_settings())
        operator.env["ALPINEAGENTS_METRICS_PORT"] = str(port)
        operator.env["PYTHONPATH"] = f"{tree / 'operator'}:{tree}"
        requests = Requests(plane)
        api = plane.api_client()
        api.configuration.connection_pool_maxsize = CREATORS
        custom = client.CustomObjectsApi(api)
        pods = Watch(plane.api_client(), "pods")
        try:
            operator.start()
            pods.start()
            made = 0
            lost_runs = 0
            for size in sizes:
                at = LiveAtSize(size)
                names = [f"run-{n:05d}" for n in range(made, size)]
                steps_before = _resync_steps(port)
                requests.mark()
                began = time.monotonic()
                with ThreadPoolExecutor(CREATORS) as pool:
                    list(pool.map(lambda name: create_run(custom, name), names))
                at.creating_seconds = time.monotonic() - began
                made = size
                pods.wait_for(names)
                at.pods_seconds = max(pods.added[n] for n in names) - began
                _wait(lambda: _unsettled(custom) == 0, "the runs did not settle", SETTLE_POLL)
                at.settled_seconds = time.monotonic() - began
                time.sleep(RESYNC_SECONDS)  # one resync round: the last follow-ups end
                at.settle_requests = requests.since_mark()
                at.settle_resync_steps = _resync_steps(port) - steps_before
                at.rss_settled_mib = operator.memory_mib()[0]

                assert operator.process is not None
                cpu = cpu_seconds([operator.process.pid])
                steps_before = _resync_steps(port)
                requests.mark()
                time.sleep(idle)  # counting requests over a window is the measure
                at.idle_seconds = idle
                at.idle_requests = requests.since_mark()
                at.idle_resync_steps = _resync_steps(port) - steps_before
                at.idle_cpu = cpu_seconds([operator.process.pid]) - cpu
                at.rss_idle_mib, at.peak_mib = operator.memory_mib()
                at.load = load_average()

                with EventLog(plane.api_client(), NAMESPACE, "pods") as events:
                    step = max(1, size // max(losses, 1))
                    for n in range(losses):
                        run = f"run-{(lost_runs * 7919 + n * step) % size:05d}"
                        at.losses.append(_lose(plane, events, run))
                    lost_runs += losses
                results.append(at)
                print(_live_summary(at), flush=True)
        finally:
            pods.stop()
            operator.stop()
    return results


def _live_summary(at: LiveAtSize) -> str:
    return (
        f"live {at.runs} runs: created in {at.creating_seconds:.0f} s, pods in "
        f"{at.pods_seconds:.0f} s, settled in {at.settled_seconds:.0f} s "
        f"({sum(at.settle_requests.values())} requests: {dict(at.settle_requests)}; "
        f"{at.settle_resync_steps} resync steps); RSS {at.rss_idle_mib:.0f} MiB (peak {at.peak_mib:.0f}); idle "
        f"{at.idle_rate:.2f} requests/s {dict(at.idle_requests)}, {at.idle_resync_steps} "
        f"resync steps; losses {[round(x, 3) for x in at.losses]}; load {at.load}"
    )


def _kinds(counts: Counter[str]) -> str:
    return ", ".join(f"{kind} {count:,}" for kind, count in counts.most_common()) or "none"


def report_live(results: list[LiveAtSize], idle: float) -> list[str]:
    """The live pass as Markdown lines (without its heading)."""
    from .measure import percentile
    from .results_page import table

    rows = [
        [
            f"{at.runs:,}",
            f"{at.creating_seconds:.0f} s / {at.pods_seconds:.0f} s / {at.settled_seconds:.0f} s",
            f"{sum(at.settle_requests.values()):,} ({at.settle_resync_steps:,})",
            f"{at.rss_settled_mib:.0f} MiB",
            f"{at.rss_idle_mib:.0f} MiB ({at.peak_mib:.0f})",
            f"{at.idle_rate:.2f} ({at.idle_resync_steps:,})",
            f"{at.idle_cpu / at.idle_seconds * 100:.1f} %",
            f"{percentile(at.losses, 0.5):.2f} s / {max(at.losses):.2f} s",
            at.load,
        ]
        for at in results
    ]
    return [
        *table(
            [
                "runs",
                "created / every pod / settled",
                "requests to settle (resync steps)",
                "RSS settled",
                "RSS after idle (peak)",
                "idle requests/s (resync steps)",
                "idle CPU",
                "one lost pod → replacement, p50 / max",
                "load average after idle",
            ],
            rows,
        ),
        "",
        "Idle requests by kind over the window: "
        + "; ".join(f"{at.runs:,} runs: {_kinds(at.idle_requests)}" for at in results)
        + ".",
        "",
        "The bench's etcd + kube-apiserver only; `python -m alpineagents_operator` as its own "
        "process with the chart's default settings (`charts/alpineagents/values.yaml`: log "
        "level, resync period, the Lease election, whose renewals are most of the idle "
        "requests), a FileStore, a user of its own whose requests the API server's audit "
        "log counts (watches included), started before the first run and running "
        "throughout. Runs are created up to each size in turn (16 creates at a time, each "
        "size adding to the one before); the operator creates each run's pod (Pending: no "
        "node, no scheduler). *Created / every pod / settled*: the benchmark's creates "
        "done, the last pod's ADDED on a watch held here, every run's status naming its "
        "pod and kopf's annotation on it (the runs listed every "
        f"{SETTLE_POLL:.0f} s), each from the first create. *Requests to settle*: the "
        "operator's, from the first create to one resync period after settling; *resync "
        "steps*: runs its resync stepped meanwhile (`alpineagents_run_checks_total"
        '{source="resync",stepped="true"}`). *Idle*: the next '
        f"{idle:.0f} s, nothing changing. *Peak*: the process's VmHWM since it started "
        "(with every size before). *One lost pod*: as in the restart pass. One pass; the "
        "machine is shared (its load average in the last column).",
    ]


def verdict_live(results: list[LiveAtSize]) -> tuple[str, bool]:
    """The live targets row: peak RSS at the largest size under 400 MiB; idle requests/s
    at the largest size within 25 % of those at 1,000 (or 2 a second, whichever is
    larger); one loss replaced at the largest size within twice the time at the smallest
    plus 0.1 s."""
    from .measure import percentile

    base = next((at for at in results if at.runs >= 1_000), results[0])
    small, large = results[0], results[-1]
    loss_small, loss_large = percentile(small.losses, 0.5), percentile(large.losses, 0.5)
    figures = (
        f"peak RSS {large.peak_mib:.0f} MiB at {large.runs:,}; idle "
        + " / ".join(f"{at.idle_rate:.2f}" for at in results)
        + " requests/s at "
        + " / ".join(f"{at.runs:,}" for at in results)
        + f" runs; one lost pod replaced in p50 {loss_small:.2f} s ({small.runs:,}), "
        f"{loss_large:.2f} s ({large.runs:,})"
    )
    met = (
        large.peak_mib < PEAK_GOAL_MIB
        and abs(large.idle_rate - base.idle_rate) <= max(0.25 * base.idle_rate, 2.0)
        and loss_large <= 2 * loss_small + 0.1
    )
    return figures, met


LIVE_GOAL = (
    "runs created live: peak RSS under 400 MiB; idle requests/s at 10,000 within 25 % of "
    "1,000's (or 2/s); a loss among 10,000 as fast as among 100"
)


def report_before_after(before: list[LiveAtSize], after: list[LiveAtSize]) -> list[str]:
    """The live pass on the earlier tree and on this one, side by side."""
    from .measure import percentile
    from .results_page import table

    rows = []
    for pass_name, results in (("before", before), ("after", after)):
        for at in results:
            rows.append(
                [
                    f"{at.runs:,}",
                    pass_name,
                    f"{at.settled_seconds:.0f} s",
                    f"{sum(at.settle_requests.values()):,} ({at.settle_resync_steps:,})",
                    f"{at.rss_idle_mib:.0f} MiB ({at.peak_mib:.0f})",
                    f"{at.idle_rate:.2f} ({at.idle_resync_steps:,})",
                    f"{percentile(at.losses, 0.5):.2f} s",
                ]
            )
    rows.sort(key=lambda row: (int(row[0].replace(",", "")), row[1] == "after"))
    return [
        *table(
            [
                "runs",
                "",
                "settled",
                "requests to settle (resync steps)",
                "RSS after idle (peak)",
                "idle requests/s (resync steps)",
                "one lost pod, p50",
            ],
            rows,
        ),
        "",
        "Idle requests by kind, before: "
        + "; ".join(f"{at.runs:,} runs: {_kinds(at.idle_requests)}" for at in before)
        + ".",
    ]


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
    """The targets row's figures, and whether they meet the goals: a peak under
    :data:`PEAK_GOAL_MIB` at the largest size, idle requests per second at the largest size at most those at 1,000
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
        large.peak_mib < PEAK_GOAL_MIB
        and large.idle_rate <= base.idle_rate + 0.1
        and loss_large <= 2 * loss_small + 0.1
    )
    return figures, met


GOAL = "under 400 MiB; idle requests/s flat from 1,000 to 10,000; a loss among 10,000 as fast as among 100"


def section(page: Page, work: Path, repeats: int, sizes: Sizes, postgres: str | None) -> None:
    """The operator with ``sizes.operator_steady`` running AgentRuns at its start, then
    with ``sizes.operator_live`` created while it runs (one pass each)."""
    from .results_page import Row
    from .sizes import ORDER

    del repeats, postgres
    page.order = ORDER
    what = "operator with 10,000 running AgentRuns: memory, idle requests, one loss"
    live_what = "operator as 10,000 AgentRuns are created: memory, idle requests, one loss"
    try:
        losses = sizes.operator_losses
        idle = sizes.operator_idle or 3 * RESYNC_SECONDS
        results = measure(work / "restart", sizes.operator_steady, idle, losses)
        live = measure_live(work / "live", sizes.operator_live, idle, losses)
    except PlaneUnavailable as error:
        page.rows["operator-runs"] = Row(what, "-", GOAL, None)
        page.rows["operator-runs-live"] = Row(live_what, "-", LIVE_GOAL, None)
        page.not_measured.append(f"Operator with running runs: {error}")
        return
    figures, met = verdict(results)
    samples = f"one pass per size; {losses} losses at each"
    page.rows["operator-runs"] = Row(what, figures, GOAL, met, samples, judged_over=losses)
    page.sections.append(report(results, idle))
    figures, met = verdict_live(live)
    page.rows["operator-runs-live"] = Row(
        live_what, figures, LIVE_GOAL, met, samples, judged_over=losses
    )
    page.sections.append([LIVE_HEADING, "", *report_live(live, idle)])


TITLE = "# The operator with up to 10,000 running AgentRuns"
LIVE_HEADING = "## The operator as up to 10,000 AgentRuns are created"
BEFORE_AFTER_HEADING = "## Runs created live, before and after (issue 47)"


def replace_sections(
    page: str, sections: dict[str, list[str]], preamble: list[str] | None = None
) -> str:
    """``page`` with each ``## `` section whose heading ``sections`` names replaced by its
    lines (added at the end where there is none), and what comes before the first such
    heading by ``preamble`` (if given); every other section is kept."""
    parts: list[list[str]] = [[]]
    for line in page.splitlines():
        if line.startswith("## "):
            parts.append([])
        parts[-1].append(line)
    kept = {part[0]: part for part in parts[1:] if part}
    for heading, lines in sections.items():
        kept[heading] = [heading, *lines]
    chosen = [preamble if preamble is not None else parts[0]]
    placed = set()
    for part in parts[1:]:
        if part and part[0] not in placed:
            chosen.append(kept[part[0]])
            placed.add(part[0])
    chosen += [kept[heading] for heading in sections if heading not in placed]
    return "\n\n".join("\n".join(part).strip() for part in chosen if part) + "\n"


def main() -> None:
    import sys
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", default="100,1000,10000", help="sizes, ascending")
    parser.add_argument("--idle", type=float, default=3 * RESYNC_SECONDS)
    parser.add_argument("--losses", type=int, default=5)
    parser.add_argument("--mode", choices=("restart", "live"), default="restart")
    parser.add_argument(
        "--before", type=Path, help="live: also measure the operator of this tree (before)"
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    sizes = [int(n) for n in args.runs.split(",")]
    from .measure import load_average, machine

    command = f"`python -m benchmarks.operator_runs {' '.join(sys.argv[1:])}`"
    when = f"on {time.strftime('%Y-%m-%d')}. Machine: {machine()}"
    sections: dict[str, list[str]] = {}
    preamble = None
    with tempfile.TemporaryDirectory(prefix="alpineagents-operator-runs-") as folder:
        if args.mode == "restart":
            results = measure(Path(folder), sizes, args.idle, args.losses)
            preamble = [
                TITLE,
                "",
                f"Measured by {command} {when}; load average {load_average()} at the end "
                "(the machine is shared).",
                "",
                *report(results, args.idle)[2:],
            ]
        else:
            before = None
            if args.before is not None:
                before = measure_live(
                    Path(folder) / "before", sizes, args.idle, args.losses, args.before
                )
            live = measure_live(Path(folder) / "after", sizes, args.idle, args.losses)
            if before is not None:  # its own section: the live one keeps its full pass
                sections[BEFORE_AFTER_HEADING] = [
                    "",
                    f"The live pass with the operator of `{args.before}` (before) and of this "
                    f"tree (after), one after the other, by {command} {when}; load average "
                    f"{load_average()} at the end (the machine is shared).",
                    "",
                    *report_before_after(before, live),
                ]
            else:
                figures, met = verdict_live(live)
                sections[LIVE_HEADING] = [
                    "",
                    f"Measured by {command} {when}.",
                    "",
                    *report_live(live, args.idle),
                    "",
                    f"Goal ({LIVE_GOAL}): {'met' if met else 'not met'} ({figures}).",
                ]
    page = args.out.read_text(encoding="utf-8") if args.out.exists() else f"{TITLE}\n"
    text = replace_sections(page, sections, preamble)
    args.out.write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
