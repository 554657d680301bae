"""The Workload an AgentRun gets from Kueue's side, and what its status means for the run
(plain functions; the test with the real Kueue controller is test_kueue_admission.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from alpineagents_operator.deciding.decide import decide
from alpineagents_operator.kube.config import OperatorConfig
from alpineagents_operator.kube.kueue_workloads import (
    EVICTED_REASON,
    WAITING_REASON,
    finished_patch,
    quota_returned_patch,
    read_workload,
    verdict_for,
    workload_manifest,
    workload_name,
)
from alpineagents_operator.kube.pods import owner_reference, pod_manifest
from alpineagents_operator.kube.views import AgentRunView, PodView

NOW = datetime(2026, 12, 7, 6, 0, tzinfo=UTC)


def run(status: dict[str, Any] | None = None, **spec: Any) -> AgentRunView:
    return AgentRunView.from_body(
        {
            "metadata": {
                "name": "report",
                "namespace": "team-a",
                "uid": "0f1e2d3c-aaaa-bbbb-cccc-123456789abc",
                "labels": {"kueue.x-k8s.io/queue-name": "team-a-queue"},
                "creationTimestamp": "2026-12-07T05:00:00Z",
            },
            "spec": {"model": "claude-sonnet-5", "prompt": "hi", **spec},
            "status": status or {},
        }
    )


def workload(*conditions: tuple[str, str, str], admission: bool = False) -> dict[str, Any]:
    return {
        "metadata": {"name": "agentrun-report-0f1e2d3c", "resourceVersion": "41"},
        "spec": {"queueName": "team-a-queue"},
        "status": {
            **({"admission": {"clusterQueue": "cq"}} if admission else {}),
            "conditions": [
                {"type": kind, "status": status, "reason": reason, "message": f"{kind} says"}
                for kind, status, reason in conditions
            ],
        },
    }


ADMITTED = workload(
    ("QuotaReserved", "True", "QuotaReserved"), ("Admitted", "True", "Admitted"), admission=True
)
WAITING = workload(("QuotaReserved", "False", "Pending"))
EVICTED = workload(
    ("QuotaReserved", "True", "QuotaReserved"),
    ("Admitted", "True", "Admitted"),
    ("Evicted", "True", "Deactivated"),
    admission=True,
)


def test_the_workload_asks_for_what_the_run_pod_asks_for_in_the_runs_local_queue() -> None:
    agentrun = run(resources={"requests": {"cpu": "1500m"}})
    config = OperatorConfig()
    pod_spec = pod_manifest(agentrun, 1, config)["spec"]
    manifest = workload_manifest(agentrun, pod_spec, owner_reference(agentrun))
    assert manifest["metadata"]["name"] == "agentrun-report-0f1e2d3c" == workload_name(agentrun)
    assert manifest["metadata"]["labels"] == {"alpineagents.dev/run": "report"}
    owner = manifest["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("AgentRun", "report", agentrun.uid)
    assert manifest["spec"]["queueName"] == "team-a-queue"
    (pod_set,) = manifest["spec"]["podSets"]
    assert pod_set["count"] == 1
    containers = pod_set["template"]["spec"]["containers"]
    agent = next(c for c in containers if c["name"] == "agent")
    assert agent["resources"] == next(
        c["resources"] for c in pod_spec["containers"] if c["name"] == "agent"
    )
    assert agent["resources"]["requests"]["cpu"] == "1500m"
    # Only what Kueue counts or schedules by: no command, env or volumes.
    assert set(agent) == {"name", "resources"}
    assert "volumes" not in pod_set["template"]["spec"]


def test_a_run_without_the_label_has_no_workload() -> None:
    unlabelled = AgentRunView.from_body({"metadata": {"name": "x", "namespace": "n"}})
    assert unlabelled.queue_name is None
    with pytest.raises(ValueError, match=r"kueue\.x-k8s\.io/queue-name"):
        workload_manifest(unlabelled, {}, {})


def test_a_waiting_run_is_queued_naming_its_local_queue_and_starts_once_admitted() -> None:
    waiting = verdict_for(run(), read_workload(WAITING))
    assert not waiting.admitted and waiting.reason == WAITING_REASON
    assert "LocalQueue team-a-queue" in waiting.message
    assert "QuotaReserved says" in waiting.message  # Kueue's own words, why it waits
    assert verdict_for(run(), read_workload(None)).reason == WAITING_REASON
    assert verdict_for(run(), read_workload(ADMITTED)).admitted

    decision = decide(run(), [], None, NOW, waiting)
    assert decision.status["phase"] == "Queued" and decision.create_pod is None
    assert decision.status.get("queuePlace") is None
    started = decide(run(), [], None, NOW, verdict_for(run(), read_workload(ADMITTED)))
    assert started.create_pod == 1 and started.status["admitted"] is True


def running_pod() -> PodView:
    return PodView.from_pod(
        {
            "metadata": {
                "name": "report-1",
                "labels": {"alpineagents.dev/run": "report", "alpineagents.dev/attempt": "1"},
                "ownerReferences": [{"uid": "0f1e2d3c-aaaa-bbbb-cccc-123456789abc"}],
            },
            "status": {
                "phase": "Running",
                "containerStatuses": [
                    {"name": "agent", "state": {"running": {"startedAt": "2026-12-07T05:01:00Z"}}}
                ],
            },
        }
    )


def test_an_eviction_stops_the_pod_gracefully_and_queues_the_run_without_a_loss() -> None:
    admitted = run({"phase": "Running", "attempt": 1, "pod": "report-1", "admitted": True})
    verdict = verdict_for(admitted, read_workload(EVICTED))
    assert verdict.withdrawn and verdict.reason == EVICTED_REASON
    assert "Deactivated" in verdict.message

    decision = decide(admitted, [running_pod()], None, NOW, verdict)
    assert decision.delete_pods == ("report-1",)
    assert decision.status["phase"] == "Queued"
    assert decision.status["admitted"] is None
    assert "restarts" not in decision.status and "disruptions" not in decision.status
    assert decision.lost_reason is None
    assert [e.reason for e in decision.events] == ["Queued"]
    # Still admitted by Kueue: the run keeps its pod.
    kept = decide(
        admitted, [running_pod()], None, NOW, verdict_for(admitted, read_workload(ADMITTED))
    )
    assert not kept.delete_pods and kept.status.get("phase") != "Queued"


def test_finished_keeps_kueues_conditions_and_is_made_from_the_read_it_changes() -> None:
    patch = finished_patch(ADMITTED, NOW, "Succeeded", "the answer")
    assert patch["metadata"] == {"resourceVersion": "41"}
    conditions = {c["type"]: c for c in patch["status"]["conditions"]}
    assert set(conditions) == {"QuotaReserved", "Admitted", "Finished"}
    assert conditions["Finished"]["status"] == "True"
    assert conditions["Finished"]["reason"] == "Succeeded"
    assert read_workload({**ADMITTED, "status": patch["status"]}).finished
    failed = finished_patch(ADMITTED, NOW, "Failed", "")
    assert {c["type"]: c for c in failed["status"]["conditions"]}["Finished"]["reason"] == "Failed"


def test_after_an_eviction_the_quota_is_handed_back_as_kueues_jobframework_does() -> None:
    patch = quota_returned_patch(EVICTED, NOW)
    assert patch["status"]["admission"] is None
    conditions = {c["type"]: c for c in patch["status"]["conditions"]}
    assert conditions["QuotaReserved"]["status"] == "False"
    assert conditions["Admitted"]["status"] == "False"
    # Deactivated: queued again only when reactivated (Kueue's workload controller
    # turns Requeued True then); preempted: at once.
    assert (conditions["Requeued"]["status"], conditions["Requeued"]["reason"]) == (
        "False",
        "Deactivated",
    )
    assert conditions["Evicted"]["status"] == "True"
    preempted = workload(("Evicted", "True", "Preempted"), admission=True)
    requeued = {c["type"]: c for c in quota_returned_patch(preempted, NOW)["status"]["conditions"]}
    assert requeued["Requeued"]["status"] == "True"
    state = read_workload({**EVICTED, "status": patch["status"]})
    assert not state.reserved and not state.admitted and state.evicted
