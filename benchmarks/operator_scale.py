"""The operator with many AgentRuns: its memory, how soon every new run has its pod, and
how many API requests it makes for it.

Part of ``python -m benchmarks`` (section ``operator``). It needs only a control plane:
the bench's etcd + kube-apiserver (:mod:`tests.bench.control_plane`, no node, so the
pods the operator creates stay Pending, which is all "has its pod" asks) and the
operator as its own process (``python -m alpineagents_operator``, as in its image),
connecting as a user of its own so that the API server's audit log tells its requests
from the benchmark's. The store is a FileStore folder the operator reads directly.

Three phases, one operator process:

1. **Burst**: ``N`` AgentRuns are created at once (``kubectl create`` of one list).
   Run created → its pod created, from the ADDED events of one watch on AgentRuns and
   one on pods held here; "all have pods" is the last pod's ADDED after the first run's.
   Its requests are counted until every run's status names its pod and kopf marked it
   handled.
2. **Steady**: nothing changes for two resync periods; the resync loop looks at every
   run every ``ALPINEAGENTS_RESYNC_SECONDS`` (30, the chart's default) from the watches'
   views and steps only those a step would change.
3. **Restart**: the operator is stopped and started again with the ``N`` runs there
   (kopf resumes every one): time until it looked at them all (its
   ``alpineagents_run_checks`` metric), requests meanwhile.

The steady state at up to 10,000 runs is :mod:`.operator_runs`.

Requests are the audit log's events of the operator's user (every verb, watches
included). A reconcile step reads its run first (one GET of the AgentRun, and nothing
else GETs one), so GETs of AgentRuns count the steps. RSS is the operator process's
``VmRSS`` (and its peak, ``VmHWM``) from ``/proc``.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from . import REPO
from .operator_checks import free_port, resumed
from .sizes import ORDER, Sizes

if TYPE_CHECKING:
    from .results_page import Page

NAMESPACE = "scale"
OPERATOR_USER = "alpineagents-operator"
RESYNC_SECONDS = 30.0  # the chart's default
DEADLINE = 900.0  # a safety net on a busy machine, not a measure
HANDLED = "kopf.alpineagents.dev/last-handled-configuration"


class PlaneUnavailable(Exception):
    """The bench's control plane binaries are missing."""


@dataclass
class Phase:
    """What one phase cost: wall time, the operator's requests, its memory after."""

    seconds: float = 0.0
    requests: Counter[str] = field(default_factory=Counter)
    rss_mib: float = 0.0
    peak_mib: float = 0.0
    latencies: list[float] = field(default_factory=list)  # per run, where measured
    load: tuple[float, float, float] = (0.0, 0.0, 0.0)
    server_seconds: dict[str, float] = field(default_factory=dict)  # by request kind
    operator_cpu: float = 0.0  # CPU seconds (user + system) of the operator process
    apiserver_cpu: float = 0.0  # and of kube-apiserver + etcd

    @property
    def total(self) -> int:
        return sum(self.requests.values())

    @property
    def steps(self) -> int:
        return self.requests["get agentruns"]


@dataclass
class Scale:
    runs: int
    idle_rss_mib: float = 0.0
    burst: Phase = field(default_factory=Phase)
    steady: Phase = field(default_factory=Phase)
    restart: Phase = field(default_factory=Phase)
    losses: Phase = field(default_factory=Phase)
    lost: int = 0
    creating_seconds: float = 0.0  # how long the benchmark's own create took


