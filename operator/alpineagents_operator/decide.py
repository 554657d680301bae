"""One reconcile step of an AgentRun, as a pure function.

:func:`decide` looks at what is (the AgentRun with its status, the pods labelled with its
name, and optionally what the store says about its saved State) and returns one
:class:`Decision`: a status patch, at most one pod to create, pods to delete, Events,
and when to look again. It never talks to Kubernetes or a store, so the same inputs give
the same answer after an operator restart, a missed event or a duplicate event, and
every case is a row in a table-driven unit test.

The decision table (``P`` = ``status.phase``, "current pod" = the pod named
``<run>-<status.attempt>`` owned by this AgentRun's uid, or the warm pool's standby pod
``status.pod`` names when the run was handed one, labelled with that attempt):

========================  ===========================  ===========================================
P                         what is seen                 move
========================  ===========================  ===========================================
any                       AgentRun being deleted       delete its live pods gracefully; nothing else
any                       pods of an older AgentRun    delete them (same name, other uid)
                          with the same name
any but terminal          own pod with an attempt      adopt it (a step created it and then failed
                          above status.attempt         to record it): attempt, pod, Pending
any but terminal          name over 63 characters      Failed (InvalidName): no pod can carry it
Succeeded/Failed          savedStateUnread             read the saved State; its facts → status
Succeeded/Failed          anything                     nothing (stray live pods are deleted)
(none)                    suspend                      Suspended, no pod
(none)                    -                            create pod 1 → Pending
(none), resume            admission caps, no place     Queued: no pod, reason NamespaceCap or
                          held, none free for it       ClusterCap, queuePlace (see admission)
Queued                    a place for it               start (or resume), admitted: true
Queued                    suspend                      Suspended
Pending/Running           pod missing, recorded        lost* ("PodDeleted")
Pending/Running           pod missing, not recorded    create it
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
Pending/Running           exit 0                       Succeeded, answer from the termination
                                                       message (or the store); after attempt 1
                                                       the saved State's facts (see below)
Pending/Running           exit 65                      Failed (NotRetryable), no restart
Pending/Running           exit 76                      WaitingForApproval + pendingApprovals
Pending/Running           exit 77                      Failed (MaxTurns)
Pending/Running           exit 78                      Failed (BudgetExceeded)
Failed (BudgetExceeded)   spec.budget raised past      resume
                          status.usage and costUSD
Pending/Running           other exit, OOMKilled,       suspend: Suspended. Otherwise lost*:
                          exit 75 / 137 / 1            restarts+1; over maxRestarts: Failed
                                                       (RestartLimitExceeded); else Interrupted
                                                       with nextAttemptAt = now + backoff
Pending/Running           stopped by the cluster:      lost*, a disruption: disruptions+1, not a
                          deleted, drained (143),      restart; Interrupted, replaced at once;
                          Evicted, node lost           past ten in a row, each within 60 s of
                                                       the last, after 1, 2, 4 ... 300 s
                                                       (DisruptionBackoff)
Interrupted               suspend                      Suspended
Interrupted               before nextAttemptAt         wait (requeue at nextAttemptAt)
Interrupted               due                          resume
WaitingForApproval        suspend                      Suspended
WaitingForApproval        spec.approvals answers       resume
                          every pending callId
WaitingForApproval        otherwise                    nothing
Suspended                 pod still alive              wait (delete it if not yet deleting)
Suspended                 pod exited 0 / 65 / 77       Succeeded / Failed (final outcomes win)
Suspended                 suspend false                resume
========================  ===========================  ===========================================

"Lost*" reads the saved State first: a pod can save its answer and be gone before its exit
is seen, so a saved answer → Succeeded, a saved stop at max turns → Failed (MaxTurns), a
saved stop for approvals → WaitingForApproval, none of them counting a loss. Only a State
without an outcome (or one that cannot be read) makes it a loss.

Under admission caps (``admission``) a run holds its place from its first pod until it
ends, waits for approval or is suspended (``admitted`` set to null then); a lost pod's
replacement keeps it.

A run that ends after more than one pod reads the saved State too: the history, not the
last pod's report, says which calls were aborted over all its pods (status.abortedCalls),
its turns and usage. When the store cannot be read then, the run ends anyway with the
report's facts and ``savedStateUnread``, and the saved State is read again later.

"Resume" needs the saved State (``Decision.needs_saved`` asks the caller to load it and
decide again): saved answer → Succeeded without a pod; saved stop at max turns → Failed;
saved stop waiting for approvals that spec.approvals does not all answer →
WaitingForApproval; otherwise fence the store (``claim_state``) and create pod
``attempt+1`` → Pending, recording lastSavedSeq and the calls loading closed as aborted.
The caller decides that again from a read after the claim (a lost pod still running may
have saved in between, e.g. the result of a call the first read saw open), so status
says what the next pod loads. When the claim fails (:func:`claim_refused`) the pod is not created: the phase stays,
reason ``FencingFailed`` says why, and the step is tried again with backoff.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from .admission import NO_PLACE, Verdict
from .pod_outcomes import outcome_of
from .run_status import answer_text, cost_text, status_patch, usage_status
from .views import (
    JSON,
    TERMINAL_PHASES,
    AgentRunView,
    PendingApproval,
    Phase,
    PodView,
    Refusal,
    RunEvent,
    SavedView,
    current_pod_name,
    format_time,
    is_standby_pod,
    parse_time,
    pod_name_for,
)

STUCK_TERMINATING_SLACK = timedelta(seconds=30)
"""How long past its deletion deadline a pod may stay before its node counts as lost."""
STORE_RETRY_SECONDS = 10.0
"""How soon a finished run whose saved State could not be read tries again."""
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
CLAIM_RETRY_MAX_SECONDS = 30.0

"""Longest wait between two tries to claim a State before starting its replacement pod."""

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


@dataclass(frozen=True)
class Decision:
    """What one reconcile step does. An empty Decision means "nothing to do"."""

    status: Mapping[str, Any] = field(default_factory=dict)
    """JSON merge patch for ``.status`` (only changed fields; None deletes a field)."""
    create_pod: int | None = None
    """Attempt number of the pod to create (``<run>-<attempt>``)."""
    delete_pods: tuple[str, ...] = ()
    """Pods to delete gracefully (their SIGTERM handler saves the State)."""
    events: tuple[RunEvent, ...] = ()
    needs_saved: bool = False
    """Load the saved State and call :func:`decide` again with it."""
    claim_state: bool = False
    """Fence the store (``store.claim``) before creating the pod, so a lost pod that is
    somehow still running can no longer write into the State its successor owns."""
    requeue_after: float | None = None
    """Look again after this many seconds even if no event comes (backoff, deadlines)."""
    lost_reason: str | None = None
    """Set when this step noticed the current pod lost and will replace it: why it was
    lost (starts the resume-latency clock)."""
    note: str = ""
    """One line for the operator's log: what this step does and why."""

    @property
    def acts(self) -> bool:
        """Whether the step changes anything (so the next step may decide differently)."""
        return bool(self.status or self.create_pod or self.delete_pods or self.events)


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
    return _Step(run, pods, saved, now, admission).decide()


