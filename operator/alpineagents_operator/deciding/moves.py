"""The moves of :mod:`.decide`'s table that start a pod or settle a run's phase.

Each takes the :class:`~.step.Step` the table matched and returns its Decision: start a
pod (:func:`start`), resume from the saved State (:func:`resume`), wait in line under the
admission caps (:func:`not_admitted`), suspend, succeed, fail, wait for approval, and bring
a finished run's status in line with its saved State (:func:`catch_up`). The moves for a
lost pod are in :mod:`.pod_losses`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from alpineagents_operator.deciding.run_status import answer_text
from alpineagents_operator.deciding.step import Decision, Step
from alpineagents_operator.kube.views import (
    JSON,
    PendingApproval,
    Phase,
    PodView,
    RunEvent,
    SavedView,
    format_time,
    pod_name_for,
)

STORE_RETRY_SECONDS = 10.0
"""How soon a finished run whose saved State could not be read tries again."""


def covered(pending: Sequence[PendingApproval], approved: frozenset[str]) -> bool:
    """Whether every pending call has an answer in ``spec.approvals``."""
    return all(call.call_id in approved for call in pending)


def start(step: Step, attempt: int, why: str) -> Decision:
    """Create pod ``attempt`` → Pending (once a place is held, under admission caps)."""
    name = pod_name_for(step.run.name, attempt)
    if step.foreign_named(name):
        return step.result(note=f"waiting for pod {name} of an earlier AgentRun to go")
    waiting = not_admitted(step)
    if waiting is not None:
        return waiting
    return step.to(
        {
            "phase": Phase.PENDING,
            "attempt": attempt,
            "pod": name,
            "reason": None,
            "message": None,
        },
        create=attempt,
        events=(RunEvent("Normal", "PodCreated", f"created pod {name} (attempt {attempt})"),),
        note=f"{why}: creating pod {name}",
    )


def resume(step: Step, delete: tuple[str, ...] = ()) -> Decision:
    """The saved State's outcome if it has one (answer, max turns, budget, approvals not
    all answered), else claim it and create pod ``attempt+1`` (see :mod:`.decide`)."""
    run, status, saved = step.run, step.status, step.saved
    if saved is None:
        return Decision(
            needs_saved=True,
            delete_pods=step.stale + delete,
            note="resume: reading the saved State",
        )
    attempt = status.attempt + 1
    message = None
    if saved.error is not None:
        message = f"could not read the saved State ({saved.error}); the pod will load it"
    elif saved.exists:
        if saved.answer is not None:
            return succeed(
                step, saved.answer, step.saved_facts(), "the saved State already has its answer"
            )
        if saved.stopped == "max_turns":
            return fail(
                step, "MaxTurns", "the saved State stopped at the turn limit", step.saved_facts()
            )
        over = over_budget(step, saved)
        if over is not None:
            return fail(step, "BudgetExceeded", over, step.saved_facts())
        if (
            saved.stopped == "waiting_for_approval"
            and saved.pending_approvals
            and not covered(saved.pending_approvals, run.approved_call_ids)
        ):
            return wait_for_approval(step, saved.pending_approvals, step.saved_facts())
    name = pod_name_for(run.name, attempt)
    if step.foreign_named(name):
        return step.result(
            delete=delete, note=f"waiting for pod {name} of an earlier AgentRun to go"
        )
    waiting = not_admitted(step, delete)
    if waiting is not None:
        return waiting
    changes: JSON = {
        "phase": Phase.PENDING,
        "attempt": attempt,
        "pod": name,
        "nextAttemptAt": None,
        "pendingApprovals": None,
        "reason": None,
        "message": message,
    }
    if saved.exists and saved.error is None:
        changes.update(step.saved_facts())
        seq = saved.last_saved_seq
        new = [c for c in saved.aborted_calls if c not in status.aborted_calls]
        closed = f"; calls closed as aborted: {', '.join(new)}" if new else ""
        event = RunEvent(
            "Normal",
            "Resumed",
            f"pod {name} (attempt {attempt}) resumes from saved entry {seq}{closed}",
        )
    else:
        event = RunEvent("Normal", "PodCreated", f"created pod {name} (attempt {attempt})")
    return step.to(
        changes,
        create=attempt,
        delete=delete,
        claim=saved.exists and saved.error is None,
        events=(event,),
        note=f"resuming: creating pod {name}",
    )


def not_admitted(step: Step, delete: tuple[str, ...] = ()) -> Decision | None:
    """Queued, when the run holds no place and may not take one now; else None (the pod
    starts, the run holding its place from then on: ``status.admitted``)."""
    verdict, status = step.admission, step.status
    if verdict is None or (status.admitted and not verdict.withdrawn):
        return None
    if verdict.admitted:
        step.changes.update({"admitted": True, "queuePlace": None})
        if status.phase == Phase.QUEUED:
            step.events.append(RunEvent("Normal", "Admitted", "admitted: its pod starts"))
        return None
    if verdict.withdrawn:
        step.changes["admitted"] = None
    if status.phase == Phase.QUEUED and status.raw.get("reason") == verdict.reason:
        # Its place as first judged stands: rewriting every queued run's place each
        # time the line moves would be a patch per run (10,000 at a time).
        return step.result(delete=delete)
    events: tuple[RunEvent, ...] = ()
    if status.phase != Phase.QUEUED:
        events = (RunEvent("Normal", "Queued", verdict.message),)
    return step.to(
        {
            "phase": Phase.QUEUED,
            "reason": verdict.reason,
            "message": verdict.message,
            "queuePlace": verdict.place or None,
            "nextAttemptAt": None,
        },
        delete=delete,
        events=events,
        note=verdict.message,
    )


def withdraw(step: Step) -> Decision:
    """Queued again, its place taken back (Kueue evicted its Workload): its live pod is
    deleted gracefully (SIGTERM: it saves), and nothing counts as a restart or a loss."""
    decision = not_admitted(step, delete=step.live_own())
    assert decision is not None  # a withdrawn verdict never admits
    return decision


def suspend_now(step: Step, current: PodView | None, delete: tuple[str, ...] = ()) -> Decision:
    """Suspended: the current pod (if alive) deleted gracefully, so it saves first."""
    stopping = current is not None and current.alive
    if current is not None and current.alive and not current.deleting:
        delete = (*delete, current.name)
    message = (
        f"spec.suspend is true: pod {current.name} is stopping (it saves on SIGTERM)"
        if stopping and current is not None
        else "spec.suspend is true: no pod runs"
    )
    events = step.event_if_new(step.status.phase, "Normal", "Suspended", message, Phase.SUSPENDED)
    return step.to(
        {
            "phase": Phase.SUSPENDED,
            "reason": "Suspended",
            "message": message,
            "nextAttemptAt": None,
        },
        delete=delete,
        events=events,
        note="suspending",
    )


def succeed(step: Step, answer: str | None, facts: JSON, why: str) -> Decision:
    """Succeeded with ``answer``."""
    return step.to(
        {
            **facts,
            "phase": Phase.SUCCEEDED,
            "answer": answer_text(answer),
            "completedAt": format_time(step.now),
            "nextAttemptAt": None,
            "pendingApprovals": None,
            "reason": "Answered",
            "message": None,
        },
        events=(RunEvent("Normal", "Succeeded", why),),
        note=f"succeeded: {why}",
    )


def fail(
    step: Step, reason: str, message: str, facts: JSON, events: tuple[RunEvent, ...] = ()
) -> Decision:
    """Failed for ``reason`` (a Warning Event says why)."""
    return step.to(
        {
            **facts,
            "phase": Phase.FAILED,
            "completedAt": format_time(step.now),
            "nextAttemptAt": None,
            "reason": reason,
            "message": message,
        },
        events=(*events, RunEvent("Warning", "Failed", f"{reason}: {message}")),
        note=f"failed: {reason}",
    )


def wait_for_approval(step: Step, pending: Sequence[PendingApproval], facts: JSON) -> Decision:
    """WaitingForApproval, the ``pending`` calls in status.pendingApprovals."""
    names = ", ".join(f"{p.name or '?'} ({p.call_id})" for p in pending)
    message = (
        f"waiting for a person to answer {len(pending)} tool call(s) in spec.approvals: {names}"
    )
    events = step.event_if_new(
        step.status.phase, "Normal", "WaitingForApproval", message, Phase.WAITING_FOR_APPROVAL
    )
    return step.to(
        {
            **facts,
            "phase": Phase.WAITING_FOR_APPROVAL,
            "pendingApprovals": [p.to_json() for p in pending],
            "nextAttemptAt": None,
            "reason": "ApprovalRequired",
            "message": message,
        },
        events=events,
        note="waiting for approval",
    )


def catch_up(step: Step) -> Decision:
    """A finished run whose saved State could not be read when it ended: read it now,
    so status (abortedCalls above all) agrees with the history."""
    stray = step.live_own()
    saved = step.saved
    if saved is None:
        return Decision(needs_saved=True, note="finished: reading the saved State it missed")
    if saved.error is not None:
        return step.result(
            delete=stray,
            requeue_after=STORE_RETRY_SECONDS,
            note=f"finished, saved State still unreadable: {saved.error}",
        )
    changes: JSON = {**step.saved_facts(), "savedStateUnread": None}
    if (
        step.status.phase == Phase.SUCCEEDED
        and saved.answer is not None
        and not step.status.raw.get("answer")
    ):
        changes["answer"] = answer_text(saved.answer)
    return step.to(changes, delete=stray, note="status brought in line with the saved State")


def over_budget(step: Step, saved: SavedView) -> str | None:
    """Why a saved State stopped at its budget still is at it (None: it may go on)."""
    if saved.stopped != "budget_exceeded":
        return None
    budget = step.run.budget
    why = budget.exceeded(saved.usage, saved.cost_usd) if budget is not None else None
    if budget is not None and why is None:
        return None  # raised since: the next pod goes on
    return f"the saved State stopped at its budget (spec.budget): {why or 'no budget now'}"


def budget_raised(step: Step) -> bool:
    """A run failed at its budget whose spec.budget now allows what it has spent."""
    status = step.status
    if status.raw.get("reason") != "BudgetExceeded":
        return False
    budget = step.run.budget
    raw_usage = status.raw.get("usage")
    usage = raw_usage if isinstance(raw_usage, Mapping) else {}
    spent = {
        "input_tokens": int(usage.get("inputTokens", 0)),
        "output_tokens": int(usage.get("outputTokens", 0)),
        "cache_creation_input_tokens": int(usage.get("cacheCreationInputTokens", 0)),
        "cache_read_input_tokens": int(usage.get("cacheReadInputTokens", 0)),
    }
    cost = float(status.raw.get("costUSD") or 0.0)
    return budget is not None and budget.exceeded(spent, cost) is None