class Watch:
    """ADDED times (``time.monotonic()``) of the namespace's AgentRuns or pods, by run."""

    def __init__(self, api_client: Any, kind: str) -> None:
        from kubernetes import client

        self._core = client.CoreV1Api(api_client)
        self._custom = client.CustomObjectsApi(api_client)
        self._kind = kind
        self.added: dict[str, float] = {}
        """First ADDED by run (pods: by their run label; runs: by name)."""
        self.by_name: dict[tuple[str, str], float] = {}
        """(event type, object name) → its first arrival."""
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _list(self, **options: Any) -> Any:
        if self._kind == "pods":
            return self._core.list_namespaced_pod(NAMESPACE, _preload_content=False, **options)
        return self._custom.list_namespaced_custom_object(
            "alpineagents.dev", "v1", NAMESPACE, "agentruns", _preload_content=False, **options
        )

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(60):
            raise RuntimeError(f"the benchmark's {self._kind} watch did not start")

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        listing = self._list(limit=1)
        version = json.loads(listing.data)["metadata"]["resourceVersion"]
        listing.release_conn()
        while not self._stop.is_set():
            try:
                response = self._list(
                    watch=True,
                    resource_version=version,
                    allow_watch_bookmarks=True,
                    timeout_seconds=60,
                    _request_timeout=(10, 90),
                )
                self._ready.set()
                try:
                    for line in response:
                        if not line.strip():
                            continue
                        at = time.monotonic()
                        event = json.loads(line)
                        meta = event["object"]["metadata"]
                        version = meta.get("resourceVersion", version)
                        if event["type"] not in ("ADDED", "DELETED"):
                            continue
                        labels = meta.get("labels") or {}
                        run = labels.get("alpineagents.dev/run") if self._kind == "pods" else None
                        key = run or meta["name"]
                        with self._changed:
                            if event["type"] == "ADDED":
                                self.added.setdefault(key, at)
                            self.by_name.setdefault((event["type"], meta["name"]), at)
                            self._changed.notify_all()
                finally:
                    response.close()
            except Exception:  # the stream broke: watch again from the last version seen
                if self._stop.is_set():
                    return
                time.sleep(0.1)

    def wait_for(self, names: list[str], event: str = "") -> None:
        """Wait for each run's first ADDED (or, given ``event``, that event of each
        object named)."""
        seen = self.added if not event else {n: 0.0 for t, n in self.by_name if t == event}
        deadline = time.monotonic() + DEADLINE
        with self._changed:
            while not all(n in seen for n in names):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    have = sum(1 for n in names if n in seen)
                    raise TimeoutError(f"{self._kind}: {have} of {len(names)} after {DEADLINE} s")
                self._changed.wait(remaining)
                if event:
                    seen = {n: 0.0 for t, n in self.by_name if t == event}


# --------------------------------------------------------------------------- the parts


class Operator:
    """``python -m alpineagents_operator`` as its own process, as in its image."""

    def __init__(self, kubeconfig: Path, store: Path, log: Path) -> None:
        self.log = log
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO / "operator"), str(REPO)]),
            "KUBECONFIG": str(kubeconfig),
            "ALPINEAGENTS_NAMESPACES": NAMESPACE,
            "ALPINEAGENTS_STORE": store.as_uri(),
            "ALPINEAGENTS_RUN_CREDENTIALS": "shared",
            "ALPINEAGENTS_RESYNC_SECONDS": str(RESYNC_SECONDS),
            "ALPINEAGENTS_METRICS_PORT": "0",
            "ALPINEAGENTS_HEALTH_PORT": "0",
            "ALPINEAGENTS_LOG_LEVEL": "WARNING",
        }
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "alpineagents_operator"],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def stop(self) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def memory_mib(self) -> tuple[float, float]:
        """(VmRSS, VmHWM) of the operator process in MiB."""
        assert self.process is not None
        fields: dict[str, float] = {}
        with open(f"/proc/{self.process.pid}/status", encoding="ascii") as status:
            for line in status:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    fields[key] = int(value.split()[0]) / 1024
        return fields["VmRSS"], fields["VmHWM"]


@contextlib.contextmanager
def control_plane(workdir: Path) -> Iterator[Any]:
    from tests.bench.control_plane import PlaneOptions, start_control_plane
    from tests.bench.testbin import ProvisioningError, binary_path

    try:
        for name in ("etcd", "kube-apiserver", "kubectl"):
            binary_path(name)
    except ProvisioningError as error:
        raise PlaneUnavailable(f"run `python -m tests.bench.testbin`: {error}") from error
    options = PlaneOptions(clients={"operator": (OPERATOR_USER, "system:masters")})
    with contextlib.ExitStack() as stack:
        plane = start_control_plane(stack, workdir / "plane", options)
        plane.apply_crds()
        plane.kubectl("create", "namespace", NAMESPACE)
        yield plane


