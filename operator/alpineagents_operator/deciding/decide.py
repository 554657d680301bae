"""One reconcile step of an AgentRun, as a pure function.

:func:`decide` looks at what is (the AgentRun with its status, the pods labelled with its
name, and optionally what the store says about its saved State) and returns one
:class:`Decision`: a status patch, at most one pod to create, pods to delete, Events,
and when to look again. It never talks to Kubernetes or a store, so the same inputs give
the same answer after an operator restart, a missed event or a duplicate event, and
every case is a row in a table-driven unit test.

The decision table is :data:`DECISION_TABLE`, walked from the top: the first row whose
phase and "what is seen" hold makes the move (``P`` = ``status.phase``; "(none)" = no
phase or no attempt yet; "current pod" = the pod named ``<run>-<status.attempt>`` owned
by this AgentRun's uid, or the warm pool's standby pod ``status.pod`` names when the run
was handed one, labelled with that attempt; "recorded" = ``status.pod`` names it). A test
checks that the rows below are the ones :data:`DECISION_TABLE` holds, in this order.

========================  ===========================  ===========================================
P                         what is seen                 move
========================  ===========================  ===========================================
any                       AgentRun being deleted       delete its live pods gracefully; nothing else
Failed (BudgetExceeded)   spec.budget raised past      resume
                          status.usage and costUSD
Succeeded/Failed          savedStateUnread             read the saved State; its facts → status
Succeeded/Failed          anything                     nothing (stray live pods are deleted)
any but terminal          name over 63 characters      Failed (InvalidName): no pod can carry it
any but terminal          own pod with an attempt      adopt it (a step created it and then failed
                          above status.attempt         to record it): attempt, pod, Pending; the
                                                       walk goes on down the table
(none)                    suspend                      Suspended, no pod
(none)                    -                            create pod 1 → Pending
Pending/Running           place withdrawn (Kueue       delete it gracefully (SIGTERM: it saves) →
                          evicted its Workload)        Queued, admitted: null; not a loss
Pending/Running           pod missing, recorded,       Suspended
                          suspend
Pending/Running           pod missing, recorded        lost* ("PodDeleted")
Pending/Running           pod missing                  create it
Pending/Running           pod alive, suspend           delete it gracefully (SIGTERM: it saves) →
                                                       Suspended
Pending/Running           pod deleting, not by us      read the saved State; a store that fences
                          (drain, eviction, delete)    and a State saved: lost* ("PodTerminating")
                                                       once the pod's stop record is saved (or
                                                       5 s after the delete, or its container
                                                       never ran), the claim fencing anything
                                                       later. Otherwise wait; lost
                                                       ("PodStuckTerminating") once past its
                                                       deadline + 30 s (dead node)
Pending/Running           container running            Running
Pending/Running           container waiting            Pending (+ reason/message of an error)
Pending/Running           pod finished                 by how it ended: the table below
Queued                    suspend                      Suspended
Queued                    still no place, for the      nothing (no saved State read: a namespace
                          reason status gives          at its spend cap holds its runs cheaply)
Queued                    no attempt yet               create pod 1, admitted: true (once a place
                                                       is free for it)
Queued                    -                            resume, admitted: true (likewise)
Interrupted               suspend                      Suspended
Interrupted               before nextAttemptAt         wait (requeue at nextAttemptAt)
Interrupted               due                          resume
WaitingForApproval        suspend                      Suspended
WaitingForApproval        spec.approvals answers       resume
                          every pending callId
WaitingForApproval        otherwise                    nothing
Suspended                 pod still alive              wait (delete it if not yet deleting and
                                                       spec.suspend still true)
Suspended                 pod exited 0/65/77/78        Succeeded / Failed (final outcomes win)
Suspended                 suspend                      nothing
Suspended                 suspend false                resume
========================  ===========================  ===========================================

A finished current pod, by how it ended (:func:`~.pod_outcomes.outcome_of`; the moves
are :data:`.pod_exits.BY_OUTCOME`):

========================  ===========================  ===========================================
outcome                   what is seen                 move
========================  ===========================  ===========================================
answered                  exit 0                       Succeeded, answer from the termination
                                                       message (or the store); after attempt 1
                                                       the saved State's facts (see below)
not_retryable             exit 65                      Failed (NotRetryable), no restart
waiting                   exit 76                      WaitingForApproval + pendingApprovals
max_turns                 exit 77                      Failed (MaxTurns)
budget_exceeded           exit 78                      Failed (BudgetExceeded)
lost                      other exit, OOMKilled,       suspend: Suspended. Otherwise lost*:
                          exit 75 / 137 / 1            restarts+1; over maxRestarts: Failed
                                                       (RestartLimitExceeded); else Interrupted
                                                       with nextAttemptAt = now + backoff
lost                      stopped by the cluster:      lost*, a disruption: disruptions+1, not a
                          deleted, drained (143),      restart; Interrupted, replaced at once;
                          Evicted, node lost           past ten in a row, each within 60 s of
                                                       the last, after 1, 2, 4 ... 300 s
                                                       (DisruptionBackoff)
========================  ===========================  ===========================================

Every move also deletes the live pods of an older AgentRun with the same name (other
uid), and an older attempt's pod still running.

"Lost*" (:mod:`.pod_losses`) reads the saved State first: a pod can save its answer and
be gone before its exit is seen, so a saved answer → Succeeded, a saved stop at max turns
→ Failed (MaxTurns), a saved stop for approvals → WaitingForApproval, none of them
counting a loss. Only a State without an outcome (or one that cannot be read) makes it a
loss.

Under admission caps (``admission``) "create pod" and "resume" first need a place: a run
that holds none and may not take one is ``Queued`` (no pod, reason NamespaceCap or
ClusterCap, queuePlace; see :mod:`.admission`). A run holds its place from its first pod
until it ends, waits for approval or is suspended (``admitted`` set to null then); a lost
pod's replacement keeps it.

A run that ends after more than one pod reads the saved State too: the history, not the
last pod's report, says which calls were aborted over all its pods (status.abortedCalls),
its turns and usage. When the store cannot be read then, the run ends anyway with the
report's facts and ``savedStateUnread``, and the saved State is read again later.

"Resume" (:func:`.moves.resume`) needs the saved State (``Decision.needs_saved`` asks the
caller to load it and decide again): saved answer → Succeeded without a pod; saved stop at
max turns → Failed; saved stop waiting for approvals that spec.approvals does not all
answer → WaitingForApproval; otherwise fence the store (``claim_state``) and create pod
``attempt+1`` → Pending, recording lastSavedSeq and the calls loading closed as aborted.
The caller decides that again from a read after the claim (a lost pod still running may
have saved in between, e.g. the result of a call the first read saw open), so status
says what the next pod loads. When the claim fails (:func:`claim_refusal`) the pod is not
created: the phase stays, reason ``FencingFailed`` says why, and the step is tried again
with backoff.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from alpineagents_operator.deciding.moves import (
    budget_raised,
    catch_up,
    covered,
    fail,
    resume,
    start,
    suspend_now,
    withdraw,
)
from alpineagents_operator.deciding.pod_exits import FINAL_OUTCOMES, finished
from alpineagents_operator.deciding.pod_losses import lost, terminating
from alpineagents_operator.deciding.pod_outcomes import outcome_of
from alpineagents_operator.deciding.pod_refusals import claim_refusal, pod_refusal, refused
from alpineagents_operator.deciding.step import Decision, Step
from alpineagents_operator.kube.admission import Verdict
from alpineagents_operator.kube.views import (
    JSON,
    TERMINAL_PHASES,
    AgentRunView,
    Phase,
    PodView,
    SavedView,
    current_pod_name,
    format_time,
)

__all__ = [
    "DECISION_TABLE",
    "PHASES",
    "Decision",
    "Row",
    "claim_refusal",
    "covered",
    "decide",
    "pod_refusal",
    "refused",
]

# Waiting reasons that mean "this will not start by itself soon": shown in status.
_WAITING_ERRORS = frozenset(
    {
        "CreateContainerConfigError",
        "CreateContainerError",
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "CrashLoopBackOff",
        "RunContainerError",
    }
)

_EVERY: frozenset[Phase | None] = frozenset({None, *Phase})
_ACTIVE: frozenset[Phase | None] = frozenset({None, Phase.PENDING, Phase.RUNNING})

PHASES: Mapping[str, frozenset[Phase | None]] = {
    "any": _EVERY,
    "Failed (BudgetExceeded)": frozenset({Phase.FAILED}),  # the reason: its row's test
    "Succeeded/Failed": frozenset(TERMINAL_PHASES),
    "any but terminal": _EVERY - TERMINAL_PHASES,
    "(none)": _ACTIVE,  # no attempt yet: its rows' test
    "Pending/Running": _ACTIVE,  # a run with an attempt and no phase is one lost its status
    "Queued": frozenset({Phase.QUEUED}),
    "Interrupted": frozenset({Phase.INTERRUPTED}),
    "WaitingForApproval": frozenset({Phase.WAITING_FOR_APPROVAL}),
    "Suspended": frozenset({Phase.SUSPENDED}),
}
"""The table's first column: the ``status.phase`` values each label stands for."""


