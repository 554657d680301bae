"""Two teams sharing one Kueue ClusterQueue: the queues, a kubelet's part for pods on a
plane without nodes, and what the watches saw, judged (issue 41).

Used by ``tests/operator/test_kueue_fair_share.py`` (20 runs a team, the issue's size).

- :func:`queue_objects`: one ClusterQueue with admission fair sharing and a LocalQueue
  in each namespace (see its docstring for why this and not a cohort of two);
  :func:`teams_on_one_queue`: two such namespaces made, with an operator admitting their
  labelled runs through Kueue (also for ``tests/operator/test_spend_cap_with_kueue.py``);
- :class:`PodEnds`: plays the kubelet: each run pod ends (exit 0, the runner's report)
  a while after it was created;
- :func:`judge`: from the watches' events, whether any pod was created before its run's
  Workload was admitted, how many each team had admitted, and each team's share of the
  quota while both had runs waiting.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.bench.operator_process import (
    Event,
    EventLog,
    OperatorProcess,
    operator_in_namespace,
    run_label,
)

QUEUE = "agents"
RUN_CPU = 1
"""CPUs each run's pod asks for: the quota is counted in runs of this size."""

JSON = dict[str, Any]


def queue_objects(namespaces: Sequence[str], runs_at_once: int, tag: str) -> list[JSON]:
    """A flavor, one ClusterQueue ``cq-<tag>`` with the quota for ``runs_at_once`` runs,
    and in each namespace a LocalQueue ``QUEUE`` pointing at it.

    The ClusterQueue's ``admissionScope`` asks for Kueue's admission fair sharing (KEP
    4136): the next workload admitted is the head of the LocalQueue whose usage of the
    quota so far is lowest (sampled each second, a penalty added for each admission in
    between, decaying over the half-life the controller is given: ten minutes, longer
    than a run here, so it is the usage since the start). The teams' usage evens out
    over the run, 1:1 with equal weights, whichever team's runs came first.

    Kueue's other fair sharing, between the ClusterQueues of a cohort (one per team,
    half the quota each, borrowing allowed), evens out only what a queue borrows at
    each admission (dominant resource share with the workload added, KEP 1714): with
    five runs' quota each team keeps two, and the fifth is a tie Kueue settles by the
    workloads' creation times, in whole seconds. Measured here, one team held the fifth
    place throughout: 3:2 over the run.
    """
    return [
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": f"flavor-{tag}"},
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": f"cq-{tag}"},
            "spec": {
                "namespaceSelector": {
                    "matchExpressions": [
                        {
                            "key": "kubernetes.io/metadata.name",
                            "operator": "In",
                            "values": list(namespaces),
                        }
                    ]
                },
                "admissionScope": {"admissionMode": "UsageBasedAdmissionFairSharing"},
                "resourceGroups": [
                    {
                        # Memory and disk to spare: the run pod's limits on them
                        # count too, and only the CPU is to hold runs back.
                        "coveredResources": ["cpu", "memory", "ephemeral-storage"],
                        "flavors": [
                            {
                                "name": f"flavor-{tag}",
                                "resources": [
                                    {"name": "cpu", "nominalQuota": str(runs_at_once * RUN_CPU)},
                                    {"name": "memory", "nominalQuota": "1Ti"},
                                    {"name": "ephemeral-storage", "nominalQuota": "1Ti"},
                                ],
                            }
                        ],
                    }
                ],
            },
        },
        *(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "LocalQueue",
                "metadata": {"name": QUEUE, "namespace": namespace},
                "spec": {"clusterQueue": f"cq-{tag}"},
            }
            for namespace in namespaces
        ),
    ]


def created(plane: Any, *objects: JSON) -> None:
    """Create ``objects`` on the bench's kube-apiserver, in one request."""
    listed = {"kind": "List", "apiVersion": "v1", "items": list(objects)}
    plane.kubectl("create", "-f", "-", input=json.dumps(listed))


