"""The operator's reconcile step, table-driven: (AgentRun, pods, saved State) → Decision.

Every row builds the Kubernetes objects as the API server returns them (JSON dicts),
parses them with the operator's own views, and checks the one move ``decide`` makes:
status written, pod created or deleted, Events, whether the saved State is needed, and
when to look again. Rows are named after the situation a user would recognise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from alpineagents_operator.deciding.decide import (
    Decision,
    claim_refusal,
    decide,
    pod_refusal,
    refused,
)
from alpineagents_operator.deciding.run_status import conditions_for
from alpineagents_operator.kube.admission import Verdict
from alpineagents_operator.kube.views import (
    AgentRunView,
    PendingApproval,
    Phase,
    PodView,
    RestartPolicy,
    SavedView,
    format_time,
)

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
UID = "6f1d2c3b-0000-4000-8000-000000000001"
OLD_UID = "0a0a0a0a-0000-4000-8000-000000000002"
NAME = "triage"


def run(
    phase: str | None = None,
    *,
    attempt: int = 0,
    pod: str | None = None,
    spec: Mapping[str, Any] | None = None,
    generation: int = 1,
    deleting: bool = False,
    **status: Any,
) -> AgentRunView:
    """An AgentRun whose status is settled (stateId, observedGeneration and conditions as
    the operator last wrote them), so a row sees only the change it is about."""
    body_status: dict[str, Any] = {
        "stateId": "agents.triage.6f1d2c3b",
        "observedGeneration": generation,
    }
    body_status.update(status)
    if phase is not None:
        body_status["phase"] = phase
        body_status.setdefault(
            "conditions",
            conditions_for(
                Phase(phase),
                body_status.get("reason"),
                body_status.get("message"),
                body_status["observedGeneration"],
                [],
                NOW - timedelta(minutes=1),
            ),
        )
    if attempt:
        body_status["attempt"] = attempt
        body_status["pod"] = pod if pod is not None else f"{NAME}-{attempt}"
    metadata: dict[str, Any] = {
        "name": NAME,
        "namespace": "agents",
        "uid": UID,
        "generation": generation,
    }
    if deleting:
        metadata["deletionTimestamp"] = format_time(NOW)
    return AgentRunView.from_body(
        {
            "apiVersion": "alpineagents.dev/v1",
            "kind": "AgentRun",
            "metadata": metadata,
            "spec": {"model": "claude-sonnet-5", "prompt": "hi", **(spec or {})},
            "status": body_status,
        }
    )


def report(outcome: str, **fields: Any) -> str:
    import json

    return json.dumps({"outcome": outcome, "stateId": "agents.triage.6f1d2c3b", **fields})


def pod(
    attempt: int,
    state: str = "running",
    *,
    exit_code: int = 0,
    reason: str = "",
    message: str = "",
    owner: str = UID,
    phase: str | None = None,
    pod_reason: str | None = None,
    disruption: str | None = None,
    deleting_at: datetime | None = None,
    waiting_reason: str = "ContainerCreating",
    image: str | None = None,
) -> PodView:
    if state == "running":
        container_state: dict[str, Any] = {"running": {"startedAt": format_time(NOW)}}
        default_phase = "Running"
    elif state == "waiting":
        container_state = {"waiting": {"reason": waiting_reason, "message": message}}
        default_phase = "Pending"
    else:
        container_state = {
            "terminated": {
                "exitCode": exit_code,
                "reason": reason or ("Completed" if exit_code == 0 else "Error"),
                "message": message,
            }
        }
        default_phase = "Succeeded" if exit_code == 0 else "Failed"
    status: dict[str, Any] = {
        "phase": phase or default_phase,
        "containerStatuses": [{"name": "agent", "state": container_state}],
        "conditions": [],
    }
    if pod_reason:
        status["reason"] = pod_reason
        status["message"] = f"The node was low on resource: memory. ({pod_reason})"
    if disruption:
        status["conditions"].append(
            {"type": "DisruptionTarget", "status": "True", "reason": disruption}
        )
    metadata: dict[str, Any] = {
        "name": f"{NAME}-{attempt}",
        "uid": f"pod-{attempt}-{owner[:4]}",
        "labels": {"alpineagents.dev/run": NAME, "alpineagents.dev/attempt": str(attempt)},
        "ownerReferences": [
            {"apiVersion": "alpineagents.dev/v1", "kind": "AgentRun", "name": NAME, "uid": owner}
        ],
    }
    if deleting_at is not None:
        # Deleted with the default grace period of 30 s, 30 s before ``deleting_at``.
        metadata["deletionTimestamp"] = format_time(deleting_at)
        metadata["deletionGracePeriodSeconds"] = 30
    spec = {"containers": [{"name": "agent", "image": image}]} if image else {}
    return PodView.from_pod({"metadata": metadata, "spec": spec, "status": status})


def exited(attempt: int, code: int, **kwargs: Any) -> PodView:
    return pod(attempt, "exited", exit_code=code, **kwargs)


SAVED = SavedView(
    exists=True,
    last_saved_seq=7,
    aborted_calls=("toolu_1",),
    turns=2,
    usage={"input_tokens": 30, "output_tokens": 12},
)
MID_RUN = SavedView(exists=True, last_saved_seq=5, turns=1)
"""A saved State in the middle of its run: no answer, no stop."""
FENCING_MID_RUN = replace(MID_RUN, fences=True)
"""The same, in a store that fences earlier writers (MinioStore)."""
STOPPED_MID_RUN = replace(FENCING_MID_RUN, stopped="interrupted")
"""The same, ending in a stop record (a runner's save on SIGTERM)."""
FREE = Verdict(True)
FULL = Verdict(False, "NamespaceCap", "queued: 3rd in line for namespace agents's 5 places", 3)
LATER = format_time(NOW + timedelta(seconds=10))
EARLIER = format_time(NOW - timedelta(seconds=1))
PENDING_CALL = {"callId": "toolu_9", "name": "shell", "input": {"command": "rm -rf build"}}


@dataclass
class Row:
    """One situation and the move expected for it (None: don't care)."""

    name: str
    run: AgentRunView
    pods: list[PodView] = field(default_factory=list)
    saved: SavedView | None = None
    phase: str | None = None
    """Expected status.phase in the patch ("" = the patch must not change the phase)."""
    create: int | None = None
    delete: tuple[str, ...] = ()
    events: tuple[str, ...] | None = None
    """Reasons of the Events posted, in order (None: don't care)."""
    needs_saved: bool = False
    claim: bool = False
    requeue: float | None = None
    status: Mapping[str, Any] = field(default_factory=dict)
    """Fields the patch must hold with these values."""
    acts: bool | None = None
    admission: Verdict | None = None
    """Whether a place under the admission caps is free for the run (None: no caps)."""


# The table reads best one situation per row, so the formatter leaves it alone.
# fmt: off
ROWS = [
    # ------------------------------------------------------------ a new run
    Row("new run: pod 1 created", run(stateId=None), phase="Pending", create=1,
        events=("PodCreated",),
        status={"attempt": 1, "pod": "triage-1", "stateId": "agents.triage.6f1d2c3b"}),
    Row("new run, suspended: no pod", run(spec={"suspend": True}), phase="Suspended",
        events=("Suspended",)),
    Row("new run, pod of an older AgentRun with the same name still there: it is deleted first",
        run(), [pod(1, owner=OLD_UID)], phase="", delete=("triage-1",)),
    Row("new run, old AgentRun's pod already terminating: wait for it",
        run(), [pod(1, owner=OLD_UID, deleting_at=NOW)], phase=""),
    Row("fresh status but pod 1 exists (created, status write lost): adopted, not duplicated",
        run(), [pod(1)], phase="Running", status={"attempt": 1, "pod": "triage-1"}),
    # ------------------------------------------------------------ admission caps
    Row("new run, a place free: pod 1 created, the run holds its place",
        run(), phase="Pending", create=1, admission=FREE,
        status={"admitted": True, "attempt": 1}),
    Row("new run, no place: Queued with its place in line, no pod",
        run(), phase="Queued", events=("Queued",), admission=FULL,
        status={"reason": "NamespaceCap", "queuePlace": 3, "message": FULL.message}),
    Row("queued run, still no place: nothing new to say, no Event",
        run("Queued", reason="NamespaceCap", message=FULL.message, queuePlace=3),
        acts=False, admission=FULL),
    Row("... nor when the line moved: its place as first judged stands (no patch per run)",
        run("Queued", reason="NamespaceCap", message="queued: 9th in line", queuePlace=9),
        acts=False, admission=FULL),
    Row("queued run, a place now: admitted (an Event), pod 1 created",
        run("Queued", reason="NamespaceCap", message=FULL.message, queuePlace=3),
        phase="Pending", create=1, events=("Admitted", "PodCreated"), admission=FREE,
        status={"admitted": True, "queuePlace": None, "reason": None}),
    Row("queued run, suspended: Suspended, out of line",
        run("Queued", spec={"suspend": True}), phase="Suspended", admission=FULL),
    Row("a run holding its place loses its pod: replaced, never queued",
        run("Interrupted", attempt=1, admitted=True, nextAttemptAt=EARLIER), [], MID_RUN,
        phase="Pending", create=2, claim=True, admission=FULL),
    Row("a run holding its place ends: the place is given up",
        run("Running", attempt=1, admitted=True),
        [exited(1, 0, message=report("answered", answer="42"))],
        phase="Succeeded", admission=FULL, status={"admitted": None}),
    Row("a run holding its place waits for approval: the place is given up",
        run("Running", attempt=1, admitted=True),
        [exited(1, 76, message=report("waiting_for_approval", pendingApprovals=[PENDING_CALL]))],
        phase="WaitingForApproval", admission=FULL, status={"admitted": None}),
    Row("approved, no place free: queued again behind the line",
        run("WaitingForApproval", attempt=1, pendingApprovals=[PENDING_CALL],
            spec={"approvals": [{"callId": "toolu_9", "allow": True}]}),
        [exited(1, 76)], MID_RUN, phase="Queued", admission=FULL),
    # ------------------------------------------------------------ starting and running
    Row("pod still being created: nothing to do", run("Pending", attempt=1),
        [pod(1, "waiting")], acts=False),
    Row("missing Secret: the reason is shown", run("Pending", attempt=1),
        [pod(1, "waiting", waiting_reason="CreateContainerConfigError",
             message='secret "anthropic" not found')],
        phase="", status={"reason": "CreateContainerConfigError",
                          "message": 'secret "anthropic" not found'}),
    Row("pod started: Running", run("Pending", attempt=1), [pod(1)], phase="Running",
        status={"startedAt": format_time(NOW)}),
    Row("running and nothing changed (duplicate event): nothing to do",
        run("Running", attempt=1, startedAt=EARLIER), [pod(1)], acts=False),
    Row("status says Pending, pod never created (create lost): created",
        run("Pending", attempt=1, pod=""), phase="", create=1),
    # ------------------------------------------------------------ how a pod ends
    Row("exit 0: Succeeded with the answer from the termination message",
        run("Running", attempt=1),
        [exited(1, 0, message=report("answered", answer="42", turns=3, lastSavedSeq=9,
                                     usage={"input_tokens": 5, "output_tokens": 2}))],
        phase="Succeeded", events=("Succeeded",),
        status={"answer": "42", "turns": 3, "lastSavedSeq": 9, "completedAt": format_time(NOW)}),
    Row("exit 0: status says which runner ended the run (its version and its pod's image)",
        run("Running", attempt=1),
        [exited(1, 0, image="alpineagents:0.2.0",
                message=report("answered", answer="42", runnerVersion="0.2.0"))],
        phase="Succeeded",
        status={"runnerVersion": "0.2.0", "runnerImage": "alpineagents:0.2.0"}),
    Row("exit 0 without a readable report: the answer is read from the store",
        run("Running", attempt=1), [exited(1, 0, message="")], needs_saved=True),
    Row("exit 0 without a report, store read: answer from the store",
        run("Running", attempt=1), [exited(1, 0, message="")],
        SavedView(exists=True, last_saved_seq=4, answer="from the store"),
        phase="Succeeded", status={"answer": "from the store", "lastSavedSeq": 4}),
    Row("exit 65: Failed, not retried, with the runner's reason",
        run("Running", attempt=1),
        [exited(1, 65, message=report("failed", error="spec.tools: unknown tool 'shel'"))],
        phase="Failed", events=("Failed",),
        status={"reason": "NotRetryable", "message": "spec.tools: unknown tool 'shel'"}),
    Row("exit 76: WaitingForApproval with the pending calls, no pod",
        run("Running", attempt=1),
        [exited(1, 76, message=report("waiting_for_approval", pendingApprovals=[PENDING_CALL]))],
        phase="WaitingForApproval", events=("WaitingForApproval",),
        status={"pendingApprovals": [PENDING_CALL], "reason": "ApprovalRequired"}),
    Row("exit 77: Failed at the turn limit", run("Running", attempt=1),
        [exited(1, 77, message=report("max_turns"))], phase="Failed",
        status={"reason": "MaxTurns"}),
    # ------------------------------------------------------------ losses
    # A pod the cluster stopped (deleted, drained, evicted, its node gone) did not fail:
    # a disruption, not a restart toward maxRestarts, replaced at once. The backoff is for
    # a pod that failed, and may fail again.
    Row("exit 143 (SIGTERM, saved): Interrupted, replaced at once, a disruption",
        run("Running", attempt=1), [exited(1, 143)], MID_RUN, phase="Interrupted",
        events=("PodLost",), requeue=0.0,
        status={"disruptions": 1, "reason": "Terminated", "nextAttemptAt": format_time(NOW),
                "lastDisruptionAt": format_time(NOW), "quickDisruptions": 0}),
    Row("exit 75 (retryable): Interrupted, restart after the 1 s backoff",
        run("Running", attempt=1),
        [exited(1, 75, message=report("retryable", error="store unavailable"))], MID_RUN,
        phase="Interrupted", requeue=1.0,
        status={"reason": "RetryableError", "restarts": 1,
                "nextAttemptAt": format_time(NOW + timedelta(seconds=1))}),
    Row("OOM-killed: Interrupted, after the backoff", run("Running", attempt=1),
        [exited(1, 137, reason="OOMKilled")], MID_RUN, phase="Interrupted", requeue=1.0,
        status={"reason": "OOMKilled"}),
    Row("SIGKILL (exit 137): Interrupted, after the backoff", run("Running", attempt=1),
        [exited(1, 137)], MID_RUN, phase="Interrupted", requeue=1.0,
        status={"reason": "Killed"}),
    Row("evicted for node pressure: Interrupted, replaced at once", run("Running", attempt=1),
        [exited(1, 137, pod_reason="Evicted", disruption="TerminationByKubelet")], MID_RUN,
        phase="Interrupted", requeue=0.0, status={"reason": "Evicted"}),
    Row("node lost (PodGC marked it Failed, container never reported): replaced at once",
        run("Running", attempt=1), [pod(1, "running", phase="Failed", disruption="DeletionByPodGC")], MID_RUN,
        phase="Interrupted", requeue=0.0, status={"reason": "NodeLost"}),
    Row("pod deleted (gone from the API): Interrupted, replaced at once",
        run("Running", attempt=1), [], MID_RUN, phase="Interrupted", events=("PodLost",),
        requeue=0.0, status={"reason": "PodDeleted", "nextAttemptAt": format_time(NOW)}),
    Row("crashed with exit 1: Interrupted (a retry may fix it), after the backoff",
        run("Running", attempt=1),
        [exited(1, 1, message="Traceback ...\nRuntimeError: boom")], MID_RUN, phase="Interrupted",
        requeue=1.0, status={"reason": "Error"}),
    Row("third failure: backoff doubles each time",
        run("Running", attempt=3, restarts=2),
        [exited(3, 1)], MID_RUN, phase="Interrupted", requeue=4.0, status={"restarts": 3}),
    Row("a drain after failures: at once, and the failures stay as they were",
        run("Running", attempt=3, restarts=2),
        [exited(3, 143)], MID_RUN, phase="Interrupted", requeue=0.0, status={"disruptions": 1}),
    Row("a drain at the restart limit: not a failure, the run goes on",
        run("Running", attempt=9, restarts=5, disruptions=6,
            lastDisruptionAt=format_time(NOW - timedelta(days=7))),
        [exited(9, 143)], MID_RUN, phase="Interrupted", requeue=0.0,
        status={"disruptions": 7, "quickDisruptions": 0}),
    Row("a disruption within a minute of the last: still replaced at once",
        run("Running", attempt=2, disruptions=1, lastDisruptionAt=format_time(NOW - timedelta(seconds=5))),
        [], MID_RUN, phase="Interrupted", events=("PodLost",), requeue=0.0,
        status={"disruptions": 2, "quickDisruptions": 1}),
    Row("ten drains in a row, each within a minute: the tenth replaced at once",
        run("Running", attempt=10, disruptions=9, quickDisruptions=8,
            lastDisruptionAt=format_time(NOW - timedelta(seconds=20))),
        [], MID_RUN, phase="Interrupted", events=("PodLost",), requeue=0.0,
        status={"disruptions": 10, "quickDisruptions": 9}),
    Row("the eleventh quick one: the next pod waits a second (DisruptionBackoff)",
        run("Running", attempt=11, disruptions=10, quickDisruptions=9,
            lastDisruptionAt=format_time(NOW - timedelta(seconds=5))),
        [], MID_RUN, phase="Interrupted", events=("PodLost", "DisruptionBackoff"), requeue=1.0,
        status={"disruptions": 11, "quickDisruptions": 10}),
    Row("each pod deleted as it starts: the waits double (a hot loop slowed down)",
        run("Running", attempt=17, disruptions=16, quickDisruptions=15,
            lastDisruptionAt=format_time(NOW - timedelta(seconds=40))),
        [], MID_RUN, phase="Interrupted", events=("PodLost", "DisruptionBackoff"), requeue=64.0,
        status={"disruptions": 17, "quickDisruptions": 16,
                "nextAttemptAt": format_time(NOW + timedelta(seconds=64))}),
    Row("... up to five minutes between two",
        run("Running", attempt=30, disruptions=29, quickDisruptions=28,
            lastDisruptionAt=format_time(NOW - timedelta(seconds=1))),
        [], MID_RUN, phase="Interrupted", requeue=300.0, status={"quickDisruptions": 29}),
    Row("backoff is capped by maxBackoffSeconds",
        run("Running", attempt=3, restarts=4,
            spec={"restartPolicy": {"maxRestarts": 9, "maxBackoffSeconds": 5}}),
        [exited(3, 1)], MID_RUN, phase="Interrupted", requeue=5.0),
    Row("zero backoff: a failed pod's replacement is due at once",
        run("Running", attempt=1, spec={"restartPolicy": {"initialBackoffSeconds": 0}}),
        [exited(1, 1)], MID_RUN, phase="Interrupted", requeue=0.0,
        status={"nextAttemptAt": format_time(NOW)}),
    Row("restart budget used up: Failed", run("Running", attempt=6, restarts=5),
        [exited(6, 1)], MID_RUN, phase="Failed", events=("PodLost", "Failed"),
        status={"reason": "RestartLimitExceeded", "restarts": 6}),
    Row("pod being deleted by someone else: the saved State is read first",
        run("Running", attempt=1), [pod(1, deleting_at=NOW + timedelta(seconds=30))],
        needs_saved=True),
    Row("pod being deleted, a store that cannot fence: wait for it to save and stop",
        run("Running", attempt=1), [pod(1, deleting_at=NOW + timedelta(seconds=30))], MID_RUN,
        acts=False, requeue=60.0),
    Row("pod being deleted, a store that fences: its stop save is waited for, briefly",
        run("Running", attempt=1), [pod(1, deleting_at=NOW + timedelta(seconds=30))],
        FENCING_MID_RUN, acts=False, requeue=0.25),
    Row("pod being deleted, its stop record saved: lost now, the claim fences anything later",
        run("Running", attempt=1, spec={"restartPolicy": {"initialBackoffSeconds": 0}}),
        [pod(1, deleting_at=NOW + timedelta(seconds=30))], STOPPED_MID_RUN,
        phase="Interrupted", events=("PodLost",), requeue=0.0,
        status={"reason": "PodTerminating", "disruptions": 1}),
    Row("pod being deleted, no stop record 5 s after: lost, the claim fences its late save",
        run("Running", attempt=1), [pod(1, deleting_at=NOW + timedelta(seconds=25))],
        FENCING_MID_RUN, phase="Interrupted", status={"reason": "PodTerminating"}),
    Row("... nor past its grace period (deleted with 1 s of grace, 1 s ago)",
        run("Running", attempt=1),
        [replace(pod(1, deleting_at=NOW), deleted_at=NOW - timedelta(seconds=1))],
        FENCING_MID_RUN, phase="Interrupted", status={"reason": "PodTerminating"}),
    Row("a stop record an earlier pod saved is not this pod's: wait for its own",
        run("Running", attempt=2, lastSavedSeq=5),
        [pod(2, deleting_at=NOW + timedelta(seconds=30))], STOPPED_MID_RUN,
        acts=False, requeue=0.25),
    Row("... the stop record this pod saved after it (a later seq)",
        run("Running", attempt=2, lastSavedSeq=4),
        [pod(2, deleting_at=NOW + timedelta(seconds=30))], STOPPED_MID_RUN,
        phase="Interrupted", status={"reason": "PodTerminating"}),
    Row("pod deleted before its container ran: nothing to save, lost now",
        run("Pending", attempt=1), [pod(1, "waiting", deleting_at=NOW + timedelta(seconds=30))],
        FENCING_MID_RUN, phase="Interrupted", status={"reason": "PodTerminating"}),
    Row("then, the old pod still terminating: its replacement is created, the State claimed",
        run("Interrupted", attempt=1, restarts=1, nextAttemptAt=EARLIER),
        [pod(1, deleting_at=NOW + timedelta(seconds=30))], FENCING_MID_RUN,
        phase="Pending", create=2, claim=True, status={"attempt": 2, "pod": "triage-2"}),
    Row("pod being deleted before it saved anything: nothing to fence, wait for it",
        run("Running", attempt=1), [pod(1, deleting_at=NOW + timedelta(seconds=30))],
        SavedView(exists=False, fences=True), acts=False, requeue=60.0),
    Row("pod being deleted, the store unreadable: wait for it",
        run("Running", attempt=1), [pod(1, deleting_at=NOW + timedelta(seconds=30))],
        SavedView(exists=False, error="ConnectionRefusedError", fences=True),
        acts=False, requeue=60.0),
    Row("pod stuck terminating past its deadline (dead node): lost",
        run("Running", attempt=1), [pod(1, deleting_at=NOW - timedelta(seconds=31))], MID_RUN,
        phase="Interrupted", status={"reason": "PodStuckTerminating"}),
    # ------------------------------------------------------------ a loss is judged on the store
    Row("pod gone before its exit was seen: the saved State is read before judging a loss",
        run("Running", attempt=1), [], needs_saved=True),
    Row("pod gone after saving its answer: Succeeded, no restart counted",
        run("Running", attempt=1, spec={"restartPolicy": {"maxRestarts": 0}}), [],
        SavedView(exists=True, last_saved_seq=9, answer="42", turns=2), phase="Succeeded",
        events=("Succeeded",), status={"answer": "42", "lastSavedSeq": 9, "turns": 2}),
    Row("pod killed after saving its answer (exit 137): Succeeded",
        run("Running", attempt=1), [exited(1, 137)],
        SavedView(exists=True, last_saved_seq=9, answer="42"), phase="Succeeded"),
    Row("pod gone after saving a stop at the turn limit: Failed (MaxTurns), not a loss",
        run("Running", attempt=1), [], SavedView(exists=True, last_saved_seq=9, stopped="max_turns"),
        phase="Failed", events=("Failed",), status={"reason": "MaxTurns"}),
    Row("pod gone after saving a stop for approvals: WaitingForApproval, not a loss",
        run("Running", attempt=1), [],
        SavedView(exists=True, last_saved_seq=5, stopped="waiting_for_approval",
                  pending_approvals=(PendingApproval("toolu_9", "shell"),)),
        phase="WaitingForApproval", events=("WaitingForApproval",)),
    Row("pod gone and the store unreadable: a loss",
        run("Running", attempt=1), [], SavedView(exists=False, error="ConnectionRefusedError"),
        phase="Interrupted", status={"reason": "PodDeleted", "disruptions": 1}),
    Row("pod gone before anything was saved: a loss",
        run("Running", attempt=1), [], SavedView(exists=False),
        phase="Interrupted", status={"reason": "PodDeleted", "disruptions": 1}),
    # ------------------------------------------------------------ status agrees with the history
    Row("answered by pod 2: the saved State is read for what every pod did",
        run("Running", attempt=2, restarts=1),
        [exited(2, 0, message=report("answered", answer="42"))], needs_saved=True),
    Row("answered by pod 2, saved State read: aborted calls of earlier pods come from it",
        run("Running", attempt=2, restarts=1),
        [exited(2, 0, message=report("answered", answer="42", turns=3))], SAVED,
        phase="Succeeded", status={"answer": "42", "abortedCalls": ["toolu_1"], "turns": 2,
                                   "lastSavedSeq": 7}),
    Row("answered by pod 2, store unreadable: Succeeded from the report, read again later",
        run("Running", attempt=2, restarts=1),
        [exited(2, 0, message=report("answered", answer="42", aborted=["toolu_3"]))],
        SavedView(exists=False, error="ConnectionRefusedError"), phase="Succeeded",
        requeue=10.0, status={"answer": "42", "abortedCalls": ["toolu_3"],
                              "savedStateUnread": True}),
    Row("answered by pod 1: its report is the whole story, no store read",
        run("Running", attempt=1),
        [exited(1, 0, message=report("answered", answer="42", aborted=["toolu_3"]))],
        phase="Succeeded", status={"abortedCalls": ["toolu_3"]}),
    Row("finished while the store was unreadable: the saved State is read",
        run("Succeeded", attempt=2, savedStateUnread=True), [exited(2, 0)], needs_saved=True),
    Row("finished while the store was unreadable, now read: status follows the history",
        run("Succeeded", attempt=2, savedStateUnread=True, abortedCalls=["toolu_3"]),
        [exited(2, 0)], SAVED, phase="",
        status={"abortedCalls": ["toolu_3", "toolu_1"], "savedStateUnread": None, "turns": 2}),
    Row("finished while the store was unreadable, still unreadable: look again later",
        run("Succeeded", attempt=2, savedStateUnread=True), [exited(2, 0)],
        SavedView(exists=False, error="ConnectionRefusedError"), acts=False, requeue=10.0),
    # ------------------------------------------------------------ resuming
    Row("interrupted, backoff not over: wait", run("Interrupted", attempt=1, nextAttemptAt=LATER),
        [exited(1, 143)], acts=False, requeue=10.0),
    Row("interrupted, due: the saved State is read first",
        run("Interrupted", attempt=1, nextAttemptAt=EARLIER), [exited(1, 143)], needs_saved=True),
    Row("interrupted, due: pod 2 resumes, store fenced, seq and aborted calls recorded",
        run("Interrupted", attempt=1, nextAttemptAt=EARLIER, restarts=1), [exited(1, 143)], SAVED,
        phase="Pending", create=2, claim=True, events=("Resumed",),
        status={"attempt": 2, "pod": "triage-2", "lastSavedSeq": 7, "abortedCalls": ["toolu_1"],
                "nextAttemptAt": None, "turns": 2}),
    Row("aborted calls add up over several losses",
        run("Interrupted", attempt=2, nextAttemptAt=EARLIER, abortedCalls=["toolu_0"]),
        [exited(2, 143)], SAVED, create=3, claim=True, status={"abortedCalls": ["toolu_0", "toolu_1"]}),
    Row("interrupted, the saved State already has its answer: Succeeded without a pod",
        run("Interrupted", attempt=1, nextAttemptAt=EARLIER), [exited(1, 143)],
        SavedView(exists=True, last_saved_seq=11, answer="done already"),
        phase="Succeeded", create=None, status={"answer": "done already"}),
    Row("interrupted, saved State stopped at the turn limit: Failed",
        run("Interrupted", attempt=1, nextAttemptAt=EARLIER), [],
        SavedView(exists=True, last_saved_seq=3, stopped="max_turns"),
        phase="Failed", status={"reason": "MaxTurns"}),
    # ------------------------------------------------------------ budgets
    Row("exit 78: Failed at the budget, with the runner's reason and the cost",
        run("Running", attempt=1),
        [exited(1, 78, message=report("budget_exceeded", costUSD=1.25,
                                      error="an estimated $1.2500 reached the budget"))],
        phase="Failed", events=("Failed",),
        status={"reason": "BudgetExceeded", "costUSD": "1.2500",
                "message": "an estimated $1.2500 reached the budget"}),
    Row("failed at the budget, spec.budget raised past what it spent: resumed",
        run("Failed", attempt=1, reason="BudgetExceeded", costUSD="1.2500",
            usage={"inputTokens": 10, "outputTokens": 5},
            spec={"budget": {"maxCostUSD": 5}}),
        [exited(1, 78)],
        SavedView(exists=True, last_saved_seq=7, stopped="budget_exceeded", cost_usd=1.25),
        phase="Pending", create=2, claim=True),
    Row("failed at the budget, budget unchanged: nothing to do",
        run("Failed", attempt=1, reason="BudgetExceeded", costUSD="1.2500",
            spec={"budget": {"maxCostUSD": 1}}),
        [exited(1, 78)], acts=False),
    Row("interrupted, saved State stopped at a budget it is still at: Failed",
        run("Interrupted", attempt=1, nextAttemptAt=EARLIER, spec={"budget": {"maxOutputTokens": 5}}),
        [], SavedView(exists=True, last_saved_seq=3, stopped="budget_exceeded",
                      usage={"output_tokens": 9}),
        phase="Failed", status={"reason": "BudgetExceeded"}),
    Row("interrupted, saved State waits for approval: WaitingForApproval, no pod",
        run("Interrupted", attempt=1, nextAttemptAt=EARLIER), [],
        SavedView(exists=True, last_saved_seq=3, stopped="waiting_for_approval",
                  pending_approvals=(PendingApproval("toolu_9", "shell", {"command": "ls"}),)),
        phase="WaitingForApproval", create=None),
    Row("interrupted before anything was saved: pod 2 starts afresh, nothing to fence",
        run("Interrupted", attempt=1, nextAttemptAt=EARLIER), [], SavedView(exists=False),
        phase="Pending", create=2, claim=False, events=("PodCreated",)),
    Row("interrupted, store unreachable: pod 2 starts anyway and loads it itself",
        run("Interrupted", attempt=1, nextAttemptAt=EARLIER), [],
        SavedView(exists=False, error="ConnectionRefusedError"), create=2, claim=False),
    Row("interrupted, a replacement was created but not recorded: adopted, not duplicated",
        run("Interrupted", attempt=1, nextAttemptAt=EARLIER), [exited(1, 143), pod(2)],
        phase="Running", create=None, status={"attempt": 2, "pod": "triage-2"}),
    Row("interrupted, next pod name taken by an older AgentRun's pod: wait",
        run("Interrupted", attempt=1, nextAttemptAt=EARLIER), [pod(2, owner=OLD_UID)], SAVED,
        create=None, delete=("triage-2",)),
    Row("an older attempt still running next to the current one is stopped",
        run("Running", attempt=2), [pod(1), pod(2)], delete=("triage-1",)),
    # ------------------------------------------------------------ suspend
    Row("suspend while running: pod deleted gracefully, Suspended",
        run("Running", attempt=1, spec={"suspend": True}), [pod(1)], phase="Suspended",
        delete=("triage-1",), events=("Suspended",)),
    Row("suspended, pod still saving and stopping: wait",
        run("Suspended", attempt=1, spec={"suspend": True}),
        [pod(1, deleting_at=NOW + timedelta(seconds=30))], acts=False),
    Row("suspended, pod stopped: nothing more", run("Suspended", attempt=1, spec={"suspend": True}),
        [exited(1, 143)], acts=None, create=None, phase=""),
    Row("suspend lifted: the saved State is read", run("Suspended", attempt=1), [exited(1, 143)],
        needs_saved=True),
    Row("suspend lifted: pod 2 resumes, no restart counted",
        run("Suspended", attempt=1, restarts=0), [exited(1, 143)], SAVED, phase="Pending",
        create=2, claim=True, events=("Resumed",)),
    Row("suspended before it ever started, then lifted: pod 1",
        run("Suspended"), [], SavedView(exists=False), create=1, phase="Pending"),
    Row("the pod answered while being suspended: Succeeded",
        run("Suspended", attempt=1, spec={"suspend": True}),
        [exited(1, 0, message=report("answered", answer="made it"))], phase="Succeeded"),
    Row("suspend during backoff: Suspended", run("Interrupted", attempt=1, nextAttemptAt=LATER,
                                                 spec={"suspend": True}),
        [exited(1, 143)], phase="Suspended"),
    # ------------------------------------------------------------ approvals
    Row("waiting for approval, no answer yet: nothing to do",
        run("WaitingForApproval", attempt=1, pendingApprovals=[PENDING_CALL]), [exited(1, 76)],
        acts=None, create=None, phase=""),
    Row("waiting for approval, answers for other calls only: still waiting",
        run("WaitingForApproval", attempt=1, pendingApprovals=[PENDING_CALL],
            spec={"approvals": [{"callId": "toolu_1", "allow": True}]}),
        [exited(1, 76)], create=None, phase=""),
    Row("every pending call answered in spec.approvals: the saved State is read",
        run("WaitingForApproval", attempt=1, pendingApprovals=[PENDING_CALL],
            spec={"approvals": [{"callId": "toolu_9", "allow": False, "note": "no"}]}),
        [exited(1, 76)], needs_saved=True),
    Row("every pending call answered: pod 2 resumes and the pending list is cleared",
        run("WaitingForApproval", attempt=1, pendingApprovals=[PENDING_CALL],
            spec={"approvals": [{"callId": "toolu_9", "allow": True}]}),
        [exited(1, 76)],
        SavedView(exists=True, last_saved_seq=5, stopped="waiting_for_approval",
                  pending_approvals=(PendingApproval("toolu_9", "shell"),)),
        phase="Pending", create=2, claim=True, status={"pendingApprovals": None, "attempt": 2}),
    Row("suspend while waiting for approval: Suspended",
        run("WaitingForApproval", attempt=1, pendingApprovals=[PENDING_CALL],
            spec={"suspend": True}), [exited(1, 76)], phase="Suspended"),
    Row("suspended while waiting, then lifted without answers: back to WaitingForApproval",
        run("Suspended", attempt=1), [exited(1, 76)],
        SavedView(exists=True, last_saved_seq=5, stopped="waiting_for_approval",
                  pending_approvals=(PendingApproval("toolu_9", "shell"),)),
        phase="WaitingForApproval", create=None),
    # ------------------------------------------------------------ finished and deleted
    Row("succeeded: nothing to do", run("Succeeded", attempt=1), [exited(1, 0)], phase="",
        create=None),
    Row("failed, but a stray pod runs: it is stopped", run("Failed", attempt=1), [pod(2)],
        delete=("triage-2",), phase="", create=None),
    Row("AgentRun being deleted: its pod is stopped gracefully, nothing else",
        run("Running", attempt=1, deleting=True), [pod(1)], delete=("triage-1",), phase="",
        create=None),
    Row("spec edited: the new generation is recorded",
        run("Running", attempt=1, generation=4, observedGeneration=3), [pod(1)],
        status={"observedGeneration": 4}),
]
# fmt: on


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_decide(row: Row) -> None:
    decision = decide(row.run, row.pods, row.saved, NOW, row.admission)
    check(row, decision)


def check(row: Row, decision: Decision) -> None:
    assert decision.needs_saved == row.needs_saved, decision
    if row.needs_saved:
        assert decision.create_pod is None and not decision.status
        return
    if row.phase == "":
        assert "phase" not in decision.status or decision.status["phase"] == row.run.status.phase
    elif row.phase is not None:
        assert decision.status.get("phase") == row.phase, decision
    assert decision.create_pod == row.create, decision
    assert decision.delete_pods == row.delete, decision
    if row.events is not None:
        assert tuple(e.reason for e in decision.events) == row.events, decision
    assert decision.claim_state == row.claim, decision
    if row.requeue is not None:
        assert decision.requeue_after == pytest.approx(row.requeue), decision
    for key, value in row.status.items():
        assert key in decision.status, f"{key} not in {decision.status}"
        assert decision.status[key] == value, (key, decision.status[key])
    if row.acts is not None:
        assert decision.acts == row.acts, decision


def test_a_step_applied_twice_changes_nothing_the_second_time() -> None:
    """Level-based: after a step's status patch is applied, the same world gives no move."""
    world_pods = [pod(1)]
    first = decide(run("Pending", attempt=1), world_pods, None, NOW)
    assert first.status["phase"] == "Running"
    applied = run(attempt=1, **first.status)
    second = decide(applied, world_pods, None, NOW + timedelta(seconds=5))
    assert not second.acts, second


def test_a_lost_pod_is_replaced_in_two_steps_with_zero_backoff() -> None:
    spec = {"restartPolicy": {"initialBackoffSeconds": 0}}
    world = [exited(1, 143)]
    running = run("Running", attempt=1, spec=spec)
    assert decide(running, world, None, NOW).needs_saved  # a loss is judged on the store
    lost = decide(running, world, MID_RUN, NOW)
    assert lost.status["phase"] == "Interrupted" and lost.requeue_after == 0.0
    assert lost.lost_reason == "Terminated"
    interrupted = run(attempt=1, spec=spec, **lost.status)
    asks = decide(interrupted, world, None, NOW)
    assert asks.needs_saved
    resumed = decide(interrupted, world, SAVED, NOW)
    assert resumed.create_pod == 2 and resumed.claim_state


def test_a_long_answer_is_cut_in_status() -> None:
    answer = "x" * 5000
    decision = decide(
        run("Running", attempt=1),
        [exited(1, 0, message=report("answered", answer=answer))],
        None,
        NOW,
    )
    assert len(decision.status["answer"]) == 1000


def test_conditions_keep_their_transition_time_while_unchanged() -> None:
    first = conditions_for(Phase.RUNNING, None, None, 1, [], NOW)
    later = NOW + timedelta(minutes=5)
    again = conditions_for(Phase.RUNNING, None, None, 1, first, later)
    assert again == first
    done = conditions_for(Phase.SUCCEEDED, "Answered", None, 1, again, later)
    by_type = {c["type"]: c for c in done}
    assert by_type["Succeeded"]["status"] == "True"
    assert by_type["Succeeded"]["lastTransitionTime"] == format_time(later)
    assert by_type["Running"]["status"] == "False"
    assert by_type["Running"]["lastTransitionTime"] == format_time(later)
    assert by_type["WaitingForApproval"]["lastTransitionTime"] == format_time(NOW)


def test_failed_condition_carries_the_reason() -> None:
    conditions = conditions_for(Phase.FAILED, "MaxTurns", "stopped at the limit", 2, [], NOW)
    succeeded = next(c for c in conditions if c["type"] == "Succeeded")
    assert succeeded["status"] == "False" and succeeded["reason"] == "MaxTurns"
    assert succeeded["message"] == "stopped at the limit"
    assert succeeded["observedGeneration"] == 2


@pytest.mark.parametrize(
    ("restart", "expected"), [(0, 0.0), (1, 1.0), (2, 2.0), (3, 4.0), (7, 60.0), (20, 60.0)]
)
def test_backoff_is_exponential_and_capped(restart: int, expected: float) -> None:
    assert RestartPolicy().backoff(restart) == expected


def test_state_ids_differ_between_agentruns_of_the_same_name() -> None:
    first = run()
    second = AgentRunView.from_body(
        {"metadata": {"name": NAME, "namespace": "agents", "uid": OLD_UID}, "spec": {}}
    )
    assert first.state_id != second.state_id
    assert first.state_id == "agents.triage.6f1d2c3b"


def test_an_invalid_pod_fails_the_run_with_the_servers_words() -> None:

    message = 'Pod "triage-1" is invalid: spec.containers[0].resources.limits[memory]: Invalid value: "lots"'
    decision = refused(run(), 1, pod_refusal(run(), 1, 422, message), NOW)
    assert decision.status["phase"] == "Failed"
    assert decision.status["reason"] == "PodInvalid"
    assert 'Invalid value: "lots"' in decision.status["message"]
    assert [e.reason for e in decision.events] == ["Failed"]


def test_a_forbidden_pod_keeps_the_phase_and_is_tried_again() -> None:

    interrupted = run("Interrupted", attempt=1, nextAttemptAt=EARLIER, restarts=1)
    decision = refused(
        interrupted, 2, pod_refusal(interrupted, 2, 403, "exceeded quota: pods=10"), NOW
    )
    assert "phase" not in decision.status
    assert decision.status["reason"] == "PodRefused"
    assert decision.requeue_after == 10.0 and decision.create_pod is None


def test_a_name_too_long_for_a_label_fails_the_run_without_a_pod() -> None:
    long_name = "n" * 64
    body = {
        "metadata": {"name": long_name, "namespace": "agents", "uid": UID, "generation": 1},
        "spec": {"model": "claude-sonnet-5", "prompt": "hi"},
    }
    decision = decide(AgentRunView.from_body(body), [], None, NOW)
    assert decision.create_pod is None
    assert decision.status["phase"] == "Failed"
    assert decision.status["reason"] == "InvalidName"
    assert "64 characters, more than the 63" in decision.status["message"]
    fits = dict(body, metadata={**body["metadata"], "name": "n" * 63})
    assert decide(AgentRunView.from_body(fits), [], None, NOW).create_pod == 1


def test_a_run_answered_before_its_pod_vanished_counts_no_restart() -> None:
    """maxRestarts 0: a loss would fail the run, but the answer is saved."""
    answered = SavedView(exists=True, last_saved_seq=9, answer="42")
    decision = decide(
        run("Running", attempt=1, spec={"restartPolicy": {"maxRestarts": 0}}), [], answered, NOW
    )
    assert decision.status["phase"] == "Succeeded" and decision.status["reason"] == "Answered"
    assert "restarts" not in decision.status and decision.lost_reason is None
    assert [e.reason for e in decision.events] == ["Succeeded"]


def test_an_unclaimable_state_holds_the_replacement_back_with_a_warning() -> None:

    interrupted = run("Interrupted", attempt=1, nextAttemptAt=EARLIER, restarts=1)
    decision = refused(
        interrupted, 2, claim_refusal(interrupted, 2, "StoreUnavailableError: timed out", 1), NOW
    )
    assert decision.create_pod is None and not decision.claim_state
    assert "phase" not in decision.status  # still Interrupted: no pod was lost
    assert "restarts" not in decision.status and "attempt" not in decision.status
    assert decision.status["reason"] == "FencingFailed"
    message = decision.status["message"]
    assert "could not claim State agents.triage.6f1d2c3b before starting pod triage-2" in message
    assert "StoreUnavailableError: timed out" in message
    assert [(e.type, e.reason) for e in decision.events] == [("Warning", "FencingFailed")]
    assert decision.requeue_after == 1.0
    conditions = {c["type"]: c for c in decision.status["conditions"]}
    assert "could not claim State" in conditions["Succeeded"]["message"]


def test_claim_retries_back_off_and_warn_once() -> None:
    interrupted = run("Interrupted", attempt=1)
    first = refused(interrupted, 2, claim_refusal(interrupted, 2, "boom", 1), NOW)
    held = run("Interrupted", attempt=1, **first.status)
    delays = [
        refused(held, 2, claim_refusal(held, 2, "boom", n), NOW).requeue_after
        for n in (2, 3, 6, 7, 20)
    ]
    assert delays == [2.0, 4.0, 30.0, 30.0, 30.0]
    assert not refused(held, 2, claim_refusal(held, 2, "boom", 2), NOW).events
