"""The moves of :mod:`.decide`'s table for a run's pod that is gone or going.

:func:`terminating`: a pod deleted by someone else (a drain, an eviction, a delete),
replaced once its stop save landed when the store fences. :func:`lost` ("lost*" in the
table): the saved State first (a pod can save its outcome and be gone before its exit is
seen), else a restart toward maxRestarts with backoff, or for a pod the cluster stopped
a disruption (:func:`disrupted`), replaced at once.
"""

from __future__ import annotations

from datetime import timedelta

from alpineagents_operator.deciding.moves import fail, over_budget, succeed, wait_for_approval
from alpineagents_operator.deciding.step import Decision, Step
from alpineagents_operator.kube.views import JSON, Phase, PodView, RunEvent, format_time, parse_time

STUCK_TERMINATING_SLACK = timedelta(seconds=30)
"""How long past its deletion deadline a pod may stay before its node counts as lost."""
DISRUPTION_QUICK = timedelta(seconds=60)
"""Disruptions closer together than this are "quick": a node drain seldom comes around
that fast, something deleting each new pod does."""
QUICK_DISRUPTIONS_ALLOWED = 10
"""Quick disruptions in a row replaced at once (a rolling drain of a node pool may move a
run a few times in a minute); from the next one the waits double, 1, 2, 4 ... s."""
DISRUPTION_MAX_BACKOFF = 300.0
"""The longest a run waits between two quick disruptions."""
STOP_SAVE_WAIT = timedelta(seconds=5)
"""How long after a running pod's deletion the operator waits for its stop record (the
runner's save on SIGTERM) before it claims the State from it; at most its grace period."""
STOP_SAVE_POLL_SECONDS = 0.25
"""How often the saved State is read again while waiting for a stop record."""


def terminating(step: Step, pod: PodView) -> Decision:
    """The current pod is being deleted, not by the operator (drain, eviction, delete)."""
    # A graceful stop: the pod saves and exits, but its container may take its whole
    # grace period to go. A store that fences lets the replacement start now: the claim
    # before it is created refuses the old pod's saves from then on, so one pod writes
    # the run at a time.
    saved = step.saved
    if saved is None:
        return Decision(
            needs_saved=True, note=f"pod {pod.name} is terminating: reading the saved State"
        )
    if saved.fences and saved.exists and saved.error is None:
        # Its own stop save knows best what was running: let it land first.
        wait = _stop_save_wait(step, pod)
        if wait > 0:
            return step.result(
                requeue_after=min(wait, STOP_SAVE_POLL_SECONDS),
                note=f"pod {pod.name} is terminating: waiting for its stop save",
            )
        return lost(
            step,
            pod.name,
            "PodTerminating",
            f"pod {pod.name} is terminating; the claim fences its last save",
        )
    deadline = (pod.deletion_deadline or step.now) + STUCK_TERMINATING_SLACK
    if step.now >= deadline:
        return lost(
            step,
            pod.name,
            "PodStuckTerminating",
            f"pod {pod.name} did not finish terminating by {format_time(deadline)}; "
            "its node is presumed lost",
        )
    return step.result(
        requeue_after=(deadline - step.now).total_seconds(),
        note=f"pod {pod.name} is terminating",
    )


def _stop_save_wait(step: Step, pod: PodView) -> float:
    """Seconds still to wait for the stop record of ``pod``, deleted and still running,
    before the claim fences it off (0: claim now). Its runner saves on SIGTERM in tens of
    milliseconds; the bound covers one that cannot (hung, starved of CPU, its store
    unreachable). A pod whose container never ran has nothing to save, and a stop already
    saved since it began is all it will write."""
    saved = step.saved
    if not pod.running or saved is None:
        return 0.0
    since = step.status.last_saved_seq
    wrote = saved.last_saved_seq is not None and (since is None or saved.last_saved_seq > since)
    if saved.stopped is not None and wrote:
        return 0.0
    deleted_at = pod.deleted_at or step.now
    until = deleted_at + STOP_SAVE_WAIT
    if pod.deletion_deadline is not None:
        until = min(until, pod.deletion_deadline)
    return max(0.0, (until - step.now).total_seconds())