@dataclass(frozen=True)
class Row:
    """One row of the decision table: for a run whose phase is one of ``phase``'s, when
    ``seen`` holds (``when``), the step is ``move``."""

    phase: str
    """The table's first column, a key of :data:`PHASES`."""
    seen: str
    """The table's second column, word for word."""
    when: Callable[[Step], bool]
    move: Callable[[Step], Decision | None]
    """None: the move only changed what the step sees (adoption); the walk goes on."""

    def holds(self, step: Step) -> bool:
        """Whether this row is the one for ``step``, as it is now."""
        return step.status.phase in PHASES[self.phase] and self.when(step)


def decide(
    run: AgentRunView,
    pods: Sequence[PodView],
    saved: SavedView | None,
    now: datetime,
    admission: Verdict | None = None,
) -> Decision:
    """The one move toward what ``run`` asks for, given what is (see the module's table).

    ``pods`` are the pods labelled with the run's name (any owner); ``saved`` is the
    store's view of the run's State, or None when it was not read (the Decision then may
    ask for it with ``needs_saved``). ``admission`` is whether a run that holds no place
    under the admission caps may take one (None: no caps in force; see
    :mod:`.admission`): a run that may not is ``Queued`` instead of starting its pod.
    """
    step = Step(run, pods, saved, now, admission)
    for row in DECISION_TABLE:
        if row.holds(step):
            decision = row.move(step)
            if decision is not None:
                return decision
    raise AssertionError(f"no row of the decision table for phase {step.status.phase}")


