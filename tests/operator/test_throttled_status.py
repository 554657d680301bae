"""A run that waits for its turn at the shared limiter says so in its status: the
``Throttled`` condition and ``status.throttled``, set from the limiter's line (the real
limiter service on loopback) on a real kube-apiserver; cleared once it stops waiting."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml

from alpineagents.pacing.limiter import KeyLimits, Limiter
from alpineagents_operator.deciding.run_status import conditions_for
from alpineagents_operator.kube.cluster import Cluster
from alpineagents_operator.kube.views import AgentRunView, Phase
from alpineagents_operator.reconciling.throttling import (
    CLEAR_AFTER,
    ThrottleWatch,
    throttled_changes,
)
from alpineagents_operator.watching.watched import Watched
from tests.bench.control_plane import ControlPlane
from tests.bench.pacer import FakeClock, Service

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def _run(phase: str, throttled: Any = None, name: str = "triage") -> AgentRunView:
    status: dict[str, Any] = {"phase": phase, "stateId": f"agents.{name}.00000000"}
    if throttled is not None:
        status["throttled"] = throttled
    body = {
        "metadata": {"namespace": "agents", "name": name, "uid": "0" * 36, "generation": 1},
        "spec": {"model": "claude-sonnet-5", "prompt": "hi"},
        "status": status,
    }
    return AgentRunView.from_body(body)


def test_a_waiting_run_is_throttled_at_once_and_no_longer_only_after_looks_without_it() -> None:
    absent: dict[tuple[str, str], int] = {}
    line = {"agents.triage.00000000": {"limit": "requests", "waited": 12.0, "position": 3}}
    (change,) = throttled_changes([_run("Running")], line, absent, NOW).values()
    assert change == {"limit": "requests", "since": "2026-12-06T11:59:48.000Z", "position": 3}
    throttled = _run("Running", change)
    assert throttled_changes([throttled], line, absent, NOW) == {}  # still waiting: no patch
    for _ in range(CLEAR_AFTER - 1):  # between two waits of a busy key: still throttled
        assert throttled_changes([throttled], {}, absent, NOW) == {}
    assert throttled_changes([throttled], {}, absent, NOW) == {("agents", "triage"): None}
    # A run that ended is cleared at once, whatever the line says.
    assert throttled_changes([_run("Succeeded", change)], line, {}, NOW) == {
        ("agents", "triage"): None
    }


def test_the_throttled_condition_appears_once_a_run_has_waited() -> None:
    never = conditions_for(Phase.RUNNING, None, None, 1, [], NOW)
    assert "Throttled" not in {c["type"] for c in never}
    waiting = {"limit": "input_tokens", "since": "2026-12-06T11:59:48.000Z", "position": 2}
    (condition,) = [
        c
        for c in conditions_for(Phase.RUNNING, None, None, 1, [], NOW, waiting)
        if c["type"] == "Throttled"
    ]
    assert (condition["status"], condition["reason"]) == ("True", "WaitingForTurn")
    assert "input_tokens limit since 2026-12-06T11:59:48.000Z, place 2" in condition["message"]
    after = conditions_for(Phase.RUNNING, None, None, 1, [condition], NOW, None)
    assert [c["status"] for c in after if c["type"] == "Throttled"] == ["False"]


@pytest.fixture
def limiter() -> Iterator[Service]:
    clock = FakeClock()  # never moves: whoever asks waits
    service = Service(
        Limiter(KeyLimits(requests_per_minute=60), headroom=1, clock=clock), poll_seconds=0.2
    )
    yield service
    service.close()


def test_a_run_waiting_at_the_limiter_gets_the_throttled_condition_on_the_api_server(
    control_plane: ControlPlane, limiter: Service
) -> None:
    control_plane.apply_crds()
    name = f"throttled-{uuid.uuid4().hex[:8]}"
    body = {
        "apiVersion": "alpineagents.dev/v1",
        "kind": "AgentRun",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"model": "claude-sonnet-5", "prompt": "hi"},
    }
    created = json.loads(
        control_plane.kubectl("create", "-f", "-", "-o", "json", input=yaml.safe_dump(body)).stdout
    )
    cluster = Cluster(control_plane.api_client())
    try:
        run = AgentRunView.from_body(created)
        running = cluster.patch_status(
            "default", name, {"phase": "Running", "stateId": run.state_id}
        )
        assert running is not None
        watched = Watched()
        watched.run_seen(AgentRunView.from_body(running), gone=False)
        # The run's pod asks the limiter for a turn and waits (the limiter's clock stands still).
        ask = {
            "key": "k",
            "run": run.state_id,
            "namespace": "default",
            "need": {"requests": 1},
            "wait": 0.2,
        }
        _post(limiter.url + "/v1/turns", ask)

        asyncio.run(ThrottleWatch(limiter.url, cluster, watched).look())
        status = _status(control_plane, name)
        assert status["throttled"]["limit"] == "requests"
        assert status["throttled"]["position"] == 1
        (condition,) = [c for c in status["conditions"] if c["type"] == "Throttled"]
        assert (condition["status"], condition["reason"]) == ("True", "WaitingForTurn")
        columns = control_plane.kubectl("get", "agentrun", name, "-o", "wide").stdout
        assert "THROTTLED" in columns and status["throttled"]["since"][:10] in columns
    finally:
        control_plane.kubectl("delete", "agentrun", name, "--wait=false")
        cluster.close()


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    import urllib.request

    request = urllib.request.Request(url, json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=10) as answer:
        result: dict[str, Any] = json.loads(answer.read())
    return result


def _status(plane: ControlPlane, name: str) -> dict[str, Any]:
    got = json.loads(plane.kubectl("get", "agentrun", name, "-o", "json").stdout)
    status: dict[str, Any] = got["status"]
    return status
