"""The warm pool on the real node: one loss resumed in a standby, beside one resumed in a
new pod, and what a waiting standby costs.

``python -m benchmarks.warm_pool --out X`` (as root; the real node's lock is taken by the
bench). It installs the chart as :mod:`benchmarks.resume_latency` does, with
``runs.warmPool: 1`` and the runs' small resources as the chart's defaults (a run that
sets ``spec.resources`` or ``spec.env`` has a pod unlike the pool's, and gets its own).
Then it alternates rounds of one loss each:

- *with the pool*: a run whose pod would be the pool's; its first pod (attempt 1: the pool
  is for replacements) is deleted while its tool call is held; the operator hands the run
  to the waiting standby and starts a new one;
- *without*: the same run with one harmless ``spec.env`` variable, so its replacement is
  a pod of its own, as without a pool, on the same node at the same time.

Times as in :mod:`benchmarks.resume_latency`: *delete issued* here, *replacement* the
watch event where a pod first carries the run's label with attempt 2 (the standby's
relabelling, or the new pod's ADDED), *first save* the first entry's time saved after it.

Idle cost: the waiting standby's runner process, found on this machine by its
``ALPINEAGENTS_STANDBY_ID`` (the node's containers are this machine's processes): its
resident memory, and its CPU time over :data:`IDLE_SECONDS`, beside the chart's MinIO's
over the same time (which answers the standby's requests).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from alpineagents.runner.standby import BACKSTOP_SECONDS, DOORBELL_CHECK_SECONDS

from .measure import SETTLE_LIMIT, SETTLED_LOAD, load_average, machine, percentile, settle
from .resume_latency import (
    DEADLINE,
    NAMESPACE,
    RELEASE,
    RUN_RESOURCES,
    Loss,
    PodEvent,
    PodWatch,
    entry_times,
    loss_cue,
    real_node,
    run_manifest,
    runs_now,
    wait_all_succeeded,
)

IDLE_SECONDS = 30.0
STANDBY_LABEL = "alpineagents.dev/standby"


SLOW_REST = 3.0
"""A resume slower than this from its pod to its first save has the pod's log printed."""


def ready_standby(core: Any) -> str:
    """The name of a waiting standby whose runner runs (waits for one)."""
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        pods = core.list_namespaced_pod(NAMESPACE, label_selector=f"{STANDBY_LABEL}=true").items
        for pod in pods:
            statuses = pod.status.container_statuses or []
            if any(s.state.running for s in statuses) and not pod.metadata.deletion_timestamp:
                return str(pod.metadata.name)
        time.sleep(0.5)  # the pool starting its next standby: not a measured time
    raise TimeoutError("no standby became ready")


def attempt_pod(run: str, attempt: int = 2) -> Callable[[PodEvent], bool]:
    """The first event of the pod that carries ``run``'s ``attempt`` (a standby
    relabelled, or a new pod added)."""
    return lambda e: e.run == run and e.attempt == str(attempt)


def one_loss(cluster: Any, gate: Any, watch: PodWatch, *, pooled: bool) -> Loss:
    from kubernetes import client

    core = client.CoreV1Api(cluster.plane.api_client())
    standby = ready_standby(core)  # both kinds: the same node state
    name = f"wp-{uuid.uuid4().hex[:6]}"
    manifest = run_manifest(name, gate.command(name))
    spec = manifest["spec"]
    del spec["resources"]  # the chart's runs.resources are these (the pool's pods' too)
    if pooled:
        del spec["env"]  # (its JSON log's startup marks are not read here)
    else:
        spec["env"].append({"name": "UNLIKE_THE_POOL", "value": "1"})
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest))
    gate.wait_started(name, timeout=DEADLINE)
    loss = Loss(name)
    loss.issued = time.time()
    core.delete_namespaced_pod(f"{name}-1", NAMESPACE)
    loss.observed = watch.wait_for(loss_cue(f"{name}-1"), f"{name}-1 lost").at
    taken = watch.wait_for(attempt_pod(name), f"{name} attempt 2's pod")
    loss.created = taken.at
    if pooled != (taken.name == standby):
        raise RuntimeError(
            f"run {name}: attempt 2 went to {taken.name}, expected "
            f"{'the standby ' + standby if pooled else 'a pod of its own'}"
        )
    states = wait_all_succeeded(cluster, [name])
    times = entry_times(cluster, [states[name]])[states[name]]
    after = [t for t in times if t > loss.created]
    if not after:
        raise RuntimeError(f"run {name} Succeeded with no entry saved after its resume")
    loss.first_save = min(after)
    if loss.rest > SLOW_REST:  # the pod's own account of where the time went
        logs = cluster.kubectl("logs", taken.name, "-n", NAMESPACE, "--timestamps", check=False)
        print(
            f"{name}: {loss.rest:.2f} s in {taken.name}; its log:\n{logs.stdout}", file=sys.stderr
        )
    cluster.kubectl("delete", "agentruns", name, "-n", NAMESPACE, "--wait=false")
    return loss