class Requests:
    """The operator's requests, from the API server's audit log, counted from a mark."""

    def __init__(self, plane: Any) -> None:
        self._path = plane.workdir / "audit.log"
        self._offset = 0

    def mark(self) -> None:
        self._offset = self._path.stat().st_size if self._path.exists() else 0

    def since_mark(self) -> Counter[str]:
        return self.since_mark_timed()[0]

    def since_mark_timed(self) -> tuple[Counter[str], dict[str, float]]:
        """Requests by kind, and the seconds the API server spent on them by kind
        (received → response complete; a watch's is how long it stayed open)."""
        counts: Counter[str] = Counter()
        spent: dict[str, float] = {}
        with open(self._path, "rb") as log:
            log.seek(self._offset)
            data = log.read()
        for line in data.splitlines():
            if OPERATOR_USER.encode() not in line:
                continue
            event = json.loads(line)
            if event.get("user", {}).get("username") != OPERATOR_USER:
                continue
            ref = event.get("objectRef") or {}
            resource = ref.get("resource", event.get("requestURI", "?"))
            if ref.get("subresource"):
                resource += "/" + ref["subresource"]
            kind = f"{event.get('verb')} {resource}"
            counts[kind] += 1
            received, done = event.get("requestReceivedTimestamp"), event.get("stageTimestamp")
            if received and done:
                took = (_when(done) - _when(received)).total_seconds()
                spent[kind] = spent.get(kind, 0.0) + took
        return counts, spent