def refused(run: AgentRunView, attempt: int, refusal: Refusal, now: datetime) -> Decision:
    """The step for a run whose pod ``attempt`` is not started, for ``refusal``'s reason.

    A final refusal (a forbidden Secret or store, a spec no pod can take, a pod the API
    server calls invalid) ends the run Failed with one Warning Event; once Failed, no
    later step acts, so it never repeats. Any other keeps the run's phase, says why in
    ``reason``/``message`` (with a Warning Event when the reason is new) and is taken
    again in ``refusal.retry_after`` seconds.
    """
    step = _Step(run, (), None, now)
    if refusal.final:
        return step._fail(refusal.reason, refusal.message, {})
    return step._to(
        {"reason": refusal.reason, "message": refusal.message},
        events=_event_if_new(
            run.status.raw.get("reason"), "Warning", refusal.reason, refusal.message
        ),
        requeue_after=refusal.retry_after,
        note=f"pod {pod_name_for(run.name, attempt)} not started ({refusal.reason}); trying again",
    )


def pod_refusal(run: AgentRunView, attempt: int, status: int, message: str) -> Refusal:
    """The API server refused to create pod ``attempt`` with HTTP ``status``.

    An invalid pod (400/413/422: a malformed ``resources``, ``env``, ``affinity``, a spec
    too large for its Secret, ...) will never be accepted: final, with the server's
    words. Anything else (403 from a quota, 5xx) may pass later.
    """
    text = f"pod {pod_name_for(run.name, attempt)} was refused: {message}"
    if status in (400, 413, 422):
        return Refusal("PodInvalid", text)
    return Refusal("PodRefused", text, final=False)