@contextlib.contextmanager
def teams_on_one_queue(
    plane: Any, directory: Path, prefix: str, runs_at_once: int
) -> Iterator[tuple[list[str], OperatorProcess]]:
    """Two fresh namespaces with their LocalQueues ``QUEUE`` on one ClusterQueue holding
    ``runs_at_once`` runs (:func:`queue_objects`), and an operator (not started) watching
    both, admitting their labelled runs through Kueue; the queues and namespaces go
    afterwards."""
    with operator_in_namespace(plane, directory, prefix) as (first, _, operator):
        second = f"{prefix}-{uuid.uuid4().hex[:6]}"
        plane.kubectl("create", "namespace", second)
        namespaces = [first, second]
        operator.env["ALPINEAGENTS_KUEUE"] = "true"
        operator.env["ALPINEAGENTS_NAMESPACES"] = ",".join(namespaces)
        tag = first
        objects = queue_objects(namespaces, runs_at_once, tag)
        created(plane, *objects)
        try:
            yield namespaces, operator
        finally:
            cluster_queues = [o["metadata"]["name"] for o in objects if o["kind"] == "ClusterQueue"]
            plane.kubectl(
                "delete", "clusterqueues.kueue.x-k8s.io", *cluster_queues, "--wait=false",
                check=False,
            )  # fmt: skip
            plane.kubectl(
                "delete", "resourceflavors.kueue.x-k8s.io", f"flavor-{tag}", "--wait=false",
                check=False,
            )  # fmt: skip
            plane.kubectl("delete", "namespace", second, "--wait=false", check=False)


def wait_sampled(plane: Any, namespaces: Sequence[str]) -> None:
    """Wait until Kueue has sampled each LocalQueue's usage once (zero, before any run).

    Kueue starts a LocalQueue's usage at what it holds at the first sample: sampled
    first while a team already held runs, that start would count as history."""
    for namespace in namespaces:
        plane.kubectl(
            "wait", "localqueues.kueue.x-k8s.io", QUEUE, "-n", namespace, "--timeout=120s",
            "--for=jsonpath={.status.fairSharing.admissionFairSharingStatus.lastUpdate}",
        )  # fmt: skip


def queued_run(namespace: str, name: str) -> JSON:
    """An AgentRun in LocalQueue ``QUEUE`` whose pod asks for ``RUN_CPU`` CPUs."""
    return {
        "apiVersion": "alpineagents.dev/v1",
        "kind": "AgentRun",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"kueue.x-k8s.io/queue-name": QUEUE},
        },
        "spec": {
            "model": "claude-sonnet-5",
            "prompt": f"job {name}",
            "restartPolicy": {"initialBackoffSeconds": 0},
            "resources": {"requests": {"cpu": str(RUN_CPU)}},
        },
    }


class PodEnds:
    """The kubelet's part on a plane without nodes: each run pod the logs show created
    ends ``hold`` seconds later (varied by up to a half either way, as real runs differ,
    so admissions do not come in lockstep waves) with exit 0 and the runner's report."""

    def __init__(self, api_client: Any, pods: Sequence[EventLog], hold: float) -> None:
        from kubernetes import client

        self._core = client.CoreV1Api(api_client)
        self._pods = list(pods)
        self._hold = hold
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pod-ends", daemon=True)
        self.ended: list[str] = []
        self.failures: list[str] = []

    def __enter__(self) -> PodEnds:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        due: dict[tuple[str, str], float] = {}
        seen = [0] * len(self._pods)
        while not self._stop.is_set():
            for index, log in enumerate(self._pods):
                fresh = log.events[seen[index] :]
                seen[index] += len(fresh)
                for event in fresh:
                    if event.type == "ADDED":
                        key = (event.object["metadata"]["namespace"], event.name)
                        spread = 0.5 + (sum(map(ord, event.name)) % 11) / 10
                        due.setdefault(key, event.at + self._hold * spread)
            now = time.monotonic()
            for key in sorted((k for k, at in due.items() if at <= now), key=due.__getitem__):
                del due[key]
                self._end(*key)
            # A kubelet's pace: this loop stands in for one, and is no synchronization
            # of the test's; the test waits on the runs' events.
            self._stop.wait(0.1)

    def _end(self, namespace: str, pod: str) -> None:
        status = answered_pod_status()
        try:
            self._core.patch_namespaced_pod_status(pod, namespace, status)
            self.ended.append(f"{namespace}/{pod}")
        except Exception as error:  # a pod deleted meanwhile; the test says if it mattered
            self.failures.append(f"{namespace}/{pod}: {error}")


def answered_pod_status(cost_usd: float | None = None) -> dict[str, Any]:
    """A pod's end as its kubelet writes it: exit 0 with the runner's report of an answer
    (for planes with no node, where the test ends the pods), and of what the run cost
    when ``cost_usd`` is given (the operator writes it into ``status.costUSD``)."""
    answered: JSON = {"outcome": "answered", "answer": "done"}
    if cost_usd is not None:
        answered["costUSD"] = cost_usd
    report = json.dumps(answered)
    terminated = {"exitCode": 0, "reason": "Completed", "message": report}
    return {
        "status": {
            "phase": "Succeeded",
            "containerStatuses": [
                {
                    "name": "agent",
                    "image": "alpineagents:kueue",
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": {"terminated": terminated},
                }
            ],
        }
    }