def _when(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of these processes so far (0 for one that is gone)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def server_pids(plane: Any) -> list[int]:
    """kube-apiserver and etcd of this plane (their command lines name its folder)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if str(plane.workdir) in command and ("kube-apiserver" in command or "etcd" in command):
            found.append(int(entry.name))
    return found


def _settle() -> None:
    """The audit log is written by the API server as requests finish: a second for the
    last ones to land before they are counted."""
    time.sleep(1.0)


def _runs_list(names: list[str]) -> str:
    items = [
        {
            "apiVersion": "alpineagents.dev/v1",
            "kind": "AgentRun",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {
                "model": "claude-sonnet-5",
                "prompt": f"job {name}",
                "restartPolicy": {"initialBackoffSeconds": 0},
            },
        }
        for name in names
    ]
    return yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items})


def _handled_count(plane: Any) -> int:
    listing = plane.kubectl("get", "agentruns", "-n", NAMESPACE, "-o", "json").stdout
    return sum(
        1
        for item in json.loads(listing)["items"]
        if HANDLED in (item["metadata"].get("annotations") or {})
        and (item.get("status") or {}).get("pod")
    )


class Meter:
    """Begins and ends a phase: the operator's requests, CPU and memory over it."""

    def __init__(self, plane: Any, operator: Operator) -> None:
        self.requests = Requests(plane)
        self.operator = operator
        self.servers = server_pids(plane)
        self._cpu = (0.0, 0.0)

    def _cpus(self) -> tuple[float, float]:
        pid = self.operator.process.pid if self.operator.process is not None else -1
        return cpu_seconds([pid]), cpu_seconds(self.servers)

    def begin(self, phase: Phase, operator_restarts: bool = False) -> None:
        _settle()
        self.requests.mark()
        phase.load = os.getloadavg()
        self._cpu = (0.0 if operator_restarts else self._cpus()[0], self._cpus()[1])

    def end(self, phase: Phase) -> None:
        _settle()
        phase.requests, phase.server_seconds = self.requests.since_mark_timed()
        operator_cpu, server_cpu = self._cpus()
        phase.operator_cpu = operator_cpu - self._cpu[0]
        phase.apiserver_cpu = server_cpu - self._cpu[1]
        phase.rss_mib, phase.peak_mib = self.operator.memory_mib()


def measure(workdir: Path, runs: int, lost: int = 30, steady: float = 0.0) -> Scale:
    """``runs`` AgentRuns, then ``lost`` of their pods lost; ``steady``: seconds of idle
    resync measured (0: two resync periods)."""
    steady = steady or 2 * RESYNC_SECONDS
    result = Scale(runs, lost=min(lost, runs))
    store = workdir / "runs"
    store.mkdir()
    with control_plane(workdir) as plane:
        operator = Operator(plane.client_kubeconfig("operator"), store, workdir / "operator.log")
        port = free_port()
        operator.env["ALPINEAGENTS_METRICS_PORT"] = str(port)
        meter = Meter(plane, operator)
        run_watch, pod_watch = Watch(plane.api_client(), "runs"), Watch(plane.api_client(), "pods")
        try:
            operator.start()
            run_watch.start()
            pod_watch.start()
            # Ready: it handled one run from its watch (its pod exists).
            plane.kubectl("create", "-f", "-", input=_runs_list(["warm-up"]))
            pod_watch.wait_for(["warm-up"])
            time.sleep(2.0)  # its imports and first list are done; the idle figure
            result.idle_rss_mib = operator.memory_mib()[0]

            names = [f"run-{n:05d}" for n in range(runs)]
            meter.begin(result.burst)
            began = time.monotonic()
            plane.kubectl("create", "-f", "-", input=_runs_list(names), timeout=DEADLINE)
            result.creating_seconds = time.monotonic() - began
            pod_watch.wait_for(names)
            first = min(run_watch.added[n] for n in names)
            last = max(pod_watch.added[n] for n in names)
            result.burst.seconds = last - first
            result.burst.latencies = [pod_watch.added[n] - run_watch.added[n] for n in names]
            _wait_settled(plane, runs + 1)
            meter.end(result.burst)

            # Steady: nothing changes; the resync loop reads every run.
            meter.begin(result.steady)
            time.sleep(steady)
            result.steady.seconds = steady
            meter.end(result.steady)

            # Restart: every run resumed by kopf (annotation already there: a resume).
            operator.stop()
            meter.begin(result.restart, operator_restarts=True)
            began = time.monotonic()
            operator.start()
            _wait_resumed(port, runs + 1)
            result.restart.seconds = time.monotonic() - began
            meter.end(result.restart)
            if _handled_count(plane) != runs + 1:
                raise RuntimeError("not every run has its pod and the operator's annotation")

            # Losses: pods of ``lost`` runs deleted at once (Pending on no node, they go
            # at once): pod DELETED → replacement ADDED, on the benchmark's pod watch.
            time.sleep(RESYNC_SECONDS / 2)  # the restart's follow-up steps are done
            meter.begin(result.losses)
            chosen = names[:: max(1, runs // result.lost)][: result.lost]
            plane.kubectl(
                "delete", "pods", "-n", NAMESPACE, "--wait=false", *(f"{n}-1" for n in chosen)
            )
            pod_watch.wait_for([f"{n}-2" for n in chosen], "ADDED")
            result.losses.latencies = [
                pod_watch.by_name[("ADDED", f"{n}-2")] - pod_watch.by_name[("DELETED", f"{n}-1")]
                for n in chosen
            ]
            result.losses.seconds = max(result.losses.latencies)
            meter.end(result.losses)
        finally:
            run_watch.stop()
            pod_watch.stop()
            operator.stop()
    return result


def _wait_settled(plane: Any, runs: int) -> None:
    """Wait until every run's status names its pod and kopf marked it handled (the
    steps after the pod's creation are done)."""
    deadline = time.monotonic() + DEADLINE
    while _handled_count(plane) < runs:
        if time.monotonic() > deadline:
            raise TimeoutError(f"not every one of {runs} runs settled")
        time.sleep(2.0)  # polling the list as the admin: not the operator's requests


def _wait_resumed(port: int, runs: int) -> None:
    """Wait until the restarted operator looked at every run once (its metric)."""
    deadline = time.monotonic() + DEADLINE
    while resumed(port) < runs:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the restarted operator did not reach {runs} runs")
        time.sleep(0.5)  # polling its metrics page: it has no change event to await


# --------------------------------------------------------------------------- the page


GOAL = (
    "every new run gets its pod and every lost pod is replaced (issue 14 asks for the "
    "figures, with no threshold)"
)


def section(page: Page, work: Path, repeats: int, sizes: Sizes, postgres: str | None) -> None:
    """The operator with ``sizes.operator_runs`` AgentRuns (one pass: minutes per pass)."""
    from .measure import percentile
    from .results_page import Row, table

    page.order = ORDER
    n = sizes.operator_runs
    what = (
        f"operator with {n:,} AgentRuns: RSS, time until every new run has its pod, "
        "apiserver requests per reconcile"
    )
    try:
        scale = measure(work, n, steady=sizes.operator_idle)
    except PlaneUnavailable as error:
        page.rows["operator-scale"] = Row(what, "-", GOAL, None)
        page.not_measured.append(f"Operator scale: {error}")
        return
    burst, steady, restart = scale.burst, scale.steady, scale.restart
    lat, gone = burst.latencies, scale.losses.latencies
    page.rows["operator-scale"] = Row(
        what,
        f"RSS {burst.rss_mib:.0f} MiB (idle {scale.idle_rss_mib:.0f}); all {n:,} new runs "
        f"had pods {burst.seconds:.1f} s after the first was created (each: p50 "
        f"{percentile(lat, 0.5):.2f} s, p95 {percentile(lat, 0.95):.2f} s); "
        f"{burst.total / burst.steps:.1f} requests per reconcile step, "
        f"{burst.total / n:.1f} per new run; idle resync "
        f"{steady.total / steady.seconds:.0f} requests/s; {scale.lost} pods lost at once: "
        f"replaced in p50 {percentile(gone, 0.5):.2f} s, p95 {percentile(gone, 0.95):.2f} s",
        GOAL,
        len(lat) == n and len(gone) == scale.lost,
        f"1 pass: {len(lat):,} new runs, {len(gone)} losses",
    )

    def line(label: str, phase: Phase) -> list[str]:
        return [
            label,
            f"{phase.seconds:.1f} s",
            f"{phase.total:,}",
            f"{phase.steps:,}",
            f"{phase.total / max(1, phase.steps):.1f}",
            f"{phase.rss_mib:.0f} MiB ({phase.peak_mib:.0f})",
            f"{phase.operator_cpu:.1f} s",
            f"{phase.apiserver_cpu:.1f} s",
            " / ".join(f"{v:.1f}" for v in phase.load),
        ]

    breakdown = ", ".join(
        f"{key} {count:,} ({burst.server_seconds.get(key, 0.0) / count * 1000:.0f} ms)"
        for key, count in burst.requests.most_common()
        if not key.startswith("watch")
    )
    page.sections.append(
        [
            f"## The operator with {n:,} AgentRuns",
            "",
            *table(
                [
                    "phase",
                    "wall time",
                    "operator's requests",
                    "reconcile steps",
                    "requests per step",
                    "RSS after (peak)",
                    "operator CPU",
                    "apiserver + etcd CPU",
                    "load average at start",
                ],
                [
                    line(f"{n:,} runs created at once → every one has its pod", burst),
                    line(f"steady: {steady.seconds:.0f} s of resync, nothing changing", steady),
                    line(f"operator restarted with {n:,} runs → looked at every one", restart),
                    line(
                        f"{scale.lost} of the runs' pods deleted at once → all replaced",
                        scale.losses,
                    ),
                ],
            ),
            "",
            f"The bench's etcd + kube-apiserver only (no node: pods stay Pending), the "
            "operator as its own process (`python -m alpineagents_operator`, resync every "
            f"{RESYNC_SECONDS:.0f} s as the chart's default, a FileStore), its requests "
            "counted from the API server's audit log under a user of its own. The "
            f"benchmark's own `kubectl create` of the {n:,} runs took "
            f"{scale.creating_seconds:.1f} s, so the runs arrived over that time; each "
            f"run's wait for its pod, created → pod ADDED: p50 {percentile(lat, 0.5):.2f} s, "
            f"p95 {percentile(lat, 0.95):.2f} s, max {max(lat):.2f} s. The losses: each "
            "pod's DELETED → its replacement's ADDED on the benchmark's watch (a Pending "
            "pod is deleted at once; no node, no store to read on the way), p50 "
            f"{percentile(gone, 0.5):.2f} s, p95 {percentile(gone, 0.95):.2f} s. Requests during the "
            f"burst (until every status names its pod), with the API server's mean time "
            f"for each: {breakdown}. A reconcile step is one GET of the run and one LIST "
            "of its pods, then what it changes; a resync round looks at every run from "
            "the watches' views and steps only those a step would change, then "
            f"{RESYNC_SECONDS:.0f} s of sleep. One pass; the "
            "machine is shared (load in the last column), so CPU seconds say more than "
            "wall times.",
        ]
    )
