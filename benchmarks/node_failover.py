"""Operator failover on the real node, as a user has it: the leader's process SIGKILLed.

Section ``failover-node`` of ``python -m benchmarks`` (root, the bench's real node, under
``flock /tmp/alpineagents-realnode.lock``). The chart is installed with its defaults: two
operator replicas, the Lease at 15 / 10 / 2 s (lease, renew deadline, retry), INFO logs.
Each trial: the standby replica has read the Lease (its log says whom it stands by for);
the leader's process, found on this machine (the node's containers are its processes) by
its pod's name in its environment, is SIGKILLed, and at once an AgentRun is created.
*Lease taken*: kill → the Lease's event naming a new holder; *next reconcile*: kill → the
new run's pod ADDED, both on watches held here. The killed container restarts (the
kubelet); if the standby took over, the killed pod is then deleted so that a fresh pod
stands by for the next trial (a container killed again and again waits out the kubelet's
growing back-off). After the trials every run has one pod.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from .measure import percentile
from .resume_latency import NAMESPACE, real_node, run_manifest

OPERATOR = "app.kubernetes.io/component=operator"


@dataclass
class NodeFailovers:
    """Seconds from the leader's SIGKILL, per trial; and what the operator pods did."""

    lease_taken: list[float] = field(default_factory=list)
    next_reconcile: list[float] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    """Per trial, why the new leader took the Lease before it ran out ("" if it waited)."""
    takers: list[str] = field(default_factory=list)  # the standby, or the killed pod's restart
    pods: int = 0
    runs: int = 0
    between: list[str] = field(default_factory=list)
    """The Lease changing hands between two trials, nobody killed: whose to whose, and why."""
    timing: tuple[int, float, float] = (0, 0.0, 0.0)
    load: list[tuple[float, float, float]] = field(default_factory=list)

    @property
    def lost_between(self) -> int:
        """How often the Lease changed hands between trials with nobody killed."""
        return len(self.between)


def _pod_of(identity: str) -> str:
    return identity.rsplit("_", 1)[0]


def operator_pid(pod: str) -> int:
    """The operator process of pod ``pod`` on this machine."""
    wanted = f"POD_ID={pod}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes()
            if b"alpineagents_operator" not in command:
                continue
            if wanted in (entry / "environ").read_bytes().split(b"\0"):
                return int(entry.name)
        except OSError:
            continue
    raise RuntimeError(f"no operator process of pod {pod} on this machine")


def _operator_pods(core: Any) -> list[str]:
    """The two operator replicas' pods (not one being deleted), once there are two."""
    deadline = time.monotonic() + 600
    while True:
        pods = [
            str(p.metadata.name)
            for p in core.list_namespaced_pod(NAMESPACE, label_selector=OPERATOR).items
            if not p.metadata.deletion_timestamp
        ]
        if len(pods) == 2:
            return pods
        if time.monotonic() > deadline:
            raise RuntimeError(f"operator pods: {pods}, not two")
        time.sleep(0.5)  # the Deployment replacing a deleted pod: before the trial


def _taken_from(killed: str, event: Any) -> bool:
    """A Lease event naming a holder other than the killed process: the standby, or the
    killed pod's restarted container (a new process, which knows its pod's last holder is
    dead)."""
    from tests.bench.operator_process import holder

    return holder(event) not in ("", killed)


def _first_pod_of(run: str, event: Any) -> bool:
    return bool(event.type == "ADDED" and event.name.startswith(f"{run}-"))


def _log_tail(cluster: Any, pod: str) -> str:
    done = cluster.kubectl("logs", pod, "-n", NAMESPACE, "--tail=200", check=False)
    return str(done.stdout)


def _why_taken(cluster: Any, pod: str, previous: str) -> str:
    """Why ``pod``'s operator took the Lease from ``previous`` before the lease ran out
    (its log's reason, `lease_holder.py`), or "" if it did not say."""
    said = f"holder {previous} is dead: "
    for line in reversed(_log_tail(cluster, pod).splitlines()):
        if said in line:
            return line.split(said, 1)[1].split("; taking it", 1)[0]
    return ""


