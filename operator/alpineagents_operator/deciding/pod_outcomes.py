"""How a run's pod ended, read from its exit code, termination message and status.

:func:`outcome_of` is the one place that reads a finished pod: the runner's exit code
(the runner-operator contract, :class:`~alpineagents.pod_contract.ExitCode`) first, then
what Kubernetes says of a pod lost without a readable exit (evicted, OOM-killed, its node
gone, deleted).
"""

from __future__ import annotations

from dataclasses import dataclass

from alpineagents.pod_contract import ExitCode
from alpineagents_operator.kube.views import PodView

__all__ = ["PodOutcome", "outcome_of"]


@dataclass(frozen=True)
class PodOutcome:
    """How a finished pod ended, in reconcile terms."""

    kind: str
    """answered | not_retryable | waiting | max_turns | budget_exceeded | lost"""
    reason: str
    message: str
    by_cluster: bool = False
    """A lost pod the cluster stopped (deleted, drained, evicted, its node gone): it did
    not fail, so its replacement waits no backoff."""


def outcome_of(pod: PodView) -> PodOutcome:
    """How ``pod`` ended (it has finished, or is gone), in reconcile terms."""
    exit_info = pod.exit
    if exit_info is not None:
        code, report = exit_info.code, exit_info.report
        error = (report.error if report else None) or _tail(exit_info.message)
        if code == ExitCode.ANSWERED and pod.reason != "Evicted":
            return PodOutcome("answered", "Answered", "")
        if code == ExitCode.NOT_RETRYABLE:
            return PodOutcome(
                "not_retryable", "NotRetryable", error or "the runner refused the run (exit 65)"
            )
        if code == ExitCode.WAITING_FOR_APPROVAL:
            return PodOutcome("waiting", "ApprovalRequired", "")
        if code == ExitCode.MAX_TURNS:
            return PodOutcome(
                "max_turns",
                "MaxTurns",
                "stopped at the turn limit (spec.maxTurns) without an answer",
            )
        if code == ExitCode.BUDGET_EXCEEDED:
            return PodOutcome(
                "budget_exceeded",
                "BudgetExceeded",
                error or "stopped at the budget (spec.budget); raise it to go on",
            )
    name = pod.name
    if exit_info is not None and exit_info.reason == "OOMKilled":
        return PodOutcome("lost", "OOMKilled", f"pod {name} was OOM-killed (exit {exit_info.code})")
    if pod.reason == "Evicted":
        return PodOutcome(
            "lost",
            "Evicted",
            f"pod {name} was evicted: {pod.message or 'no message'}",
            by_cluster=True,
        )
    if pod.disruption == "DeletionByPodGC" or pod.reason == "NodeLost":
        return PodOutcome("lost", "NodeLost", f"pod {name} was lost with its node", by_cluster=True)
    if pod.reason == "Terminated":  # graceful node shutdown
        return PodOutcome(
            "lost",
            "NodeShutdown",
            f"pod {name} was stopped by its node's shutdown",
            by_cluster=True,
        )
    if pod.disruption is not None and exit_info is None:
        return PodOutcome(
            "lost", pod.disruption, f"pod {name} was disrupted ({pod.disruption})", by_cluster=True
        )
    if exit_info is None:
        return PodOutcome(
            "lost", "PodFailed", f"pod {name} failed: {pod.message or pod.reason or 'unknown'}"
        )
    code, report = exit_info.code, exit_info.report
    if code == ExitCode.SIGTERM:
        return PodOutcome(
            "lost", "Terminated", f"pod {name} was stopped (SIGTERM, exit 143)", by_cluster=True
        )
    if code == ExitCode.RETRYABLE:
        error = (report.error if report else None) or _tail(exit_info.message) or "no message"
        return PodOutcome("lost", "RetryableError", f"pod {name} hit a retryable error: {error}")
    if code == ExitCode.KILLED:
        return PodOutcome("lost", "Killed", f"pod {name} was killed (SIGKILL, exit 137)")
    error = (report.error if report else None) or _tail(exit_info.message) or "no message"
    return PodOutcome("lost", "Error", f"pod {name} exited {code}: {error}")


def _tail(text: str, limit: int = 600) -> str:
    text = text.strip()
    return text if len(text) <= limit else "…" + text[-limit:]
