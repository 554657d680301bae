"""The daily spend cap with Kueue admitting the runs: the real Kueue controller (built
from its Go module) and the operator as its own process on the bench's kube-apiserver,
without a node (the test is each pod's kubelet: it ends a pod with exit 0 and the
runner's report of an answer that cost $0.01, which the operator writes into
``status.costUSD``).

Two namespaces with their LocalQueues on one ClusterQueue whose quota is two runs'
CPU; the first capped at $0.05 a day by its annotation, the second without a cap. Four
of the capped namespace's runs end, then the fifth ends while the sixth holds the other
place: the namespace is at its cap, so the sixth is ``Queued`` (``DailySpendCap``), its
pod taken back and its Workload deleted, and Kueue's own figures show its namespace
holding no quota. The place it gave back goes to the second namespace: both of its
waiting runs are admitted and get their pods. A run applied at the cap asks Kueue for
nothing (no Workload). Raising the annotation makes the sixth a Workload again, which
Kueue admits once a place frees; its pod comes only after that admission (the watches'
events ordered by the one etcd's revisions), and it succeeds.

About 40 s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from alpineagents_operator.kube.daily_spend import SPEND_ANNOTATION, SPEND_REASON
from alpineagents_operator.kube.kueue_workloads import WAITING_REASON
from tests.bench.control_plane import ControlPlane
from tests.bench.kueue_controller import Kueue
from tests.bench.kueue_fair_share import (
    QUEUE,
    answered_pod_status,
    condition_true,
    created,
    judge,
    queued_run,
    resource_version,
    teams_on_one_queue,
)
from tests.bench.operator_process import Event, EventLog, OperatorProcess, pod_added, run_label
from tests.operator.test_spend_cap import phase_is

AT_ONCE = 2
"""Runs the ClusterQueue's quota holds at once."""
CAP = "0.05"
COST = 0.01
"""What each run's pod reports it cost, in USD."""


@pytest.fixture
def teams(
    control_plane: ControlPlane, kueue: Kueue, tmp_path: Path
) -> Iterator[tuple[list[str], OperatorProcess]]:
    """Two namespaces on one ClusterQueue of two runs, the first capped at ``CAP`` a day
    by its annotation (read as the chart's ``admission.namespaceAnnotations`` has it),
    and an operator (not started) watching both."""
    with teams_on_one_queue(control_plane, tmp_path, "spendq", AT_ONCE) as (namespaces, operator):
        control_plane.kubectl("annotate", "namespace", namespaces[0], f"{SPEND_ANNOTATION}={CAP}")
        operator.env["ALPINEAGENTS_NAMESPACE_CAPS"] = "true"
        # The resync re-reads a held namespace's annotation: a raised cap shows within it.
        operator.env["ALPINEAGENTS_RESYNC_SECONDS"] = "2"
        yield namespaces, operator


def workload_of(run: str, kind: str) -> Callable[[Event], bool]:
    """Matches a watch event of type ``kind`` of ``run``'s Workload."""
    return lambda event: event.type == kind and run_label(event) == run


def deleted_workload_of(run: str) -> Callable[[Event], bool]:
    """Matches the first sign of ``run``'s Workload being deleted (its deletion
    timestamp set, or it gone)."""
    return lambda event: (
        run_label(event) == run
        and (event.type == "DELETED" or bool(event.object["metadata"].get("deletionTimestamp")))
    )


def admitted(run: str) -> Callable[[Event], bool]:
    """Matches an event of ``run``'s Workload showing it admitted by Kueue."""
    return lambda event: (
        event.type != "DELETED" and run_label(event) == run and condition_true(event, "Admitted")
    )


def wait_for_queue(plane: ControlPlane, namespace: str, reserving: int, admitted: int) -> None:
    """Wait until Kueue's LocalQueue in ``namespace`` says it holds quota for
    ``reserving`` Workloads, ``admitted`` of them admitted (Kueue's own figures)."""
    for field, count in (("reservingWorkloads", reserving), ("admittedWorkloads", admitted)):
        plane.kubectl(
            "wait", "localqueues.kueue.x-k8s.io", QUEUE, "-n", namespace, "--timeout=120s",
            f"--for=jsonpath={{.status.{field}}}={count}",
        )  # fmt: skip


