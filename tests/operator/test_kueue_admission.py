"""Admission by Kueue: the real Kueue controller (built from its Go module) and the
operator as its own process on the bench's kube-apiserver, without a node (pods stay
Pending until the test writes their end, as a kubelet would).

A ClusterQueue with CPU for two runs, a LocalQueue, three AgentRuns labelled with it:
two get pods, the third is Queued naming the queue until one ends; a Workload Kueue
evicts (deactivated) stops its run's pod and queues the run again, without a restart,
and the run resumes once it is admitted again; a suspended or deleted run's quota frees.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.bench.control_plane import ControlPlane
from tests.bench.kueue_controller import Kueue
from tests.bench.kueue_fair_share import answered_pod_status
from tests.bench.operator_process import (
    Event,
    EventLog,
    OperatorProcess,
    agentrun,
    operator_in_namespace,
    pod_added,
    run_label,
)

QUEUE = "agents"


def queue_objects(namespace: str) -> list[dict[str, Any]]:
    """A flavor, a ClusterQueue with CPU for two runs of one CPU each (memory and disk
    to spare), and the namespace's LocalQueue pointing at it."""
    flavor, cluster_queue = f"flavor-{namespace}", f"cq-{namespace}"
    return [
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": flavor},
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": cluster_queue},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory", "ephemeral-storage"],
                        "flavors": [
                            {
                                "name": flavor,
                                "resources": [
                                    {"name": "cpu", "nominalQuota": "2"},
                                    {"name": "memory", "nominalQuota": "64Gi"},
                                    {"name": "ephemeral-storage", "nominalQuota": "64Gi"},
                                ],
                            }
                        ],
                    }
                ],
            },
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": QUEUE, "namespace": namespace},
            "spec": {"clusterQueue": cluster_queue},
        },
    ]


def labelled_run(namespace: str, name: str) -> str:
    manifest = json.loads(agentrun(namespace, name, resources={"requests": {"cpu": "1"}}))
    manifest["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": QUEUE}
    return json.dumps(manifest)


def run_in(name: str, check: Callable[[dict[str, Any]], bool]) -> Callable[[Event], bool]:
    return lambda event: (
        event.object["metadata"]["name"] == name and check(event.object.get("status") or {})
    )


def queued_by(reason: str) -> Callable[[dict[str, Any]], bool]:
    return lambda status: status.get("phase") == "Queued" and status.get("reason") == reason


@pytest.fixture
def with_kueue(
    control_plane: ControlPlane, kueue: Kueue, tmp_path: Path
) -> Iterator[tuple[ControlPlane, str, OperatorProcess]]:
    with operator_in_namespace(control_plane, tmp_path, "kueue") as (namespace, _, operator):
        operator.env["ALPINEAGENTS_KUEUE"] = "true"
        objects = queue_objects(namespace)
        control_plane.kubectl(
            "create",
            "-f",
            "-",
            input=json.dumps({"kind": "List", "apiVersion": "v1", "items": objects}),
        )
        try:
            yield control_plane, namespace, operator
        finally:
            for item in reversed(objects[:2]):
                control_plane.kubectl(
                    "delete", item["kind"].lower(), item["metadata"]["name"], "--wait=false",
                    check=False,
                )  # fmt: skip


def workload_of(plane: ControlPlane, namespace: str, run: str) -> dict[str, Any]:
    listed = plane.kubectl(
        "get", "workloads.kueue.x-k8s.io", "-n", namespace,
        "-l", f"alpineagents.dev/run={run}", "-o", "json",
    )  # fmt: skip
    (workload,) = json.loads(listed.stdout)["items"]
    return dict(workload)


def exited_answered(plane: ControlPlane, namespace: str, pod: str) -> None:
    """Write the pod's end as its kubelet would: exit 0 with the runner's report."""
    status = answered_pod_status()
    plane.kubectl(
        "patch", "pod", pod, "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps(status),
    )  # fmt: skip


def suspend(plane: ControlPlane, namespace: str, run: str, suspended: bool) -> None:
    plane.kubectl(
        "patch", "agentrun", run, "-n", namespace, "--type=merge",
        "-p", json.dumps({"spec": {"suspend": suspended}}),
    )  # fmt: skip


def set_active(plane: ControlPlane, namespace: str, workload: str, active: bool) -> None:
    plane.kubectl(
        "patch", "workloads.kueue.x-k8s.io", workload, "-n", namespace, "--type=merge",
        "-p", json.dumps({"spec": {"active": active}}),
    )  # fmt: skip


