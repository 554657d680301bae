"""The move for a run's current pod that has finished, by how it ended.

:data:`BY_OUTCOME` is the second table of :mod:`.decide`: one move per
:class:`~.pod_outcomes.PodOutcome` kind (what :func:`~.pod_outcomes.outcome_of` read from
the exit code, termination message and pod status). Every move first takes the facts the
pod reported (its runner, last saved entry, turns, usage, cost, aborted calls).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from alpineagents_operator.deciding.moves import (
    STORE_RETRY_SECONDS,
    fail,
    succeed,
    suspend_now,
    wait_for_approval,
)
from alpineagents_operator.deciding.pod_losses import lost
from alpineagents_operator.deciding.pod_outcomes import PodOutcome, outcome_of
from alpineagents_operator.deciding.run_status import cost_text, usage_status
from alpineagents_operator.deciding.step import Decision, Step
from alpineagents_operator.kube.views import JSON, PodView

Exit = Callable[[Step, PodView, PodOutcome, JSON], Decision]
"""A move for a finished pod: the step, the pod, how it ended, the facts it reported."""


def finished(step: Step, pod: PodView) -> Decision:
    """The move for ``pod``, finished, by how it ended (:data:`BY_OUTCOME`)."""
    outcome = outcome_of(pod)
    move = BY_OUTCOME.get(outcome.kind, _lost)
    return move(step, pod, outcome, _reported(step, pod))


def _reported(step: Step, pod: PodView) -> JSON:
    """The status fields the pod's image and termination message say."""
    report = pod.exit.report if pod.exit else None
    facts: JSON = {}
    if pod.image:
        facts["runnerImage"] = pod.image
    if report is None:
        return facts
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
        facts["abortedCalls"] = step.aborted_with(report.aborted)
    return facts


def _ended(step: Step, pod: PodView, outcome: PodOutcome, facts: JSON) -> Decision:
    """Answered (exit 0) or stopped at max turns (exit 77): Succeeded or Failed, with
    the saved State's facts after more than one pod."""
    report = pod.exit.report if pod.exit else None
    answer = report.answer if report else None
    # After more than one pod, only the history knows every call an earlier pod left
    # aborted (a store outage may have hidden them from every step so far).
    wanted = step.status.attempt > 1 or (outcome.kind == "answered" and answer is None)
    if wanted and step.saved is None:
        return Decision(needs_saved=True, note="finished: reading the saved State")
    unread = wanted and step.saved is not None and step.saved.error is not None
    if wanted and not unread:
        facts.update(step.saved_facts())
        if answer is None and step.saved is not None:
            answer = step.saved.answer
    if unread:
        facts["savedStateUnread"] = True
    if outcome.kind == "answered":
        decision = succeed(step, answer, facts, f"answered (pod {pod.name})")
    else:
        decision = fail(step, "MaxTurns", outcome.message, facts)
    return replace(decision, requeue_after=STORE_RETRY_SECONDS) if unread else decision


def _not_retryable(step: Step, pod: PodView, outcome: PodOutcome, facts: JSON) -> Decision:
    return fail(step, "NotRetryable", outcome.message, facts)


def _budget_exceeded(step: Step, pod: PodView, outcome: PodOutcome, facts: JSON) -> Decision:
    return fail(step, "BudgetExceeded", outcome.message, facts)


def _waiting(step: Step, pod: PodView, outcome: PodOutcome, facts: JSON) -> Decision:
    """Exit 76: the calls waiting, from the termination message (or the saved State)."""
    report = pod.exit.report if pod.exit else None
    pending = report.pending_approvals if report else ()
    if not pending:
        if step.saved is None:
            return Decision(needs_saved=True, note="waiting: reading pending calls")
        pending = step.saved.pending_approvals
        facts.update(step.saved_facts())
    return wait_for_approval(step, pending, facts)


def _lost(step: Step, pod: PodView, outcome: PodOutcome, facts: JSON) -> Decision:
    """Any other end: suspended if spec.suspend asks, else lost* (a restart, or a
    disruption when the cluster stopped it)."""
    if step.run.suspend:
        return suspend_now(step, None)
    return lost(
        step, pod.name, outcome.reason, outcome.message, facts, by_cluster=outcome.by_cluster
    )


BY_OUTCOME: Mapping[str, Exit] = {
    "answered": _ended,
    "not_retryable": _not_retryable,
    "waiting": _waiting,
    "max_turns": _ended,
    "budget_exceeded": _budget_exceeded,
    "lost": _lost,
}
"""The move for each kind of :class:`~.pod_outcomes.PodOutcome`."""

FINAL_OUTCOMES = frozenset({"answered", "not_retryable", "max_turns", "budget_exceeded"})
"""Outcomes that end the run even when it was being suspended (waiting for approval does
not: the saved State reports it again on resume)."""