# ------------------------------------------------------------------ what is seen
def _always(step: Step) -> bool:
    return True


def _suspend(step: Step) -> bool:
    return step.run.suspend


def _no_attempt(step: Step) -> bool:
    return step.status.attempt == 0


def _pod(step: Step) -> PodView:
    """The current pod, for rows below the ones where it is missing."""
    pod = step.current()
    assert pod is not None
    return pod


def _pod_missing(step: Step) -> bool:
    return step.current() is None


def _pod_missing_recorded(step: Step) -> bool:
    return _pod_missing(step) and step.status.pod == current_pod_name(step.run.name, step.status)


def _pod_alive(step: Step) -> bool:
    pod = step.current()
    return pod is not None and pod.alive


def _pod_deleting(step: Step) -> bool:
    return _pod_alive(step) and _pod(step).deleting


def _container_running(step: Step) -> bool:
    return _pod_alive(step) and _pod(step).running


def _pod_finished_finally(step: Step) -> bool:
    pod = step.current()
    return pod is not None and pod.finished and outcome_of(pod).kind in FINAL_OUTCOMES


def _not_yet_due(step: Step) -> bool:
    due = step.status.next_attempt_at
    return due is not None and step.now < due


def _still_no_place(step: Step) -> bool:
    verdict = step.admission
    return (
        verdict is not None
        and not verdict.admitted
        and step.status.raw.get("reason") == verdict.reason
    )


def _approvals_answered(step: Step) -> bool:
    return covered(step.status.pending_approvals, step.run.approved_call_ids)


# ------------------------------------------------------------------ moves
def _stop_deleted(step: Step) -> Decision:
    stop = step.live_own()
    return Decision(
        delete_pods=step.stale + stop,
        note="AgentRun is being deleted: stopping its pods" if stop else "",
    )


def _stop_strays(step: Step) -> Decision:
    stray = step.live_own()
    return step.result(delete=stray, note="finished: stopping stray pods" if stray else "")


def _invalid_name(step: Step) -> Decision:
    return fail(step, "InvalidName", step.run.name_problem or "", {})


def _adopt(step: Step) -> None:
    pod = step.adoptable()
    assert pod is not None
    step.adopt(pod)


def _nothing(step: Step) -> Decision:
    return step.result()


def _suspend_no_pod(step: Step) -> Decision:
    return suspend_now(step, None)


def _suspend_pod(step: Step) -> Decision:
    return suspend_now(step, step.current())


def _create_first(step: Step) -> Decision:
    return start(step, 1, "created")


def _recreate(step: Step) -> Decision:
    return start(step, step.status.attempt, "recreated")


def _pod_deleted(step: Step) -> Decision:
    expected = current_pod_name(step.run.name, step.status)
    assert expected is not None  # attempt >= 1 here
    return lost(step, expected, "PodDeleted", f"pod {expected} was deleted")


def _running(step: Step) -> Decision:
    changes: JSON = {"phase": Phase.RUNNING, "reason": None, "message": None}
    if not step.status.started_at:
        changes["startedAt"] = format_time(step.now)
    return step.to(changes)