def lost(
    step: Step,
    pod_name: str,
    reason: str,
    message: str,
    facts: JSON | None = None,
    *,
    by_cluster: bool = True,
) -> Decision:
    """The current pod is gone: what the saved State holds decides whether anything was
    lost; if so a restart (or, ``by_cluster``, a disruption)."""
    # ``by_cluster``: the pod did not fail, the cluster stopped it (deleted, drained,
    # evicted, its node gone): replaced at once, as a ReplicaSet replaces its pods.
    # The backoff is for a pod that failed, which may fail again the same way.
    saved = step.saved
    if saved is None:
        return Decision(
            needs_saved=True, note=f"pod {pod_name} gone ({reason}): reading the saved State"
        )
    if saved.exists and saved.error is None:
        known = {**(facts or {}), **step.saved_facts()}
        gone = f"pod {pod_name} was gone ({reason})"
        if saved.answer is not None:
            return succeed(step, saved.answer, known, f"{gone} after saving its answer")
        if saved.stopped == "max_turns":
            return fail(
                step, "MaxTurns", f"{gone}; its saved State stopped at the turn limit", known
            )
        over = over_budget(step, saved)
        if over is not None:
            return fail(step, "BudgetExceeded", f"{gone}; {over}", known)
        if saved.stopped == "waiting_for_approval" and saved.pending_approvals:
            return wait_for_approval(step, saved.pending_approvals, known)
        facts = known
    if by_cluster:
        return disrupted(step, pod_name, reason, message, facts)
    policy = step.run.restart_policy
    restarts = step.status.restarts + 1
    event = RunEvent("Warning", "PodLost", f"{message} ({reason})")
    if restarts > policy.max_restarts:
        text = (
            f"{message}; the run lost its pod {restarts} times, more than "
            f"spec.restartPolicy.maxRestarts={policy.max_restarts}"
        )
        return fail(
            step, "RestartLimitExceeded", text, {**(facts or {}), "restarts": restarts}, (event,)
        )
    delay = policy.backoff(restarts)
    changes: JSON = {
        **(facts or {}),
        "phase": Phase.INTERRUPTED,
        "restarts": restarts,
        "nextAttemptAt": format_time(step.now + timedelta(seconds=delay)),
        "reason": reason,
        "message": f"{message}; restart {restarts} of {policy.max_restarts} in {delay:g}s",
    }
    return step.to(
        changes,
        events=(event,),
        requeue_after=delay,
        lost_reason=reason,
        note=f"pod {pod_name} lost ({reason}): restart {restarts} in {delay:g}s",
    )


def disrupted(step: Step, pod_name: str, reason: str, message: str, facts: JSON | None) -> Decision:
    """A pod the cluster stopped (deleted, drained, evicted, its node gone): not a failure
    of the run, so not a restart toward maxRestarts (as a Job's podFailurePolicy ignores
    DisruptionTarget). Replaced at once, unless more than
    :data:`QUICK_DISRUPTIONS_ALLOWED` came in a row, each within
    :data:`DISRUPTION_QUICK` of the last (something deleting each new pod): then each
    waits twice as long as the one before, up to :data:`DISRUPTION_MAX_BACKOFF`, and
    the status says why."""
    raw = step.status.raw
    count = int(raw.get("disruptions") or 0) + 1
    last = parse_time(raw.get("lastDisruptionAt"))
    quick = int(raw.get("quickDisruptions") or 0)
    quick = quick + 1 if last is not None and step.now - last < DISRUPTION_QUICK else 0
    over = quick - QUICK_DISRUPTIONS_ALLOWED
    delay = min(2.0**over, DISRUPTION_MAX_BACKOFF) if over >= 0 else 0.0
    events = [RunEvent("Warning", "PodLost", f"{message} ({reason})")]
    text = f"{message}; disruption {count}, not counted toward maxRestarts"
    if delay:
        slow = (
            f"{quick + 1} disruptions in a row, each within {DISRUPTION_QUICK.seconds} s "
            f"of the last (more than {QUICK_DISRUPTIONS_ALLOWED}): the next pod waits "
            f"{delay:g}s"
        )
        text = f"{text}; {slow}"
        events.append(RunEvent("Warning", "DisruptionBackoff", slow))
    changes: JSON = {
        **(facts or {}),
        "phase": Phase.INTERRUPTED,
        "disruptions": count,
        "lastDisruptionAt": format_time(step.now),
        "quickDisruptions": quick,
        "nextAttemptAt": format_time(step.now + timedelta(seconds=delay)),
        "reason": reason,
        "message": text,
    }
    return step.to(
        changes,
        events=tuple(events),
        requeue_after=delay,
        lost_reason=reason,
        note=f"pod {pod_name} stopped by the cluster ({reason}): disruption {count}, "
        f"next pod in {delay:g}s",
    )
