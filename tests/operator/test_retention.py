"""Retention with the operator as its own process on a real kube-apiserver: finished
AgentRuns are deleted ``ttlSecondsAfterFinished`` after their end (their own, or the
operator's default), and their saved State goes as ``spec.onDelete`` says; a run whose
TTL has not passed, or that has not ended, stays.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from alpineagents import FileStore, Message, State
from alpineagents.pod_contract import state_id_for
from tests.bench.control_plane import ControlPlane
from tests.bench.operator_process import (
    Event,
    EventLog,
    OperatorProcess,
    agentrun,
    operator_in_namespace,
    pod_added,
)


@pytest.fixture
def retaining(
    control_plane: ControlPlane, tmp_path: Path
) -> Iterator[tuple[ControlPlane, str, FileStore, OperatorProcess]]:
    with operator_in_namespace(control_plane, tmp_path, "ttl") as (namespace, folder, operator):
        operator.env["ALPINEAGENTS_TTL_SECONDS_AFTER_FINISHED"] = "1"
        yield control_plane, namespace, FileStore(folder), operator


def deleted(name: str) -> Callable[[Event], bool]:
    return lambda event: event.type == "DELETED" and event.name == name


def with_finalizer(name: str) -> Callable[[Event], bool]:
    def matches(event: Event) -> bool:
        return event.name == name and bool(event.object["metadata"].get("finalizers"))

    return matches


def test_finished_runs_go_after_their_ttl_and_their_state_as_on_delete_says(
    retaining: tuple[ControlPlane, str, FileStore, OperatorProcess],
) -> None:
    plane, namespace, store, operator = retaining
    client = plane.api_client()
    runs_spec = {
        "with-state": {"onDelete": "Delete", "ttlSecondsAfterFinished": 0},
        "state-kept": {},  # the operator's default TTL (1 s), onDelete Keep
        "later": {"ttlSecondsAfterFinished": 3600},
        "running": {"ttlSecondsAfterFinished": 0},
    }
    with (
        EventLog(client, namespace, "pods") as pods,
        EventLog(client, namespace, "agentruns") as runs,
    ):
        operator.start()
        ids = {}
        for name, spec in runs_spec.items():
            plane.kubectl("create", "-f", "-", input=agentrun(namespace, name, **spec))
            pods.wait_for(pod_added(name))
            uid = json.loads(
                plane.kubectl("get", "agentrun", name, "-n", namespace, "-o", "json").stdout
            )["metadata"]["uid"]
            ids[name] = state_id_for(namespace, name, uid)
            store.save(State(ids[name], [Message.user(f"job {name}")]))  # what its pod saved
        runs.wait_for(with_finalizer("with-state"))  # onDelete: Delete's, put by the operator
        ended = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        for name in ("with-state", "state-kept", "later"):
            status = {"phase": "Succeeded", "reason": "Answered", "completedAt": ended}
            plane.kubectl(
                "patch", "agentrun", name, "-n", namespace, "--subresource=status",
                "--type=merge", "-p", json.dumps({"status": status}),
            )  # fmt: skip
        runs.wait_for(deleted("with-state"))
        runs.wait_for(deleted("state-kept"))

    left = json.loads(plane.kubectl("get", "agentruns", "-n", namespace, "-o", "json").stdout)
    assert sorted(item["metadata"]["name"] for item in left["items"]) == ["later", "running"]
    assert store.read(ids["with-state"]) is None  # onDelete: Delete
    assert store.read(ids["state-kept"]) is not None  # onDelete: Keep (the default)
    assert store.read(ids["later"]) is not None
    assert "deleted 0 s after it finished (its saved State too)" in operator.log_text()