def _pending(step: Step) -> Decision:
    pod = _pod(step)
    reason, message = None, None
    if pod.waiting_reason in _WAITING_ERRORS:
        reason = pod.waiting_reason
        message = pod.waiting_message or pod.waiting_reason
    elif pod.unschedulable:
        reason, message = "Unschedulable", pod.unschedulable
    return step.to({"phase": Phase.PENDING, "reason": reason, "message": message})


def _resume(step: Step) -> Decision:
    return resume(step)


def _suspend_interrupted(step: Step) -> Decision:
    return suspend_now(step, None, delete=step.live_own())


def _back_off(step: Step) -> Decision:
    due = step.status.next_attempt_at
    assert due is not None
    return step.result(
        delete=step.live_own(),
        requeue_after=(due - step.now).total_seconds(),
        note=f"backing off until {format_time(due)}",
    )


def _resume_interrupted(step: Step) -> Decision:
    return resume(step, delete=step.live_own())


def _stopping(step: Step) -> Decision:
    pod = _pod(step)
    if step.run.suspend and not pod.deleting:
        return step.result(delete=(pod.name,), note=f"suspended: stopping {pod.name}")
    return step.result(note=f"waiting for pod {pod.name} to stop")


DECISION_TABLE: tuple[Row, ...] = (
    Row("any", "AgentRun being deleted", lambda s: s.run.deleting, _stop_deleted),
    Row(
        "Failed (BudgetExceeded)",
        "spec.budget raised past status.usage and costUSD",
        budget_raised,
        _resume,
    ),
    Row("Succeeded/Failed", "savedStateUnread", lambda s: s.status.saved_state_unread, catch_up),
    Row("Succeeded/Failed", "anything", _always, _stop_strays),
    Row(
        "any but terminal",
        "name over 63 characters",
        lambda s: s.run.name_problem is not None,
        _invalid_name,
    ),
    Row(
        "any but terminal",
        "own pod with an attempt above status.attempt",
        lambda s: s.adoptable() is not None,
        _adopt,
    ),
    Row("(none)", "suspend", lambda s: _no_attempt(s) and s.run.suspend, _suspend_no_pod),
    Row("(none)", "-", _no_attempt, _create_first),
    Row(
        "Pending/Running",
        "place withdrawn (Kueue evicted its Workload)",
        lambda s: s.admission is not None and s.admission.withdrawn,
        withdraw,
    ),
    Row(
        "Pending/Running",
        "pod missing, recorded, suspend",
        lambda s: _pod_missing_recorded(s) and s.run.suspend,
        _suspend_no_pod,
    ),
    Row("Pending/Running", "pod missing, recorded", _pod_missing_recorded, _pod_deleted),
    Row("Pending/Running", "pod missing", _pod_missing, _recreate),
    Row(
        "Pending/Running",
        "pod alive, suspend",
        lambda s: _pod_alive(s) and s.run.suspend,
        _suspend_pod,
    ),
    Row(
        "Pending/Running",
        "pod deleting, not by us (drain, eviction, delete)",
        _pod_deleting,
        lambda s: terminating(s, _pod(s)),
    ),
    Row("Pending/Running", "container running", _container_running, _running),
    Row("Pending/Running", "container waiting", _pod_alive, _pending),
    Row("Pending/Running", "pod finished", _always, lambda s: finished(s, _pod(s))),
    Row("Queued", "suspend", _suspend, _suspend_no_pod),
    Row("Queued", "still no place, for the reason status gives", _still_no_place, _nothing),
    Row("Queued", "no attempt yet", _no_attempt, _create_first),
    Row("Queued", "-", _always, _resume),
    Row("Interrupted", "suspend", _suspend, _suspend_interrupted),
    Row("Interrupted", "before nextAttemptAt", _not_yet_due, _back_off),
    Row("Interrupted", "due", _always, _resume_interrupted),
    Row("WaitingForApproval", "suspend", _suspend, _suspend_no_pod),
    Row(
        "WaitingForApproval",
        "spec.approvals answers every pending callId",
        _approvals_answered,
        _resume,
    ),
    Row("WaitingForApproval", "otherwise", _always, _nothing),
    Row("Suspended", "pod still alive", _pod_alive, _stopping),
    Row(
        "Suspended",
        "pod exited 0/65/77/78",
        _pod_finished_finally,
        lambda s: finished(s, _pod(s)),
    ),
    Row("Suspended", "suspend", _suspend, _nothing),
    Row("Suspended", "suspend false", lambda s: not s.run.suspend, _resume),
)
"""The decision table of this module's docstring, row for row."""