def claim_refusal(run: AgentRunView, attempt: int, error: str, failures: int) -> Refusal:
    """The operator could not claim (fence) the run's State before creating pod ``attempt``.

    A lost pod that still runs (its node cut off, a force delete) could otherwise write
    into the State next to its successor. The reason is ``FencingFailed``, and the step
    (read the saved State, claim, create) is taken again after a backoff that doubles
    with each of the ``failures`` so far, up to :data:`CLAIM_RETRY_MAX_SECONDS`. It is
    no restart: no pod was lost.
    """
    name = pod_name_for(run.name, attempt)
    delay = min(CLAIM_RETRY_MAX_SECONDS, 2.0 ** max(0, failures - 1))
    message = (
        f"could not claim State {run.state_id} before starting pod {name}, so a lost pod "
        f"that may still be running cannot be fenced off it: {error}; pod {name} starts "
        f"once the claim succeeds (try {failures + 1} in {delay:g}s)"
    )
    return Refusal("FencingFailed", message, final=False, retry_after=delay)


def covered(pending: Sequence[PendingApproval], approved: frozenset[str]) -> bool:
    """Whether every pending call has an answer in ``spec.approvals``."""
    return all(call.call_id in approved for call in pending)


# --------------------------------------------------------------------------- the step
class _Step:
    def __init__(
        self,
        run: AgentRunView,
        pods: Sequence[PodView],
        saved: SavedView | None,
        now: datetime,
        admission: Verdict | None = None,
    ) -> None:
        self.run = run
        self.saved = saved
        self.now = now
        self.admission = admission
        self.own = [p for p in pods if p.owner_uid == run.uid]
        self.foreign = [p for p in pods if p.owner_uid != run.uid]
        self.status = run.status
        self.changes: JSON = {}
        self._events: list[RunEvent] = []
        # Pods of an earlier AgentRun with the same name must not run alongside this one.
        self.stale = tuple(p.name for p in self.foreign if p.alive and not p.deleting)

    # ------------------------------------------------------------------ entry
    def decide(self) -> Decision:
        run, status = self.run, self.status
        if run.deleting:
            stop = tuple(p.name for p in self.own if p.alive and not p.deleting)
            return Decision(
                delete_pods=self.stale + stop,
                note="AgentRun is being deleted: stopping its pods" if stop else "",
            )
        if status.phase == Phase.FAILED and self._budget_raised():
            return self._resume()
        if status.phase in TERMINAL_PHASES:
            stray = tuple(p.name for p in self.own if p.alive and not p.deleting)
            if status.saved_state_unread:
                return self._catch_up(stray)
            return self._result(delete=stray, note="finished: stopping stray pods" if stray else "")
        problem = run.name_problem
        if problem is not None:
            return self._fail("InvalidName", problem, {})
        self._adopt()
        status = self.status
        phase = status.phase
        if phase in (None, Phase.PENDING, Phase.RUNNING):
            if status.attempt == 0:
                return self._new()
            return self._active()
        if phase == Phase.QUEUED:
            if run.suspend:
                return self._suspend_now(None)
            return self._new() if status.attempt == 0 else self._resume()
        if phase == Phase.INTERRUPTED:
            return self._interrupted()
        if phase == Phase.WAITING_FOR_APPROVAL:
            return self._waiting()
        return self._suspended()

    # ------------------------------------------------------------------ phases
    def _new(self) -> Decision:
        if self.run.suspend:
            return self._suspend_now(None)
        return self._start(1, "created")

    def _active(self) -> Decision:
        run, status = self.run, self.status
        current = self._current()
        expected = current_pod_name(run.name, status)
        assert expected is not None  # attempt >= 1 here
        if current is None:
            if status.pod == expected:
                if run.suspend:
                    return self._suspend_now(None)
                return self._lost(expected, "PodDeleted", f"pod {expected} was deleted")
            return self._start(status.attempt, "recreated")
        if current.alive:
            if run.suspend:
                return self._suspend_now(current)
            if current.deleting:
                # A graceful stop: the pod saves and exits, but its container may take
                # its whole grace period to go. A store that fences lets the
                # replacement start now: the claim before it is created refuses the old
                # pod's saves from then on, so one pod writes the run at a time.
                if self.saved is None:
                    return Decision(
                        needs_saved=True,
                        note=f"pod {current.name} is terminating: reading the saved State",
                    )
                if self.saved.fences and self.saved.exists and self.saved.error is None:
                    # Its own stop save knows best what was running: let it land first.
                    wait = self._stop_save_wait(current)
                    if wait > 0:
                        return self._result(
                            requeue_after=min(wait, STOP_SAVE_POLL_SECONDS),
                            note=f"pod {current.name} is terminating: waiting for its stop save",
                        )
                    return self._lost(
                        current.name,
                        "PodTerminating",
                        f"pod {current.name} is terminating; the claim fences its last save",
                    )
                deadline = (current.deletion_deadline or self.now) + STUCK_TERMINATING_SLACK
                if self.now >= deadline:
                    return self._lost(
                        current.name,
                        "PodStuckTerminating",
                        f"pod {current.name} did not finish terminating by "
                        f"{format_time(deadline)}; its node is presumed lost",
                    )
                return self._result(
                    requeue_after=(deadline - self.now).total_seconds(),
                    note=f"pod {current.name} is terminating",
                )
            if current.running:
                changes: JSON = {"phase": Phase.RUNNING, "reason": None, "message": None}
                if not status.started_at:
                    changes["startedAt"] = format_time(self.now)
                return self._to(changes)
            reason, message = None, None
            if current.waiting_reason in _WAITING_ERRORS:
                reason = current.waiting_reason
                message = current.waiting_message or current.waiting_reason
            elif current.unschedulable:
                reason, message = "Unschedulable", current.unschedulable
            return self._to({"phase": Phase.PENDING, "reason": reason, "message": message})
        return self._finished(current)

    def _stop_save_wait(self, pod: PodView) -> float:
        """Seconds still to wait for the stop record of ``pod``, deleted and still
        running, before the claim fences it off (0: claim now). Its runner saves on
        SIGTERM in tens of milliseconds; the bound covers one that cannot (hung, starved
        of CPU, its store unreachable). A pod whose container never ran has nothing to
        save, and a stop already saved since it began is all it will write."""
        saved = self.saved
        if not pod.running or saved is None:
            return 0.0
        since = self.status.last_saved_seq
        wrote = saved.last_saved_seq is not None and (since is None or saved.last_saved_seq > since)
        if saved.stopped is not None and wrote:
            return 0.0
        deleted_at = pod.deleted_at or self.now
        until = deleted_at + STOP_SAVE_WAIT
        if pod.deletion_deadline is not None:
            until = min(until, pod.deletion_deadline)
        return max(0.0, (until - self.now).total_seconds())

    def _finished(self, pod: PodView) -> Decision:
        outcome = outcome_of(pod)
        report = pod.exit.report if pod.exit else None
        facts: JSON = {}
        if pod.image:
            facts["runnerImage"] = pod.image
        if report is not None:
            if report.runner_version:
                facts["runnerVersion"] = report.runner_version
            if report.last_saved_seq is not None:
                facts["lastSavedSeq"] = report.last_saved_seq
            if report.turns is not None:
                facts["turns"] = report.turns
            if report.usage is not None:
                facts["usage"] = usage_status(report.usage)
            if report.cost_usd is not None:
                facts["costUSD"] = cost_text(report.cost_usd)
            if report.aborted:
                facts["abortedCalls"] = self._aborted_with(report.aborted)
        if outcome.kind in ("answered", "max_turns"):
            answer = report.answer if report else None
            # After more than one pod, only the history knows every call an earlier pod
            # left aborted (a store outage may have hidden them from every step so far).
            wanted = self.status.attempt > 1 or (outcome.kind == "answered" and answer is None)
            if wanted and self.saved is None:
                return Decision(needs_saved=True, note="finished: reading the saved State")
            unread = wanted and self.saved is not None and self.saved.error is not None
            if wanted and not unread:
                facts.update(self._saved_facts())
                if answer is None and self.saved is not None:
                    answer = self.saved.answer
            if unread:
                facts["savedStateUnread"] = True
            if outcome.kind == "answered":
                decision = self._succeed(answer, facts, f"answered (pod {pod.name})")
            else:
                decision = self._fail("MaxTurns", outcome.message, facts)
            return replace(decision, requeue_after=STORE_RETRY_SECONDS) if unread else decision
        if outcome.kind == "not_retryable":
            return self._fail("NotRetryable", outcome.message, facts)
        if outcome.kind == "budget_exceeded":
            return self._fail("BudgetExceeded", outcome.message, facts)
        if outcome.kind == "waiting":
            pending = report.pending_approvals if report else ()
            if not pending:
                if self.saved is None:
                    return Decision(needs_saved=True, note="waiting: reading pending calls")
                pending = self.saved.pending_approvals
                facts.update(self._saved_facts())
            return self._wait_for_approval(pending, facts)
        if self.run.suspend:
            return self._suspend_now(None)
        return self._lost(
            pod.name, outcome.reason, outcome.message, facts, by_cluster=outcome.by_cluster
        )

    def _interrupted(self) -> Decision:
        run, status = self.run, self.status
        live = tuple(p.name for p in self._live_own() if not p.deleting)
        if run.suspend:
            return self._suspend_now(None, delete=live)
        due = status.next_attempt_at
        if due is not None and self.now < due:
            return self._result(
                delete=live,
                requeue_after=(due - self.now).total_seconds(),
                note=f"backing off until {format_time(due)}",
            )
        return self._resume(delete=live)

    def _waiting(self) -> Decision:
        if self.run.suspend:
            return self._suspend_now(None)
        if covered(self.status.pending_approvals, self.run.approved_call_ids):
            return self._resume()
        return self._result()

    def _suspended(self) -> Decision:
        current = self._current()
        if current is not None and current.alive:
            if self.run.suspend and not current.deleting:
                return self._result(
                    delete=(current.name,), note=f"suspended: stopping {current.name}"
                )
            return self._result(note=f"waiting for pod {current.name} to stop")
        if current is not None and current.finished:
            # A final outcome reached while stopping wins over the suspension. (Waiting for
            # approval does not: the saved State reports it again on resume.)
            outcome = outcome_of(current)
            if outcome.kind in ("answered", "not_retryable", "max_turns", "budget_exceeded"):
                return self._finished(current)
        if self.run.suspend:
            return self._result()
        return self._resume()

    # ------------------------------------------------------------------ moves
    def _start(self, attempt: int, why: str) -> Decision:
        name = pod_name_for(self.run.name, attempt)
        if any(p.name == name for p in self.foreign):
            return self._result(note=f"waiting for pod {name} of an earlier AgentRun to go")
        waiting = self._not_admitted()
        if waiting is not None:
            return waiting
        return self._to(
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

    def _resume(self, delete: tuple[str, ...] = ()) -> Decision:
        run, status, saved = self.run, self.status, self.saved
        if saved is None:
            return Decision(
                needs_saved=True,
                delete_pods=self.stale + delete,
                note="resume: reading the saved State",
            )
        attempt = status.attempt + 1
        message = None
        if saved.error is not None:
            message = f"could not read the saved State ({saved.error}); the pod will load it"
        elif saved.exists:
            if saved.answer is not None:
                return self._succeed(
                    saved.answer, self._saved_facts(), "the saved State already has its answer"
                )
            if saved.stopped == "max_turns":
                return self._fail(
                    "MaxTurns", "the saved State stopped at the turn limit", self._saved_facts()
                )
            over = self._over_budget(saved)
            if over is not None:
                return self._fail("BudgetExceeded", over, self._saved_facts())
            if (
                saved.stopped == "waiting_for_approval"
                and saved.pending_approvals
                and not covered(saved.pending_approvals, run.approved_call_ids)
            ):
                return self._wait_for_approval(saved.pending_approvals, self._saved_facts())
        name = pod_name_for(run.name, attempt)
        if any(p.name == name for p in self.foreign):
            return self._result(
                delete=delete, note=f"waiting for pod {name} of an earlier AgentRun to go"
            )
        waiting = self._not_admitted(delete)
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
            changes.update(self._saved_facts())
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
        return self._to(
            changes,
            create=attempt,
            delete=delete,
            claim=saved.exists and saved.error is None,
            events=(event,),
            note=f"resuming: creating pod {name}",
        )

    def _lost(
        self,
        pod_name: str,
        reason: str,
        message: str,
        facts: JSON | None = None,
        *,
        by_cluster: bool = True,
    ) -> Decision:
        # ``by_cluster``: the pod did not fail, the cluster stopped it (deleted, drained,
        # evicted, its node gone): replaced at once, as a ReplicaSet replaces its pods.
        # The backoff is for a pod that failed, which may fail again the same way.
        # A pod can save its outcome and be gone before its exit was seen (deleted,
        # its node lost): what the store holds decides whether anything was lost.
        saved = self.saved
        if saved is None:
            return Decision(
                needs_saved=True, note=f"pod {pod_name} gone ({reason}): reading the saved State"
            )
        if saved.exists and saved.error is None:
            known = {**(facts or {}), **self._saved_facts()}
            gone = f"pod {pod_name} was gone ({reason})"
            if saved.answer is not None:
                return self._succeed(saved.answer, known, f"{gone} after saving its answer")
            if saved.stopped == "max_turns":
                return self._fail(
                    "MaxTurns", f"{gone}; its saved State stopped at the turn limit", known
                )
            over = self._over_budget(saved)
            if over is not None:
                return self._fail("BudgetExceeded", f"{gone}; {over}", known)
            if saved.stopped == "waiting_for_approval" and saved.pending_approvals:
                return self._wait_for_approval(saved.pending_approvals, known)
            facts = known
        if by_cluster:
            return self._disrupted(pod_name, reason, message, facts)
        policy = self.run.restart_policy
        restarts = self.status.restarts + 1
        lost = RunEvent("Warning", "PodLost", f"{message} ({reason})")
        if restarts > policy.max_restarts:
            text = (
                f"{message}; the run lost its pod {restarts} times, more than "
                f"spec.restartPolicy.maxRestarts={policy.max_restarts}"
            )
            return self._fail(
                "RestartLimitExceeded", text, {**(facts or {}), "restarts": restarts}, (lost,)
            )
        delay = 0.0 if by_cluster else policy.backoff(restarts)
        changes: JSON = {
            **(facts or {}),
            "phase": Phase.INTERRUPTED,
            "restarts": restarts,
            "nextAttemptAt": format_time(self.now + timedelta(seconds=delay)),
            "reason": reason,
            "message": f"{message}; restart {restarts} of {policy.max_restarts} in {delay:g}s",
        }
        return self._to(
            changes,
            events=(lost,),
            requeue_after=delay,
            lost_reason=reason,
            note=f"pod {pod_name} lost ({reason}): restart {restarts} in {delay:g}s",
        )

    def _disrupted(self, pod_name: str, reason: str, message: str, facts: JSON | None) -> Decision:
        """A pod the cluster stopped (deleted, drained, evicted, its node gone): not a failure
        of the run, so not a restart toward maxRestarts (as a Job's podFailurePolicy ignores
        DisruptionTarget). Replaced at once, unless more than
        :data:`QUICK_DISRUPTIONS_ALLOWED` came in a row, each within
        :data:`DISRUPTION_QUICK` of the last (something deleting each new pod): then each
        waits twice as long as the one before, up to :data:`DISRUPTION_MAX_BACKOFF`, and
        the status says why."""
        raw = self.status.raw
        count = int(raw.get("disruptions") or 0) + 1
        last = parse_time(raw.get("lastDisruptionAt"))
        quick = int(raw.get("quickDisruptions") or 0)
        quick = quick + 1 if last is not None and self.now - last < DISRUPTION_QUICK else 0
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
            "lastDisruptionAt": format_time(self.now),
            "quickDisruptions": quick,
            "nextAttemptAt": format_time(self.now + timedelta(seconds=delay)),
            "reason": reason,
            "message": text,
        }
        return self._to(
            changes,
            events=tuple(events),
            requeue_after=delay,
            lost_reason=reason,
            note=f"pod {pod_name} stopped by the cluster ({reason}): disruption {count}, "
            f"next pod in {delay:g}s",
        )

    def _not_admitted(self, delete: tuple[str, ...] = ()) -> Decision | None:
        """Queued, when the run holds no place and may not take one now; else None (the
        pod starts, the run holding its place from then on: ``status.admitted``)."""
        verdict = self.admission
        if verdict is None or self.status.admitted:
            return None
        if verdict.admitted:
            self.changes.update({"admitted": True, "queuePlace": None})
            if self.status.phase == Phase.QUEUED:
                self._events.append(RunEvent("Normal", "Admitted", "admitted: its pod starts"))
            return None
        if self.status.phase == Phase.QUEUED and self.status.raw.get("reason") == verdict.reason:
            # Its place as first judged stands: rewriting every queued run's place each
            # time the line moves would be a patch per run (10,000 at a time).
            return self._result(delete=delete)
        events: tuple[RunEvent, ...] = ()
        if self.status.phase != Phase.QUEUED:
            events = (RunEvent("Normal", "Queued", verdict.message),)
        return self._to(
            {
                "phase": Phase.QUEUED,
                "reason": verdict.reason,
                "message": verdict.message,
                "queuePlace": verdict.place,
                "nextAttemptAt": None,
            },
            delete=delete,
            events=events,
            note=verdict.message,
        )

    def _suspend_now(self, current: PodView | None, delete: tuple[str, ...] = ()) -> Decision:
        stopping = current is not None and current.alive
        if current is not None and current.alive and not current.deleting:
            delete = (*delete, current.name)
        message = (
            f"spec.suspend is true: pod {current.name} is stopping (it saves on SIGTERM)"
            if stopping and current is not None
            else "spec.suspend is true: no pod runs"
        )
        events = _event_if_new(self.status.phase, "Normal", "Suspended", message, Phase.SUSPENDED)
        return self._to(
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

    def _succeed(self, answer: str | None, facts: JSON, why: str) -> Decision:
        return self._to(
            {
                **facts,
                "phase": Phase.SUCCEEDED,
                "answer": answer_text(answer),
                "completedAt": format_time(self.now),
                "nextAttemptAt": None,
                "pendingApprovals": None,
                "reason": "Answered",
                "message": None,
            },
            events=(RunEvent("Normal", "Succeeded", why),),
            note=f"succeeded: {why}",
        )

    def _fail(
        self, reason: str, message: str, facts: JSON, events: tuple[RunEvent, ...] = ()
    ) -> Decision:
        return self._to(
            {
                **facts,
                "phase": Phase.FAILED,
                "completedAt": format_time(self.now),
                "nextAttemptAt": None,
                "reason": reason,
                "message": message,
            },
            events=(*events, RunEvent("Warning", "Failed", f"{reason}: {message}")),
            note=f"failed: {reason}",
        )

    def _wait_for_approval(self, pending: Sequence[PendingApproval], facts: JSON) -> Decision:
        names = ", ".join(f"{p.name or '?'} ({p.call_id})" for p in pending)
        message = (
            f"waiting for a person to answer {len(pending)} tool call(s) in spec.approvals: {names}"
        )
        events = _event_if_new(
            self.status.phase, "Normal", "WaitingForApproval", message, Phase.WAITING_FOR_APPROVAL
        )
        return self._to(
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

    def _catch_up(self, stray: tuple[str, ...]) -> Decision:
        """A finished run whose saved State could not be read when it ended: read it now,
        so status (abortedCalls above all) agrees with the history."""
        saved = self.saved
        if saved is None:
            return Decision(needs_saved=True, note="finished: reading the saved State it missed")
        if saved.error is not None:
            return self._result(
                delete=stray,
                requeue_after=STORE_RETRY_SECONDS,
                note=f"finished, saved State still unreadable: {saved.error}",
            )
        changes: JSON = {**self._saved_facts(), "savedStateUnread": None}
        if (
            self.status.phase == Phase.SUCCEEDED
            and saved.answer is not None
            and not self.status.raw.get("answer")
        ):
            changes["answer"] = answer_text(saved.answer)
        return self._to(changes, delete=stray, note="status brought in line with the saved State")

    # ------------------------------------------------------------------ bookkeeping
    def _aborted_with(self, more: Iterable[str]) -> list[str]:
        """status.abortedCalls with ``more`` added (calls only ever join the history)."""
        return list(dict.fromkeys([*self.status.aborted_calls, *more]))

    def _adopt(self) -> None:
        numbered = [p for p in self.own if p.attempt is not None]
        newest = max(numbered, key=lambda p: p.attempt or 0, default=None)
        if newest is None or newest.attempt is None or newest.attempt <= self.status.attempt:
            return
        if newest.name != pod_name_for(self.run.name, newest.attempt) and not is_standby_pod(
            newest.name
        ):
            return
        adopted: JSON = {
            "phase": Phase.PENDING,
            "attempt": newest.attempt,
            "pod": newest.name,
            "nextAttemptAt": None,
            "pendingApprovals": None,
        }
        self.changes.update(adopted)
        self.status = replace(
            self.status,
            phase=Phase.PENDING,
            attempt=newest.attempt,
            pod=newest.name,
            next_attempt_at=None,
            pending_approvals=(),
        )

    def _current(self) -> PodView | None:
        name = current_pod_name(self.run.name, self.status)
        if name is None:
            return None
        # A standby handed this run carries its attempt as a label, as a run pod does.
        return next(
            (
                p
                for p in self.own
                if p.name == name and (p.attempt == self.status.attempt or not is_standby_pod(name))
            ),
            None,
        )

    def _live_own(self) -> list[PodView]:
        return [p for p in self.own if p.alive]

    def _older_live(self) -> tuple[str, ...]:
        # An older attempt still running would be a second writer: stop it.
        current = current_pod_name(self.run.name, self.status)
        return tuple(
            p.name
            for p in self.own
            if p.alive
            and not p.deleting
            and p.name != current
            and (p.attempt or 0) < self.status.attempt
        )

    def _over_budget(self, saved: SavedView) -> str | None:
        """Why a saved State stopped at its budget still is at it (None: it may go on)."""
        if saved.stopped != "budget_exceeded":
            return None
        budget = self.run.budget
        why = budget.exceeded(saved.usage, saved.cost_usd) if budget is not None else None
        if budget is not None and why is None:
            return None  # raised since: the next pod goes on
        return f"the saved State stopped at its budget (spec.budget): {why or 'no budget now'}"

    def _budget_raised(self) -> bool:
        """A run failed at its budget whose spec.budget now allows what it has spent."""
        status = self.status
        if status.raw.get("reason") != "BudgetExceeded":
            return False
        budget = self.run.budget
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

    def _saved_facts(self) -> JSON:
        saved = self.saved
        if saved is None or not saved.exists or saved.error is not None:
            return {}
        facts: JSON = {
            "turns": saved.turns,
            "usage": usage_status(saved.usage),
            "costUSD": cost_text(saved.cost_usd),
        }
        if saved.last_saved_seq is not None:
            facts["lastSavedSeq"] = saved.last_saved_seq
        aborted = self._aborted_with(saved.aborted_calls)
        if aborted:
            facts["abortedCalls"] = aborted
        return facts

    def _to(
        self,
        changes: JSON,
        *,
        create: int | None = None,
        delete: tuple[str, ...] = (),
        claim: bool = False,
        events: tuple[RunEvent, ...] = (),
        requeue_after: float | None = None,
        lost_reason: str | None = None,
        note: str = "",
    ) -> Decision:
        self.changes.update(changes)
        return self._result(
            create=create,
            delete=delete,
            claim=claim,
            events=events,
            requeue_after=requeue_after,
            lost_reason=lost_reason,
            note=note,
        )

    def _result(
        self,
        *,
        create: int | None = None,
        delete: tuple[str, ...] = (),
        claim: bool = False,
        events: tuple[RunEvent, ...] = (),
        requeue_after: float | None = None,
        lost_reason: str | None = None,
        note: str = "",
    ) -> Decision:
        phase = self.changes.get("phase")
        if self.status.admitted and phase in NO_PLACE:
            self.changes["admitted"] = None  # its place goes to the next in line
        events = (*self._events, *events)
        patch = status_patch(self.run, self.changes, self.now)
        deletes = tuple(dict.fromkeys((*self.stale, *self._older_live(), *delete)))
        return Decision(
            status=patch,
            create_pod=create,
            delete_pods=deletes,
            events=events if (patch or create or deletes or events) else (),
            claim_state=claim,
            requeue_after=requeue_after,
            lost_reason=lost_reason,
            note=note,
        )


def _event_if_new(
    shown: object, kind: str, reason: str, message: str, new: object = None
) -> tuple[RunEvent, ...]:
    """One Event for ``reason``, unless the status already shows it (``shown``, the
    status field that would hold ``new``, or ``reason`` itself): a step taken again posts
    nothing twice."""
    return () if shown == (reason if new is None else new) else (RunEvent(kind, reason, message),)