def pod_process(matches: Callable[[bytes, list[bytes]], bool], what: str) -> int:
    """The pid of the process on this machine whose command line and environment
    ``matches`` (a pod's: the kubelet's processes are this machine's)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if matches(command, environ):
            return int(entry.name)
    raise RuntimeError(f"no {what} process on this machine")


def standby_process() -> int:
    """The pid of a waiting standby's runner."""
    return pod_process(
        lambda command, environ: (
            b"alpineagents" in command
            and any(v.startswith(b"ALPINEAGENTS_STANDBY_ID=") for v in environ)
        ),
        "standby runner",
    )


def store_process() -> int:
    """The pid of the chart's MinIO (in its pod: the bench's own MinIO servers are not)."""
    return pod_process(
        lambda command, environ: (
            command.split(b"\0")[0].endswith(b"minio")
            and any(v.startswith(b"KUBERNETES_SERVICE_HOST=") for v in environ)
        ),
        "MinIO pod's",
    )


@dataclass(frozen=True)
class IdleCost:
    """What a waiting standby costs, over :data:`IDLE_SECONDS`."""

    rss_mib: float
    """The standby runner's resident memory."""
    cpu: float
    """Its CPU time, as a share of one CPU."""
    store_cpu: float
    """The store's (MinIO's) CPU share meanwhile: answering the standby, and its own
    idle work."""


def idle_cost(pid: int, store_pid: int) -> IdleCost:
    """What standby ``pid`` and the store ``store_pid`` use while the standby waits."""

    def cpu_seconds(of: int) -> float:
        fields = Path(f"/proc/{of}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    before, store_before = cpu_seconds(pid), cpu_seconds(store_pid)
    time.sleep(IDLE_SECONDS)  # the measured interval itself
    share = (cpu_seconds(pid) - before) / IDLE_SECONDS
    store_share = (cpu_seconds(store_pid) - store_before) / IDLE_SECONDS
    rss_kib = next(
        int(line.split()[1])
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith("VmRSS:")
    )
    return IdleCost(rss_kib / 1024, share, store_share)


def waiting_standby_ids() -> set[str]:
    """The standby ids (pod uids) whose runner on this machine is waiting: imported and
    asking its store folder for its assignment, which it does over a socket it keeps open
    (the imports come first, so a socket means they are done)."""
    found: set[str] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            command = (entry / "cmdline").read_bytes()
            ids = [
                v.split(b"=", 1)[1] for v in environ if v.startswith(b"ALPINEAGENTS_STANDBY_ID=")
            ]
            if b"alpineagents" not in command or not ids:
                continue
            sockets = any(os.readlink(fd).startswith("socket:") for fd in (entry / "fd").iterdir())
        except OSError:
            continue
        if sockets:
            found.add(ids[0].decode())
    return found


def wait_pool_waiting(core: Any, size: int) -> set[str]:
    """Wait until ``size`` standbys run and wait for a run; returns their pod names."""
    deadline = time.monotonic() + DEADLINE
    seen: set[str] = set()  # a socket between two polls may be closed when looked at
    while True:
        seen |= waiting_standby_ids()
        pods = core.list_namespaced_pod(NAMESPACE, label_selector=f"{STANDBY_LABEL}=true").items
        running = {
            pod.metadata.uid: pod.metadata.name
            for pod in pods
            if not pod.metadata.deletion_timestamp
            and any(s.state.running for s in pod.status.container_statuses or [])
        }
        waiting = {name for uid, name in running.items() if uid in seen}
        if len(waiting) >= size:
            return waiting
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(waiting)} of {size} standbys waiting after {DEADLINE:.0f} s")
        time.sleep(1.0)  # the pool starting: before the measured burst