def test_kueue_admits_two_runs_by_cpu_quota_and_the_third_when_one_ends(
    with_kueue: tuple[ControlPlane, str, OperatorProcess],
) -> None:
    plane, namespace, operator = with_kueue
    client = plane.api_client()
    with (
        EventLog(client, namespace, "pods") as pods,
        EventLog(client, namespace, "agentruns") as runs,
    ):
        operator.start()
        for name in ("first", "second"):
            plane.kubectl("create", "-f", "-", input=labelled_run(namespace, name))
            pods.wait_for(pod_added(name))
        plane.kubectl("create", "-f", "-", input=labelled_run(namespace, "third"))
        waiting = runs.wait_for(run_in("third", queued_by("WaitingForKueue")))
        message = waiting.object["status"]["message"]
        assert f"LocalQueue {QUEUE}" in message, message
        assert not [e for e in pods.events if run_label(e) == "third"]
        third = workload_of(plane, namespace, "third")
        assert third["spec"]["queueName"] == QUEUE
        assert third["metadata"]["ownerReferences"][0]["name"] == "third"
        (pod_set,) = third["spec"]["podSets"]
        agent = next(c for c in pod_set["template"]["spec"]["containers"] if c["name"] == "agent")
        assert agent["resources"]["requests"]["cpu"] == "1"

        # The first ends: its Workload is Finished, its quota frees, the third starts.
        exited_answered(plane, namespace, "first-1")
        runs.wait_for(run_in("first", lambda status: status.get("phase") == "Succeeded"))
        pods.wait_for(pod_added("third"))
        finished = {
            c["type"]: c["status"]
            for c in workload_of(plane, namespace, "first")["status"]["conditions"]
        }
        assert finished["Finished"] == "True", finished

        # Kueue evicts the second's Workload (deactivated): its pod stops, it queues again
        # without counting a restart, and resumes once its Workload is admitted again.
        second = workload_of(plane, namespace, "second")["metadata"]["name"]
        set_active(plane, namespace, second, False)
        pods.wait_for(
            lambda e: (
                e.object["metadata"]["name"] == "second-1"
                and (e.type == "DELETED" or bool(e.object["metadata"].get("deletionTimestamp")))
            )
        )
        evicted = runs.wait_for(run_in("second", queued_by("EvictedByKueue")))
        assert "deactivated" in evicted.object["status"]["message"].lower()
        set_active(plane, namespace, second, True)
        pods.wait_for(pod_added("second"), after=evicted.at)
        status = json.loads(
            plane.kubectl("get", "agentrun", "second", "-n", namespace, "-o", "json").stdout
        )["status"]
        assert status["attempt"] == 2 and status["pod"] == "second-2", status
        assert not status.get("restarts") and not status.get("disruptions"), status
        assert status["phase"] == "Pending" and status.get("admitted") is True

        # A suspended run holds no quota: a fourth, waiting, starts in its stead.
        plane.kubectl("create", "-f", "-", input=labelled_run(namespace, "fourth"))
        runs.wait_for(run_in("fourth", queued_by("WaitingForKueue")))
        suspend(plane, namespace, "third", True)
        pods.wait_for(pod_added("fourth"))
        # Unsuspended, it waits in line again; a deleted run's quota frees: it starts.
        resumed_at = time.monotonic()
        suspend(plane, namespace, "third", False)
        runs.wait_for(run_in("third", queued_by("WaitingForKueue")), after=resumed_at)
        plane.kubectl("delete", "agentrun", "second", "-n", namespace)
        pods.wait_for(pod_added("third"), after=resumed_at)

        # Never more than two runs with a live pod at once (the quota's two CPUs).
        live: set[str] = set()
        most = 0
        for event in list(pods.events):
            run = run_label(event)
            meta, phase = event.object["metadata"], event.object.get("status", {}).get("phase")
            if event.type == "DELETED" or meta.get("deletionTimestamp") or phase == "Succeeded":
                live.discard(run)
            else:
                live.add(run)
            most = max(most, len(live))
        assert most == 2, [(e.type, run_label(e)) for e in pods.events]
    reasons = json.loads(
        plane.kubectl(
            "get", "events", "-n", namespace,
            "--field-selector=involvedObject.name=third", "-o", "json",
        ).stdout
    )["items"]  # fmt: skip
    assert {"Queued", "Admitted"} <= {e["reason"] for e in reasons}
