"""Kueue's ``Workload`` for an AgentRun, and what its status says, as plain functions.

An AgentRun labelled ``kueue.x-k8s.io/queue-name: <LocalQueue>`` is admitted by Kueue
(:mod:`.kueue_admission` does the calls): the operator makes one Workload per run (its
one pod set holds the run pod's scheduling fields and resources, so the ClusterQueue's
quota counts what the pod asks for), waits for Kueue to admit it, and plays the part
Kueue's job integrations play for Jobs: it marks the Workload ``Finished`` when the run
ends, and after an eviction it stops the pod and hands the quota back (clears
``status.admission``), as Kueue's jobframework does.

The status patches here are merge patches carrying ``metadata.resourceVersion``: the
conditions are one list that Kueue writes too, so a patch made from an older read is
refused (409) rather than dropping a condition Kueue set meanwhile.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from alpineagents_operator.kube.admission import Verdict
from alpineagents_operator.kube.views import JSON, RUN_LABEL, AgentRunView, format_time

__all__ = [
    "EVICTED_REASON",
    "GROUP",
    "PLURAL",
    "QUEUE_LABEL",
    "VERSION",
    "WAITING_REASON",
    "WorkloadState",
    "finished_patch",
    "quota_returned_patch",
    "read_workload",
    "verdict_for",
    "workload_manifest",
    "workload_name",
]

GROUP = "kueue.x-k8s.io"
VERSION = "v1beta2"
"""The version Kueue 0.17 stores Workloads in (v1beta1 is served too, by conversion)."""
PLURAL = "workloads"
QUEUE_LABEL = f"{GROUP}/queue-name"
WAITING_REASON = "WaitingForKueue"
"""The run's ``reason`` while its Workload waits for Kueue's admission."""
EVICTED_REASON = "EvictedByKueue"
"""The run's ``reason`` once Kueue evicted (preempted, deactivated) its Workload."""

_POD_SET = "agent"
# What Kueue reads of a pod set's template to pick a flavor and count quota; the rest of
# the run pod's spec (volumes, env, the command) means nothing to it.
_SCHEDULING_FIELDS = (
    "nodeSelector",
    "tolerations",
    "affinity",
    "priorityClassName",
    "runtimeClassName",
    "overhead",
    "topologySpreadConstraints",
)


def workload_name(run: AgentRunView) -> str:
    """The Workload's name: the run's name and the start of its uid, so a run deleted
    and made again under the same name never finds the old one's admission."""
    return f"agentrun-{run.name}-{run.uid[:8]}" if run.uid else f"agentrun-{run.name}"


def workload_manifest(run: AgentRunView, pod_spec: Mapping[str, Any], owner: JSON) -> JSON:
    """The Workload for ``run`` in its LocalQueue: one pod set of one pod, its template
    the scheduling fields and container resources of ``pod_spec`` (the run pod's)."""
    if not run.queue_name:
        raise ValueError(f"AgentRun {run.namespace}/{run.name} has no label {QUEUE_LABEL}")

    def trimmed(containers: Any) -> list[JSON]:
        return [
            {"name": str(c.get("name")), "resources": dict(c.get("resources") or {})}
            for c in containers or ()
            if isinstance(c, Mapping)
        ]

    template: JSON = {"restartPolicy": "Never", "containers": trimmed(pod_spec.get("containers"))}
    if pod_spec.get("initContainers"):
        template["initContainers"] = trimmed(pod_spec.get("initContainers"))
    template.update({k: pod_spec[k] for k in _SCHEDULING_FIELDS if pod_spec.get(k)})
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Workload",
        "metadata": {
            "name": workload_name(run),
            "namespace": run.namespace,
            "labels": {RUN_LABEL: run.name},
            "ownerReferences": [owner],
        },
        "spec": {
            "queueName": run.queue_name,
            "podSets": [{"name": _POD_SET, "count": 1, "template": {"spec": template}}],
        },
    }


@dataclass(frozen=True)
class WorkloadState:
    """What a Workload's status says, for the run it belongs to."""

    exists: bool = False
    admitted: bool = False
    """``Admitted`` True: quota reserved and every admission check passed."""
    reserved: bool = False
    """Quota is held (``status.admission``, or ``QuotaReserved`` True)."""
    evicted: bool = False
    """``Evicted`` True: Kueue took the admission back (preempted, deactivated, ...)."""
    finished: bool = False
    active: bool = True
    """``spec.active``: false once someone deactivated it."""
    reason: str = ""
    """Kueue's word for why it waits or was evicted (the condition's reason)."""
    message: str = ""
    """Kueue's sentence for the same."""