@dataclass
class BurstResult:
    """One burst: each run's loss, whether a waiting standby took it, and the load."""

    losses: list[Loss]
    to_standby: int
    call_starts: dict[str, int]
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]
    operator_restarts: int = 0
    """Operator containers restarted during the burst (a leader that could not renew its
    Lease in time ends, and a standby replica takes over)."""


def one_burst(cluster: Any, gate: Any, watch: PodWatch, size: int) -> BurstResult:
    """``size`` runs whose pods would be the pool's, each held in its tool call, then all
    their first pods deleted in one ``kubectl delete`` (graceful stops, not waited for)."""
    from kubernetes import client

    core = client.CoreV1Api(cluster.plane.api_client())
    names = [f"wb-{uuid.uuid4().hex[:6]}" for _ in range(size)]
    documents = []
    for name in names:
        manifest = run_manifest(name, gate.command(name))
        del manifest["spec"]["resources"]  # the chart's runs.resources: the pool's pods'
        del manifest["spec"]["env"]
        documents.append(manifest)
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(documents))
    for name in names:
        gate.wait_started(name, timeout=DEADLINE)
    standbys = wait_pool_waiting(core, size)
    settle()
    restarts_before = operator_restarts(core)
    # Each run's pod now: a run whose first pod failed as it started (a store too busy to
    # answer while 60 pods start) runs in its second, which is the one in the call.
    runs = runs_now(cluster)
    statuses = {n: runs[n].get("status") or {} for n in names}
    pods = {n: str(statuses[n]["pod"]) for n in names}
    attempts = {n: int(statuses[n]["attempt"]) for n in names}
    load_before = os.getloadavg()
    issued = time.time()
    cluster.kubectl("delete", "pod", *pods.values(), "-n", NAMESPACE, "--wait=false")
    losses = {n: Loss(n, issued=issued) for n in names}
    to_standby = 0
    for name in names:
        loss = losses[name]
        loss.observed = watch.wait_for(loss_cue(pods[name]), f"{pods[name]} lost").at
        resumed = attempts[name] + 1
        taken = watch.wait_for(attempt_pod(name, resumed), f"{name} attempt {resumed}'s pod")
        loss.created = taken.at
        to_standby += taken.name in standbys
    states = wait_all_succeeded(cluster, names)
    load_after = os.getloadavg()
    times = entry_times(cluster, list(states.values()))
    for name, state_id in states.items():
        loss = losses[name]
        after = [t for t in times[state_id] if t > loss.created]
        if not after:
            raise RuntimeError(f"run {name} Succeeded with no entry saved after its resume")
        loss.first_save = min(after)
        if not loss.issued <= loss.observed <= loss.created <= loss.first_save:
            raise RuntimeError(f"run {name}: times out of order: {loss}")
    starts = {n: gate.starts(n) for n in names}
    cluster.kubectl("delete", "agentruns", *names, "-n", NAMESPACE, "--wait=false")
    return BurstResult(
        [losses[n] for n in names],
        to_standby,
        starts,
        load_before,
        load_after,
        operator_restarts(core) - restarts_before,
    )


def operator_restarts(core: Any) -> int:
    """Restarts of the operator replicas' containers so far."""
    pods = core.list_namespaced_pod(NAMESPACE, label_selector=_OPERATOR_PODS).items
    return sum(s.restart_count for p in pods for s in p.status.container_statuses or ())