def condition_true(event: Event, kind: str) -> bool:
    """Whether the object of ``event`` (a Workload) has condition ``kind`` True."""
    conditions = (event.object.get("status") or {}).get("conditions") or []
    return any(c.get("type") == kind and c.get("status") == "True" for c in conditions)


def resource_version(event: Event) -> int:
    """The object's resourceVersion: the one etcd's revision of the write the event
    tells of (on the bench, every write of every kind takes one in order)."""
    return int(event.object["metadata"]["resourceVersion"])


@dataclass
class Held:
    """One Workload's admission: when (monotonic, on the watch) and at which
    resourceVersion it was admitted, and when its quota went back."""

    namespace: str
    run: str
    admitted_at: float
    admitted_version: int
    released_at: float | None = None


@dataclass
class Verdict:
    """What the watches saw, judged."""

    pods_before_admission: list[str] = field(default_factory=list)
    """``namespace/pod`` of each pod created before its run's Workload was admitted."""
    admitted: dict[str, int] = field(default_factory=dict)
    """Workloads admitted, by namespace."""
    contended_seconds: float = 0.0
    """How long both namespaces had runs waiting while runs of both were admitted."""
    held: dict[str, float] = field(default_factory=dict)
    """CPU-seconds of quota each namespace held over that time."""
    most_at_once: int = 0
    """The most Workloads holding quota at once."""

    def share_ratio(self, first: str, second: str) -> float:
        """``first``'s held quota over ``second``'s (1.0 is an even split)."""
        return self.held[first] / self.held[second] if self.held.get(second) else float("inf")


def judge(pods: Mapping[str, EventLog], workloads: Mapping[str, EventLog]) -> Verdict:
    """Judge the events of each namespace's pod and Workload watches.

    "Before" compares resourceVersions: the bench's kube-apiserver has one etcd, whose
    revision every write takes in order, so a pod's creation carries a version above
    the write that admitted its Workload exactly when it came after it. The two
    watches' arrival times could not say so (each watch delivers on its own thread).
    """
    verdict = Verdict()
    holds: dict[str, Held] = {}
    for namespace, log in workloads.items():
        for event in log.events:
            name = event.name
            held = holds.get(name)
            if held is None and event.type != "DELETED" and condition_true(event, "Admitted"):
                run = str(
                    (event.object["metadata"].get("labels") or {}).get("alpineagents.dev/run")
                )
                holds[name] = Held(namespace, run, event.at, resource_version(event))
            elif (
                held is not None
                and held.released_at is None
                and (event.type == "DELETED" or condition_true(event, "Finished"))
            ):
                held.released_at = event.at
    by_run = {(h.namespace, h.run): h for h in holds.values()}
    for namespace, log in pods.items():
        for event in log.events:
            if event.type != "ADDED":
                continue
            held = by_run.get((namespace, run_label(event)))
            if held is None or held.admitted_version >= resource_version(event):
                verdict.pods_before_admission.append(f"{namespace}/{event.name}")
    for namespace in workloads:
        verdict.admitted[namespace] = sum(1 for h in holds.values() if h.namespace == namespace)
    if not all(verdict.admitted.values()):
        return verdict  # a team never admitted: no share to speak of (held stays empty)
    # While both wait: from the first admission until the last admission of the team
    # whose line emptied first (after it, the other has the quota to itself).
    start = min(h.admitted_at for h in holds.values())
    end = min(
        max(h.admitted_at for h in holds.values() if h.namespace == namespace)
        for namespace in workloads
    )
    verdict.contended_seconds = end - start
    for namespace in workloads:
        verdict.held[namespace] = sum(
            RUN_CPU * max(0.0, min(h.released_at or end, end) - max(h.admitted_at, start))
            for h in holds.values()
            if h.namespace == namespace
        )
    moments = sorted(
        [(h.admitted_at, 1) for h in holds.values()]
        + [(h.released_at, -1) for h in holds.values() if h.released_at is not None]
    )
    level = 0
    for _, step in moments:
        level += step
        verdict.most_at_once = max(verdict.most_at_once, level)
    return verdict
