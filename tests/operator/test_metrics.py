"""The operator's fleet metrics: what a dashboard and the alert rules read, with bounded labels."""

from __future__ import annotations

from typing import Any

from alpineagents_operator.kube.metrics import OperatorMetrics

SPEC = {"model": "claude-sonnet-5"}


def status(phase: str, inputs: int, outputs: int, cost: str, **more: Any) -> dict[str, Any]:
    return {
        "phase": phase,
        "usage": {"inputTokens": inputs, "outputTokens": outputs, "cacheReadInputTokens": 7},
        "costUSD": cost,
        **more,
    }


def value(metrics: OperatorMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_tokens_and_cost_are_counted_as_a_runs_status_grows() -> None:
    metrics = OperatorMetrics()
    metrics.record_run("agents", "one", SPEC, status("Running", 100, 10, "0.5"))
    metrics.record_run("agents", "one", SPEC, status("Running", 300, 30, "1.25"))
    metrics.record_run("agents", "one", SPEC, status("Running", 300, 30, "1.25"))  # no change
    labels = {"namespace": "agents", "model": "claude-sonnet-5"}
    assert value(metrics, "alpineagents_tokens_total", **labels, type="input") == 300
    assert value(metrics, "alpineagents_tokens_total", **labels, type="output") == 30
    assert value(metrics, "alpineagents_tokens_total", **labels, type="cache_read") == 7
    assert value(metrics, "alpineagents_cost_usd_total", **labels) == 1.25


def test_a_run_finished_before_the_operator_started_is_not_counted_again() -> None:
    metrics = OperatorMetrics()
    metrics.record_run("agents", "old", SPEC, status("Succeeded", 5000, 500, "9.0"))
    labels = {"namespace": "agents", "model": "claude-sonnet-5"}
    assert value(metrics, "alpineagents_cost_usd_total", **labels) is None
    assert value(metrics, "alpineagents_tokens_total", **labels, type="input") is None


def test_approvals_waiting_restarts_and_time_in_phase_are_gauges_of_the_fleet() -> None:
    metrics = OperatorMetrics()
    waiting = [{"callId": "toolu_1", "name": "deploy"}, {"callId": "toolu_2", "name": "rm"}]
    metrics.record_phase("agents", "one", "WaitingForApproval")
    metrics.record_run(
        "agents", "one", SPEC, status("WaitingForApproval", 1, 1, "0", pendingApprovals=waiting)
    )
    metrics.record_run("agents", "two", SPEC, status("Interrupted", 1, 1, "0", restarts=4))
    metrics.record_run("agents", "done", SPEC, status("Failed", 1, 1, "0", restarts=9))
    assert value(metrics, "alpineagents_approvals_waiting", namespace="agents") == 2
    assert value(metrics, "alpineagents_approval_oldest_wait_seconds", namespace="agents") >= 0
    # A finished run's restarts no longer count: it is not looping any more.
    assert value(metrics, "alpineagents_run_restarts_max", namespace="agents") == 4
    assert value(metrics, "alpineagents_run_phase_oldest_seconds", phase="Interrupted") >= 0
    metrics.record_phase("agents", "one", None)  # the AgentRun is gone
    assert value(metrics, "alpineagents_approvals_waiting", namespace="agents") == 0


def test_loss_reasons_are_a_bounded_set_and_loss_to_resume_is_observed() -> None:
    metrics = OperatorMetrics()
    metrics.record_loss("Evicted", ("agents", "one"))
    metrics.record_loss("SomethingNew-1234", ("agents", "two"))
    metrics.record_replaced(("agents", "one"))
    metrics.record_replaced(("agents", "one"))  # observed once per loss
    assert value(metrics, "alpineagents_pod_restarts_total", reason="Evicted") == 1
    assert value(metrics, "alpineagents_pod_restarts_total", reason="Other") == 1
    assert value(metrics, "alpineagents_loss_to_resume_seconds_count") == 1


def test_store_errors_are_counted_by_operation() -> None:
    metrics = OperatorMetrics()
    assert value(metrics, "alpineagents_store_errors_total", operation="claim") == 0
    metrics.record_store_error("read")
    assert value(metrics, "alpineagents_store_errors_total", operation="read") == 1