def _conditions(body: Mapping[str, Any]) -> list[JSON]:
    raw = (body.get("status") or {}).get("conditions") or []
    return [dict(c) for c in raw if isinstance(c, Mapping)]


def _true(conditions: Sequence[Mapping[str, Any]], kind: str) -> Mapping[str, Any] | None:
    found = next((c for c in conditions if c.get("type") == kind), None)
    return found if found is not None and found.get("status") == "True" else None


def read_workload(body: Mapping[str, Any] | None) -> WorkloadState:
    """The state of a Workload as the API server returned it (None: there is none)."""
    if body is None:
        return WorkloadState()
    conditions = _conditions(body)
    evicted = _true(conditions, "Evicted")
    waiting = next((c for c in conditions if c.get("type") == "QuotaReserved"), None)
    why = evicted or waiting or {}
    return WorkloadState(
        exists=True,
        admitted=_true(conditions, "Admitted") is not None,
        reserved=bool((body.get("status") or {}).get("admission"))
        or _true(conditions, "QuotaReserved") is not None,
        evicted=evicted is not None,
        finished=_true(conditions, "Finished") is not None,
        active=(body.get("spec") or {}).get("active") is not False,
        reason=str(why.get("reason") or ""),
        message=str(why.get("message") or ""),
    )


def verdict_for(run: AgentRunView, state: WorkloadState) -> Verdict:
    """Whether ``run`` may have its pod, by its Workload's state.

    A run holding no place (``status.admitted``) starts once Kueue admits its Workload.
    A run holding one keeps it while the Workload stays admitted; once Kueue evicts it
    (or it is gone), the place is ``withdrawn``: its pod stops and it queues again.
    """
    name, queue = workload_name(run), run.queue_name
    if state.admitted and not state.evicted:
        return Verdict(True)
    if run.status.admitted:
        why = f" ({state.reason}: {state.message})" if state.message else ""
        return Verdict(
            False,
            EVICTED_REASON,
            f"queued: Kueue evicted workload {name}{why}; the pod stops (it saves first) "
            f"and the run waits in LocalQueue {queue}",
            withdrawn=True,
        )
    kueue_says = f": {state.message}" if state.message and not state.evicted else ""
    return Verdict(
        False,
        WAITING_REASON,
        f"queued: workload {name} waits for Kueue in LocalQueue {queue}{kueue_says}",
    )


def _set_condition(
    conditions: list[JSON], kind: str, status: bool, reason: str, message: str, now: datetime
) -> None:
    # As Kubernetes' meta.SetStatusCondition: the transition time moves only when the
    # status does.
    text = "True" if status else "False"
    for condition in conditions:
        if condition.get("type") == kind:
            if condition.get("status") != text:
                condition["lastTransitionTime"] = format_time(now)
            condition.update({"status": text, "reason": reason, "message": message})
            return
    conditions.append(
        {
            "type": kind,
            "status": text,
            "reason": reason,
            "message": message,
            "lastTransitionTime": format_time(now),
        }
    )


def _status_patch(body: Mapping[str, Any], status: JSON) -> JSON:
    version = (body.get("metadata") or {}).get("resourceVersion")
    return {"metadata": {"resourceVersion": version}, "status": status}


def finished_patch(body: Mapping[str, Any], now: datetime, phase: str, message: str) -> JSON:
    """Mark the Workload ``Finished`` (its quota frees), as Kueue's jobframework does
    when a Job ends: reason ``Succeeded`` or ``Failed`` by the run's ``phase``."""
    conditions = _conditions(body)
    reason = "Succeeded" if phase == "Succeeded" else "Failed"
    _set_condition(conditions, "Finished", True, reason, message or f"AgentRun {phase}", now)
    return _status_patch(body, {"conditions": conditions})


def quota_returned_patch(body: Mapping[str, Any], now: datetime) -> JSON:
    """After an eviction, once the run's pod is gone: hand the quota back (no
    ``status.admission``, ``QuotaReserved`` and ``Admitted`` False) and say whether it
    queues again at once (``Requeued``: after a preemption, not while deactivated), as
    Kueue's jobframework does for a stopped Job."""
    conditions = _conditions(body)
    evicted = _true(conditions, "Evicted") or {}
    reason = str(evicted.get("reason") or "Evicted")
    message = str(evicted.get("message") or "The workload was evicted")
    requeued = reason in ("Preempted", "NodeFailures")
    _set_condition(conditions, "Requeued", requeued, reason, message, now)
    _set_condition(conditions, "QuotaReserved", False, "Pending", message, now)
    _set_condition(
        conditions, "Admitted", False, "NoReservation", "The workload has no reservation", now
    )
    return _status_patch(body, {"admission": None, "conditions": conditions})