def _wait_standing_by(cluster: Any, pod: str, holder: str) -> None:
    """Until ``pod``'s operator has read the Lease held by ``holder`` (its log says so;
    a file the kubelet keeps, polled)."""
    deadline = time.monotonic() + 600
    while f"is held by {holder}" not in _log_tail(cluster, pod):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{pod} did not stand by for {holder}:\n{_log_tail(cluster, pod)}")
        time.sleep(0.5)


def measure(workdir: Path, trials: int) -> NodeFailovers:
    """``trials`` SIGKILLed leaders on the real node, the chart's defaults."""
    from kubernetes import client
    from tests.bench.operator_process import EventLog

    from alpineagents_operator.edge.leadership import LeaseSettings

    result = NodeFailovers()
    with real_node(workdir, {"logLevel": "INFO"}) as cluster:
        api = cluster.plane.api_client()
        core: Any = client.CoreV1Api(api)
        coordination = client.CoordinationV1Api(api)
        settings = _operator_settings(cluster)
        parsed = LeaseSettings.from_env({**settings, "POD_ID": "bench"})
        if parsed is None:
            raise RuntimeError("the chart's operator elects no leader")
        result.timing = (parsed.lease_seconds, parsed.renew_deadline_seconds, parsed.retry_seconds)
        with EventLog(api, NAMESPACE, "leases") as leases, EventLog(api, NAMESPACE, "pods") as pods:
            last_taker = ""
            for number in range(trials):
                held, leader, standby = _leader_and_standby(core, coordination, settings)
                if last_taker and held != last_taker:
                    why = _why_taken(cluster, leader, last_taker) or "free or run out"
                    result.between.append(f"before trial {number + 1}: {why}")
                _wait_standing_by(cluster, standby, held)
                pid = operator_pid(leader)
                name = f"failover-{number:02d}"
                result.load.append(os.getloadavg())
                killed_at = time.monotonic()
                os.kill(pid, signal.SIGKILL)
                manifest = run_manifest(name, "true")
                cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(manifest))
                taken = leases.wait_for(partial(_taken_from, held), after=killed_at)
                pod = pods.wait_for(partial(_first_pod_of, name), after=killed_at)
                result.lease_taken.append(taken.at - killed_at)
                result.next_reconcile.append(pod.at - killed_at)
                result.runs += 1
                from tests.bench.operator_process import holder

                last_taker = holder(taken)
                new_leader = _pod_of(last_taker)
                if new_leader != leader:
                    # A fresh standby for the next trial: the killed pod's container would
                    # come back after the kubelet's crash-loop back-off, which grows with
                    # each kill of the same pod; a replacement pod starts at once. Waited
                    # out: a standby ignores SIGTERM (PID 1 with no handler), so the
                    # deleted pod's restarted container stands by for the whole grace
                    # period and may take the next trial's Lease, then be SIGKILLed.
                    cluster.kubectl(
                        "delete", "pod", leader, "-n", NAMESPACE, "--wait=true", "--timeout=300s"
                    )  # fmt: skip
                result.takers.append(
                    "the standby"
                    if new_leader == standby
                    else "its restart"
                    if new_leader == leader
                    else "another pod"
                )
                result.reasons.append(_why_taken(cluster, new_leader, held))
        result.pods = sum(
            1 for e in pods.events if e.type == "ADDED" and e.name.startswith("failover-")
        )
    if result.pods != result.runs:
        raise RuntimeError(f"{result.pods} pods for {result.runs} runs: a run got a second pod")
    return result


def _leader_and_standby(
    core: Any, coordination: Any, settings: dict[str, str]
) -> tuple[str, str, str]:
    """The Lease's holder, its pod and the other replica's pod, once the holder runs in one
    of the two replicas' pods. The pod deleted after the last trial may still hold the
    Lease: when the standby that took over lost it again (a renewal late on the busy
    node) and the killed pod's restarted container took it before the delete reached it.
    That pod hands the Lease back as it stops; a trial starts after it has."""
    deadline = time.monotonic() + 600
    while True:
        pods = _operator_pods(core)
        held = _holder(coordination, settings)
        leader = _pod_of(held)
        if leader in pods:
            (standby,) = [p for p in pods if p != leader]
            return held, leader, standby
        if time.monotonic() > deadline:
            raise RuntimeError(f"the Lease stays with {held}, not one of the replicas {pods}")
        time.sleep(0.5)  # a Lease has no event worth a watch here: it changes within seconds