def measure_burst(workdir: Path, size: int, operator_log: Path | None = None) -> BurstResult:
    """One burst of ``size`` on the real node; ``operator_log``: the operator's log at
    INFO (each reconcile step's note), written there at the end."""
    from tests.bench.node_network import TEST_SERVERS_ADDRESS
    from tests.bench.tool_gate import ToolGate

    chart = {"runs": {"warmPool": size, "resources": RUN_RESOURCES}}
    operator = {"logLevel": "INFO"} if operator_log else None
    with real_node(workdir, operator, chart_values=chart) as cluster:
        gate = ToolGate(TEST_SERVERS_ADDRESS)
        gate.start()
        watch = PodWatch(cluster.plane.api_client())
        try:
            watch.start()
            return one_burst(cluster, gate, watch, size)
        except Exception:
            _print_node_state(cluster)
            raise
        finally:
            watch.stop()
            gate.stop()
            if operator_log is not None:
                operator_log.write_text(_operator_log(cluster))


_OPERATOR_PODS = "app.kubernetes.io/component=operator"


def _operator_log(cluster: Any) -> str:
    """Every replica's log (the leader's is the one that acts), each line prefixed with
    its pod, and before it the log of each replica's previous container, if it restarted
    (a leader that lost its Lease ends)."""
    names = cluster.kubectl(
        "get", "pods", "-l", _OPERATOR_PODS, "-n", NAMESPACE, "-o", "name", check=False
    ).stdout.split()
    logs = ["logs", "-n", NAMESPACE, "-c", "operator", "--prefix", "--timestamps"]
    previous = [cluster.kubectl(*logs, name, "--previous", check=False).stdout for name in names]
    current = cluster.kubectl(*logs, "-l", _OPERATOR_PODS, "--tail=-1", check=False).stdout
    return "".join(previous) + str(current)


def _print_node_state(cluster: Any) -> None:
    """What to read when a burst fails: every pod of the namespace and the operator's log."""
    for args in (
        ("get", "pods", "-n", NAMESPACE, "-o", "wide"),
        ("get", "events", "-n", NAMESPACE, "--sort-by=.lastTimestamp"),
        (
            "logs",
            f"deployment/{RELEASE}-alpineagents-operator",
            "-n",
            NAMESPACE,
            "-c",
            "operator",
            "--tail=80",
        ),
    ):
        result = cluster.kubectl(*args, check=False)
        print(f"$ kubectl {' '.join(args)}\n{result.stdout}{result.stderr}", file=sys.stderr)


def burst_page(result: BurstResult, size: int, began: float) -> list[str]:
    losses = result.losses
    whole = [x.total for x in losses]
    once = sum(1 for n in result.call_starts.values() if n == 1)

    def cells(values: list[float]) -> str:
        return (
            f"{percentile(values, 0.5):.2f} | {percentile(values, 0.95):.2f} | {max(values):.2f} s"
        )

    def load(values: tuple[float, float, float]) -> str:
        return " / ".join(f"{v:.1f}" for v in values)

    return [
        f"# {size} graceful stops at once with a warm pool of {size}",
        "",
        f"Measured by `python -m benchmarks.warm_pool --burst {size}` on "
        f"{time.strftime('%Y-%m-%d', time.gmtime(began))}. Machine: {machine()}; load "
        f"average {load(result.load_before)} before the deletes, "
        f"{load(result.load_after)} when every run had Succeeded (the machine is shared).",
        "",
        f"The chart with `runs.warmPool: {size}`; {size} runs whose pods would be the "
        f"pool's, each held in its tool call; once {size} standbys were running and "
        f"waiting (their runner imported and asking the store for its assignment), all "
        f"{size} runs' pods deleted in one `kubectl delete pod ... --wait=false`, once "
        f"the machine had settled (1-minute load average under {SETTLED_LOAD:.0f}, or "
        f"{SETTLE_LIMIT:.0f} s after the last standby waited). Times per run from "
        "that command to the first entry saved after the run's next attempt's pod appeared "
        "(the standby's relabelling, or a new pod's creation).",
        "",
        "| phase | p50 | p95 | max |",
        "|---|---:|---:|---:|",
        f"| delete issued → loss observed | {cells([x.observed - x.issued for x in losses])} |",
        f"| operator: loss observed → replacement | {cells([x.operator for x in losses])} |",
        f"| replacement → first saved entry | {cells([x.rest for x in losses])} |",
        f"| **whole: delete issued → first saved entry** | {cells(whole)} |",
        "",
        f"{result.to_standby} of {size} runs resumed in a waiting standby, "
        f"{size - result.to_standby} in a pod of their own. Every run Succeeded; "
        f"{once} of {size} tool calls started exactly once (the gate's count). "
        f"Operator restarts during the burst: {result.operator_restarts}.",
        "",
    ]


