"""The daily spend cap's decisions, without Kubernetes: what a namespace spent today
(from its runs' ``status.dailySpend``), what the cap says of a run, and the step each
run then takes (:func:`decide` with that verdict)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from alpineagents_operator.deciding.decide import decide
from alpineagents_operator.kube.daily_spend import (
    SPEND_REASON,
    DailySpend,
    SpendCap,
    parse_spend_cap,
    spend_mark,
    spend_verdict,
    spent_on,
)
from alpineagents_operator.kube.views import AgentRunView, format_time
from alpineagents_operator.reconciling.retention import expires_at
from tests.operator.test_decide import MID_RUN, NOW, exited, pod, report, run

TODAY = NOW.date().isoformat()
CAP = SpendCap(0.05, "its annotation alpineagents.dev/daily-spend-usd")


def spent_run(
    name: str,
    cost: str,
    day: str = TODAY,
    start: str = "0.0000",
    spec_ttl: int | None = None,
    **status: Any,
) -> AgentRunView:
    """A run of namespace ``team`` whose count for ``day`` began at ``start``."""
    spec: dict[str, Any] = {"prompt": "hi"}
    if spec_ttl is not None:
        spec["ttlSecondsAfterFinished"] = spec_ttl
    return AgentRunView.from_body(
        {
            "metadata": {"name": name, "namespace": "team", "uid": f"uid-{name}"},
            "spec": spec,
            "status": {
                "phase": "Succeeded",
                "costUSD": cost,
                "dailySpend": {"day": day, "fromUSD": start},
                **status,
            },
        }
    )


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> datetime:
        return self.now


# ------------------------------------------------------------------ the cap's value
@pytest.mark.parametrize(
    ("value", "cap"),
    [("25", 25.0), ("12.50", 12.5), ("$5", 5.0), ("0", 0.0), (None, None), ("", None)],
)
def test_a_cap_is_dollars_zero_or_more(value: object, cap: float | None) -> None:
    assert parse_spend_cap(value, "here") == cap


@pytest.mark.parametrize("value", ["lots", "-1", "nan", "inf", "5 USD"])
def test_a_bad_cap_is_refused_naming_where_it_came_from(value: str) -> None:
    where = "annotation alpineagents.dev/daily-spend-usd of Namespace team"
    with pytest.raises(ValueError, match=f"^{where} must be a number of US dollars"):
        parse_spend_cap(value, where)


# ------------------------------------------------------------------ what a run spent today
def test_the_days_count_begins_at_the_cost_before_its_first_change_that_day() -> None:
    yesterday = (NOW - timedelta(days=1)).date().isoformat()
    status = {"costUSD": "0.0300", "dailySpend": {"day": yesterday, "fromUSD": "0.0100"}}
    mark = spend_mark(status, {"costUSD": "0.0450"}, TODAY)
    assert mark == {"day": TODAY, "fromUSD": "0.0300"}
    assert spent_on({"costUSD": "0.0450", "dailySpend": mark}, TODAY) == pytest.approx(0.015)
    # Later the same day: the count goes on from the same start.
    assert spend_mark({"costUSD": "0.0450", "dailySpend": mark}, {"costUSD": "0.05"}, TODAY) is None
    # A patch that leaves the cost alone begins nothing.
    assert spend_mark(status, {"phase": "Running"}, TODAY) is None
    # Yesterday's count is not today's spend.
    assert spent_on(status, TODAY) == 0.0


def test_a_first_cost_counts_from_zero_and_a_forks_inherited_cost_is_not_spent() -> None:
    assert spend_mark({}, {"costUSD": "0.0100"}, TODAY) == {"day": TODAY, "fromUSD": "0.0000"}
    fork = {"forkedFrom": {"run": "source", "costUSD": "0.2000"}}
    mark = spend_mark(fork, {"costUSD": "0.2100"}, TODAY)
    assert mark == {"day": TODAY, "fromUSD": "0.2000"}
    assert spent_on({"costUSD": "0.2100", "dailySpend": mark}, TODAY) == pytest.approx(0.01)


def test_a_runs_end_writes_its_cost_and_the_days_count_in_one_patch() -> None:
    ended = decide(
        run("Running", attempt=1, startedAt="x"),
        [exited(1, 0, message=report("answered", answer="done", costUSD=0.01))],
        None,
        NOW,
    )
    assert ended.status["costUSD"] == "0.0100"
    assert ended.status["dailySpend"] == {"day": TODAY, "fromUSD": "0.0000"}


# ------------------------------------------------------------------ a namespace's spend
def test_a_namespaces_spend_is_its_runs_increments_today_and_rolls_with_the_day() -> None:
    clock = Clock()
    spend = DailySpend(clock)
    yesterday = (NOW - timedelta(days=1)).date().isoformat()
    for name, cost, day, start in (
        ("a", "0.0100", TODAY, "0.0000"),
        ("b", "0.0300", TODAY, "0.0100"),  # 0.02 of it today
        ("c", "0.5000", yesterday, "0.0000"),  # spent yesterday
    ):
        spend.run_seen(spent_run(name, cost, day, start), gone=False)
    assert spend.spent("team") == pytest.approx(0.03)
    # The same run seen again is not counted twice; its new cost replaces the old.
    assert not spend.run_seen(spent_run("a", "0.0100"), gone=False)
    assert spend.run_seen(spent_run("a", "0.0200"), gone=False)
    assert spend.spent("team") == pytest.approx(0.04)
    # A run deleted today keeps what it spent counted.
    spend.run_seen(spent_run("b", "0.0300", start="0.0100"), gone=True)
    assert spend.spent("team") == pytest.approx(0.04)
    assert spend.figures() == {"team": pytest.approx(0.04)}
    # The next UTC day starts from nothing.
    clock.now = NOW.replace(hour=23, minute=59) + timedelta(minutes=2)
    assert spend.spent("team") == 0.0
    assert spend.day == (NOW + timedelta(days=1)).date().isoformat()


# ------------------------------------------------------------------ the verdict and the step
def test_under_the_cap_the_other_caps_judge() -> None:
    assert spend_verdict(run(), 0.0499, CAP, TODAY) is None
    assert spend_verdict(run(), 10.0, None, TODAY) is None


def test_at_the_cap_a_new_run_queues_naming_the_spend_cap() -> None:
    verdict = spend_verdict(run(), 0.05, CAP, TODAY)
    assert verdict is not None and not verdict.admitted and not verdict.withdrawn
    step = decide(run(), [], None, NOW, verdict)
    assert step.create_pod is None
    assert step.status["phase"] == "Queued"
    assert step.status["reason"] == SPEND_REASON != "NamespaceCap"
    assert step.status["message"].startswith(
        "daily spend cap: namespace agents spent $0.05 of its $0.05 on 2026-03-01 (UTC) "
        "(its annotation alpineagents.dev/daily-spend-usd)"
    )


def test_at_the_cap_a_running_run_stops_gracefully_and_queues_without_a_loss() -> None:
    running = run("Running", attempt=1, startedAt="x", admitted=True)
    verdict = spend_verdict(running, 0.06, CAP, TODAY)
    assert verdict is not None and verdict.withdrawn
    step = decide(running, [pod(1)], None, NOW, verdict)
    assert step.delete_pods == ("triage-1",)  # SIGTERM: it stops at its next step, saved
    assert step.status["phase"] == "Queued" and step.status["reason"] == SPEND_REASON
    assert step.status["admitted"] is None  # its place under the runs cap goes to the next
    assert "restarts" not in step.status and "disruptions" not in step.status
    assert step.lost_reason is None


def test_a_held_run_costs_no_store_read_until_the_cap_lets_it_go() -> None:
    held = run("Queued", attempt=1, reason=SPEND_REASON, message="daily spend cap: ...")
    verdict = spend_verdict(held, 0.05, CAP, TODAY)
    still = decide(held, [exited(1, 143)], None, NOW, verdict)
    assert not still.acts and not still.needs_saved
    # The cap raised (or the day rolled): it resumes from its saved State.
    resumed = decide(held, [exited(1, 143)], None, NOW, None)
    assert resumed.needs_saved
    resumed = decide(held, [exited(1, 143)], MID_RUN, NOW, None)
    assert resumed.create_pod == 2 and resumed.claim_state
    assert resumed.status["phase"] == "Pending" and resumed.status["lastSavedSeq"] == 5
    assert [e.reason for e in resumed.events] == ["Resumed"]
    assert "restarts" not in resumed.status


def test_the_cap_holds_a_lost_pods_replacement_too() -> None:
    interrupted = run("Interrupted", attempt=1, admitted=True, nextAttemptAt="2020-01-01T00:00:00Z")
    verdict = spend_verdict(interrupted, 0.05, CAP, TODAY)
    step = decide(interrupted, [exited(1, 137)], MID_RUN, NOW, verdict)
    assert step.create_pod is None
    assert step.status["phase"] == "Queued" and step.status["admitted"] is None


def test_under_a_spend_cap_a_finished_run_is_kept_until_its_spend_day_ends() -> None:
    def finished(ttl: int) -> AgentRunView:
        return spent_run("ended", "0.0100", completedAt=format_time(NOW), spec_ttl=ttl)

    midnight = datetime(2026, 3, 2, tzinfo=UTC)
    # Its status holds its part of today's spend: deleted before midnight, a restarted
    # operator would not know it.
    assert expires_at(finished(60), None, spend_cap=True) == midnight
    assert expires_at(finished(60), None) == NOW + timedelta(seconds=60)  # no cap: its TTL
    assert expires_at(finished(2 * 86400), None, spend_cap=True) == NOW + timedelta(days=2)