def test_a_run_held_at_the_spend_cap_gives_its_kueue_quota_to_another_team_and_takes_it_back(
    control_plane: ControlPlane, teams: tuple[list[str], OperatorProcess]
) -> None:
    plane = control_plane
    (capped, other), operator = teams
    client = plane.api_client()
    from kubernetes import client as kube_client

    core = kube_client.CoreV1Api(client)

    def end(namespace: str, pod: str) -> None:
        """The kubelet's part: the pod ends, its runner having reported $0.01."""
        core.patch_namespaced_pod_status(pod, namespace, answered_pod_status(COST))

    with ExitStack() as stack:
        pods = {n: stack.enter_context(EventLog(client, n, "pods")) for n in (capped, other)}
        workloads = {
            n: stack.enter_context(EventLog(client, n, "workloads")) for n in (capped, other)
        }
        runs = {n: stack.enter_context(EventLog(client, n, "agentruns")) for n in (capped, other)}
        operator.start()

        def run_together(*names: str) -> None:
            """``names`` (two: the quota) applied, admitted, their pods ended."""
            created(plane, *(queued_run(capped, name) for name in names))
            for name in names:
                pods[capped].wait_for(pod_added(name))
            for name in names:
                end(capped, f"{name}-1")
            for name in names:
                runs[capped].wait_for(phase_is(name, "Succeeded"))

        run_together("run-1", "run-2")
        run_together("run-3", "run-4")  # $0.04 spent today

        # The fifth and the sixth hold the quota; the other team's two runs wait for it.
        created(plane, queued_run(capped, "run-5"), queued_run(capped, "sixth"))
        pods[capped].wait_for(pod_added("run-5"))
        pods[capped].wait_for(pod_added("sixth"))
        created(plane, queued_run(other, "other-1"), queued_run(other, "other-2"))
        for name in ("other-1", "other-2"):
            runs[other].wait_for(phase_is(name, "Queued", WAITING_REASON))
        assert not [e for e in pods[other].events if e.type == "ADDED"]

        # The fifth ends: $0.05 spent, the cap. The sixth is held and gives its quota back.
        end(capped, "run-5-1")
        runs[capped].wait_for(phase_is("run-5", "Succeeded"))
        held = runs[capped].wait_for(phase_is("sixth", "Queued", SPEND_REASON))
        assert held.object["status"]["message"].startswith(
            f"daily spend cap: namespace {capped} spent $0.05 of its $0.05 on "
        ), held.object["status"]
        pods[capped].wait_for(lambda e: e.type == "DELETED" and e.name == "sixth-1")
        gone = workloads[capped].wait_for(deleted_workload_of("sixth"))
        # The place it gave back, and the fifth's, go to the other team: both admitted.
        second_admitted = max(
            resource_version(workloads[other].wait_for(admitted(name)))
            for name in ("other-1", "other-2")
        )
        assert second_admitted > resource_version(gone), "admitted before the sixth gave way"
        for name in ("other-1", "other-2"):
            pods[other].wait_for(pod_added(name))
        wait_for_queue(plane, capped, reserving=0, admitted=0)
        wait_for_queue(plane, other, reserving=AT_ONCE, admitted=AT_ONCE)

        # A run applied at the cap waits for the cap alone: it asks Kueue for nothing.
        created(plane, queued_run(capped, "seventh"))
        runs[capped].wait_for(phase_is("seventh", "Queued", SPEND_REASON))
        plane.kubectl("delete", "agentrun", "seventh", "-n", capped)

        # The cap raised while the other team holds the quota: the sixth queues in Kueue
        # again, and is admitted once one of the other team's runs ends.
        raised = plane.kubectl(
            "annotate", "namespace", capped, f"{SPEND_ANNOTATION}=1", "--overwrite",
            "-o", "jsonpath={.metadata.resourceVersion}",
        )  # fmt: skip
        raised_at = int(raised.stdout)
        again = workloads[capped].wait_for(
            lambda e: workload_of("sixth", "ADDED")(e) and resource_version(e) > raised_at
        )
        # (One watch delivers in etcd's order: a Workload the seventh had would be here.)
        assert not [e for e in workloads[capped].events if workload_of("seventh", "ADDED")(e)]
        waiting = phase_is("sixth", "Queued", WAITING_REASON)
        runs[capped].wait_for(lambda e: waiting(e) and resource_version(e) > raised_at)
        for name in ("other-1", "other-2"):
            end(other, f"{name}-1")
            runs[other].wait_for(phase_is(name, "Succeeded"))
        readmitted = workloads[capped].wait_for(admitted("sixth"), after=again.at)
        second = pods[capped].wait_for(lambda e: pod_added("sixth")(e) and e.name != "sixth-1")
        end(capped, second.name)
        done = runs[capped].wait_for(phase_is("sixth", "Succeeded")).object

        verdict = judge(pods, workloads)

    # No pod of the sixth while it was held: its next came after the raise, and after
    # Kueue admitted its new Workload.
    sixth_pods = [e for e in pods[capped].events if pod_added("sixth")(e)]
    assert [e.name for e in sixth_pods] == ["sixth-1", second.name], sixth_pods
    assert resource_version(second) > resource_version(readmitted) > raised_at
    assert verdict.pods_before_admission == [], verdict.pods_before_admission
    assert verdict.admitted == {capped: 6, other: 2}, verdict.admitted
    assert verdict.most_at_once <= AT_ONCE, verdict
    assert done["status"]["answer"] == "done"
