"""The admission ledger: caps per namespace and cluster, the line by priority then age,
places taken atomically and given back (``alpineagents_operator.kube.admission``)."""

from __future__ import annotations

from typing import Any, cast

import pytest
from prometheus_client import generate_latest

from alpineagents_operator.kube.admission import Admission, Caps, parse_cap
from alpineagents_operator.kube.cluster import Cluster
from alpineagents_operator.kube.config import OperatorConfig
from alpineagents_operator.kube.metrics import OperatorMetrics
from alpineagents_operator.kube.views import AgentRunView
from alpineagents_operator.reconciling.places import Places


def agent_run(
    name: str,
    namespace: str = "team-a",
    *,
    priority: int | None = None,
    created: str = "2026-12-07T10:00:00Z",
    **status: Any,
) -> AgentRunView:
    spec: dict[str, Any] = {"prompt": "Go."}
    if priority is not None:
        spec["priority"] = priority
    return AgentRunView.from_body(
        {
            "metadata": {"name": name, "namespace": namespace, "creationTimestamp": created},
            "spec": spec,
            "status": status,
        }
    )


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_namespace_cap_admits_that_many_and_queues_the_rest_with_their_place() -> None:
    ledger = Admission(Caps(max_running_per_namespace=2))
    assert ledger.admit(agent_run("a")).admitted
    assert ledger.admit(agent_run("b")).admitted
    third = ledger.admit(agent_run("c"))
    assert not third.admitted and third.reason == "NamespaceCap" and third.place == 1
    assert third.message == (
        "queued: 1st in line for namespace team-a's 2 places "
        "(admission.maxRunningPerNamespace), 2 in use"
    )
    # Another namespace has places of its own.
    assert ledger.admit(agent_run("a", "team-b")).admitted
    assert ledger.in_use() == {"team-a": 2, "team-b": 1}


def test_the_line_goes_by_priority_then_age_and_a_freed_place_goes_to_its_head() -> None:
    ledger = Admission(Caps(max_running_per_namespace=1))
    assert ledger.admit(agent_run("first")).admitted
    queued = [
        agent_run("old", created="2026-12-07T09:00:00Z", phase="Queued"),
        agent_run("young", created="2026-12-07T11:00:00Z", phase="Queued"),
        agent_run("urgent", created="2026-12-07T12:00:00Z", priority=10, phase="Queued"),
    ]
    for run in queued:
        ledger.run_seen(run, gone=False)
    assert ledger.queued() == {"team-a": 3}
    assert [ledger.admit(r).place for r in queued] == [2, 3, 1]

    ledger.release(("team-a", "first"))
    assert ledger.next_in_line() == [("team-a", "urgent")]
    # Only the head may take the one free place, whoever is stepped first.
    assert not ledger.admit(queued[0]).admitted
    assert ledger.admit(queued[2]).admitted
    assert ledger.queued() == {"team-a": 2}
    assert ledger.next_in_line() == []


def test_the_last_place_is_taken_once() -> None:
    ledger = Admission(Caps(max_running=1))
    first, second = agent_run("a"), agent_run("b", "team-b")
    assert [ledger.admit(first).admitted, ledger.admit(second).admitted] == [True, False]
    # Judging the holder again does not take a second place.
    assert ledger.admit(first).admitted and ledger.in_use() == {"team-a": 1}


def test_a_namespace_at_its_cap_holds_no_other_namespace_up_in_the_cluster_line() -> None:
    ledger = Admission(Caps(max_running=3, max_running_per_namespace=1))
    assert ledger.admit(agent_run("a1")).admitted
    for index in range(5):  # team-a's line, all older than team-b's run
        ledger.run_seen(
            agent_run(f"a{index + 2}", created="2026-12-07T09:00:00Z", phase="Queued"),
            gone=False,
        )
    late = agent_run("b1", "team-b", created="2026-12-07T12:00:00Z")
    assert ledger.admit(late).admitted


def test_a_cluster_cap_says_so() -> None:
    ledger = Admission(Caps(max_running=1))
    ledger.admit(agent_run("a"))
    verdict = ledger.admit(agent_run("b", "team-b"))
    assert verdict.reason == "ClusterCap"
    assert verdict.message == (
        "queued: 1st in line for the cluster's 1 places (admission.maxRunning), 1 in use"
    )


def test_the_namespace_annotation_overrides_the_chart_value() -> None:
    ledger = Admission(
        Caps(max_running_per_namespace=5), namespace_cap=lambda ns: 1 if ns == "small" else None
    )
    assert ledger.admit(agent_run("a", "small")).admitted
    verdict = ledger.admit(agent_run("b", "small"))
    assert "its annotation alpineagents.dev/max-running" in verdict.message
    assert all(ledger.admit(agent_run(f"r{i}", "big")).admitted for i in range(5))
    assert not ledger.admit(agent_run("r5", "big")).admitted


def test_places_held_are_learned_from_the_watch_and_given_back_when_runs_end() -> None:
    ledger = Admission(Caps(max_running_per_namespace=1))
    ledger.run_seen(agent_run("held", phase="Running", admitted=True), gone=False)
    assert not ledger.admit(agent_run("new")).admitted
    ledger.run_seen(agent_run("held", phase="Succeeded"), gone=False)
    assert ledger.admit(agent_run("new")).admitted
    # A deleted run keeps its place until the step that stops its pods gives it up.
    ledger.run_seen(agent_run("new", phase="Pending", admitted=True), gone=True)
    assert ledger.in_use() == {"team-a": 1}
    ledger.release(("team-a", "new"))
    assert ledger.in_use() == {}


def test_a_place_given_is_kept_while_the_watch_still_shows_the_run_before_it() -> None:
    clock = Clock()
    ledger = Admission(Caps(max_running_per_namespace=1), clock=clock)
    assert ledger.admit(agent_run("a")).admitted
    ledger.run_seen(agent_run("a", phase="Queued"), gone=False)  # an older event
    ledger.run_seen(agent_run("a", phase="WaitingForApproval"), gone=False)  # older still
    assert not ledger.admit(agent_run("b")).admitted
    # A place whose status never showed (the patch failed) is given back after a while.
    clock.now = 61.0
    assert ledger.admit(agent_run("b")).admitted


@pytest.mark.parametrize("value", ["-1", "two", "1.5", True])
def test_a_cap_that_is_not_a_whole_number_is_refused_by_name(value: object) -> None:
    with pytest.raises(ValueError, match=r"admission.maxRunning must be a whole number"):
        parse_cap(value, "admission.maxRunning")


def test_no_cap_is_none_and_zero_is_zero() -> None:
    assert parse_cap(None, "x") is None and parse_cap("", "x") is None
    assert parse_cap("0", "x") == 0 and parse_cap(7, "x") == 7


def test_the_metrics_count_places_in_use_and_runs_in_line_by_namespace() -> None:
    metrics = OperatorMetrics()
    places = Places(
        OperatorConfig(max_running_per_namespace=1),
        cast(Cluster, None),  # no namespace annotations: the cluster is never asked
        lambda *_: None,
        metrics,
    )
    places.run_seen(agent_run("a", phase="Running", admitted=True), gone=False)
    places.run_seen(agent_run("b", phase="Queued"), gone=False)
    places.run_seen(agent_run("c", "team-b", phase="Queued"), gone=False)
    page = generate_latest(metrics.registry).decode()
    assert 'alpineagents_admission_in_use{namespace="team-a"} 1.0' in page
    assert 'alpineagents_admission_queued{namespace="team-a"} 1.0' in page
    assert 'alpineagents_admission_queued{namespace="team-b"} 1.0' in page