def _holder(coordination: Any, settings: dict[str, str]) -> str:
    """The Lease's holder now, once there is one."""
    namespace, name = settings["ALPINEAGENTS_LEADER_LEASE"].split("/", 1)
    deadline = time.monotonic() + 600
    while True:
        lease = coordination.read_namespaced_lease(name, namespace)
        if lease.spec and lease.spec.holder_identity:
            return str(lease.spec.holder_identity)
        if time.monotonic() > deadline:
            raise RuntimeError(f"nobody took Lease {namespace}/{name}")
        time.sleep(0.5)  # the replicas starting: no event to await before the watch


def _operator_settings(cluster: Any) -> dict[str, str]:
    import json

    listing = json.loads(cluster.kubectl("get", "configmaps", "-n", NAMESPACE, "-o", "json").stdout)
    for item in listing["items"]:
        data = item.get("data") or {}
        if "ALPINEAGENTS_LEADER_LEASE" in data:
            return {str(k): str(v) for k, v in data.items()}
    raise RuntimeError("no operator settings (ConfigMap) in the release")


_KINDS = {
    "ran in this pod": "its own pod's container had started again",
    "container has terminated": "the holder's container had terminated",
    "container has restarted": "the holder's container had restarted",
    "waits to start again": "the holder's container had exited and waited in back-off",
    "has ended": "the holder's pod had ended",
    "is gone": "the holder's pod was gone",
    "another pod of that name": "another pod had the holder's pod's name",
}


def _kind(reason: str) -> str:
    """A reason of `lease_holder.py`'s without the pod's name, to count alike ones."""
    return next((kind for phrase, kind in _KINDS.items() if phrase in reason), reason)


def report(result: NodeFailovers) -> list[str]:
    """The section's details, as Markdown lines."""
    from .results_page import table

    def line(label: str, values: list[float]) -> list[str]:
        return [
            label,
            str(len(values)),
            f"{percentile(values, 0.5):.2f} s",
            f"{percentile(values, 0.95):.2f} s",
            f"{max(values):.2f} s",
        ]

    lease, deadline, retry = result.timing
    early = sum(1 for reason in result.reasons if reason)
    kinds = [_kind(reason) for reason in result.reasons if reason]
    why = [f"{kinds.count(kind)}: {kind}" for kind in sorted(set(kinds))]
    return [
        "## Operator failover on the real node (the leader SIGKILLed)",
        "",
        *table(
            ["the leader's process SIGKILLed →", "trials", "p50", "p95", "max"],
            [
                line("Lease taken by a new holder", result.lease_taken),
                line("next reconcile (a new run's pod)", result.next_reconcile),
            ],
        ),
        "",
        f"The chart with its defaults on the bench's real node: two operator replicas, the "
        f"Lease at {lease} / {deadline:g} / {retry:g} s (lease, renew deadline, retry). In "
        f"{early} of {len(result.reasons)} trials the new leader took the Lease because the "
        f"holder's pod showed it dead (`lease_holder.py`: {'; '.join(why) or 'none'}), in the "
        "others when the lease ran out. The new leader was "
        f"the standby in {result.takers.count('the standby')} trials, the killed pod's "
        f"restarted container in {result.takers.count('its restart')} (the kubelet restarts "
        "it at once; it knows its pod's last holder is dead), another pod in "
        f"{result.takers.count('another pod')}. Between two trials, with "
        f"nobody killed, the Lease changed hands {result.lost_between} times"
        + (f" ({'; '.join(result.between)})" if result.between else "")
        + f". {result.pods} pods for {result.runs} runs: no run "
        "got a second pod. Load average (1 min) at the kills: "
        + ", ".join(f"{load[0]:.1f}" for load in result.load)
        + ".",
        "",
        *table(
            ["trial", "Lease taken", "next reconcile", "taken by", "why"],
            [
                [
                    str(n + 1),
                    f"{taken:.2f} s",
                    f"{reconcile:.2f} s",
                    taker,
                    _kind(reason) if reason else "the lease ran out",
                ]
                for n, (taken, reconcile, taker, reason) in enumerate(
                    zip(
                        result.lease_taken,
                        result.next_reconcile,
                        result.takers,
                        result.reasons,
                        strict=True,
                    )
                )
            ],
        ),
    ]