def measure(workdir: Path, rounds: int) -> tuple[list[Loss], list[Loss], IdleCost]:
    from tests.bench.node_network import TEST_SERVERS_ADDRESS
    from tests.bench.tool_gate import ToolGate

    chart = {"runs": {"warmPool": 1, "resources": RUN_RESOURCES}}
    with real_node(workdir, chart_values=chart) as cluster:
        gate = ToolGate(TEST_SERVERS_ADDRESS)
        gate.start()
        watch = PodWatch(cluster.plane.api_client())
        pooled: list[Loss] = []
        own: list[Loss] = []
        try:
            watch.start()
            one_loss(cluster, gate, watch, pooled=False)  # warm-up: the first pods on the node
            for _ in range(rounds):
                pooled.append(one_loss(cluster, gate, watch, pooled=True))
                own.append(one_loss(cluster, gate, watch, pooled=False))
            from kubernetes import client

            ready_standby(client.CoreV1Api(cluster.plane.api_client()))
            cost = idle_cost(standby_process(), store_process())
        finally:
            watch.stop()
            gate.stop()
    return pooled, own, cost


def _cell(values: list[float]) -> str:
    return f"{percentile(values, 0.5):.2f} / {percentile(values, 0.95):.2f} s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.warm_pool")
    parser.add_argument("--rounds", type=int, default=5, help="losses of each kind (5)")
    parser.add_argument(
        "--burst", type=int, default=0, help="instead: N graceful stops at once, pool of N"
    )
    parser.add_argument("--out", type=Path, required=True, help="where to write the page")
    parser.add_argument(
        "--operator-log", type=Path, help="with --burst: the operator's log at INFO, here"
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    began = time.time()
    if args.burst:
        with tempfile.TemporaryDirectory(prefix="alpineagents-bench-") as folder:
            result = measure_burst(Path(folder), args.burst, args.operator_log)
        page = burst_page(result, args.burst, began)
        args.out.write_text("\n".join(page), encoding="utf-8")
        print("\n".join(page))
        return 0
    with tempfile.TemporaryDirectory(prefix="alpineagents-bench-") as folder:
        pooled, own, cost = measure(Path(folder), args.rounds)

    def row(label: str, losses: list[Loss]) -> str:
        return (
            f"| {label} | {_cell([x.observed - x.issued for x in losses])} | "
            f"{_cell([x.operator for x in losses])} | {_cell([x.rest for x in losses])} | "
            f"**{_cell([x.total for x in losses])}** |"
        )

    lines = [
        "# The warm pool on the real node",
        "",
        f"Measured by `python -m benchmarks.warm_pool --rounds {args.rounds}` on "
        f"{time.strftime('%Y-%m-%d', time.gmtime(began))}. Machine: {machine()}; load "
        f"average {load_average()} at the end (the machine is shared).",
        "",
        "One loss at a time (a graceful delete of the run's pod while its tool call is "
        "held), rounds with and without the pool alternated on the same node; p50 / p95.",
        "",
        "| replacement | delete issued → loss observed | operator: loss observed → "
        "replacement | replacement → first saved entry | whole: delete issued → first "
        "saved entry |",
        "|---|---:|---:|---:|---:|",
        row(f"a waiting standby ({len(pooled)} losses)", pooled),
        row(f"a pod of its own ({len(own)} losses)", own),
        "",
        f"A waiting standby's runner (imported, its doorbell read every "
        f"{DOORBELL_CHECK_SECONDS} s, the store asked every {BACKSTOP_SECONDS} s): "
        f"{cost.rss_mib:.0f} MiB resident, {cost.cpu * 100:.1f} % of one CPU over "
        f"{IDLE_SECONDS:.0f} s; MinIO meanwhile {cost.store_cpu * 100:.1f} % (its own idle "
        "work included).",
        "",
    ]
    args.out.write_text("\n".join(lines), encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
