"""``spec.forkFrom`` with the operator as its own process on a real kube-apiserver
without a node: before the fork's first pod the operator copies the source run's first
entries into the fork's State (a FileStore here), the source unchanged, and the status
says what the fork inherited; a fork the source cannot give says why, with no pod."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from alpineagents import FileStore, ForkPoint
from alpineagents.pod_contract import state_id_for
from alpineagents.testing.conformance import a_run
from tests.bench.control_plane import ControlPlane
from tests.bench.operator_process import (
    Event,
    EventLog,
    OperatorProcess,
    operator_in_namespace,
    pod_added,
)


def manifest(namespace: str, name: str, **spec: Any) -> str:
    return json.dumps(
        {
            "apiVersion": "alpineagents.dev/v1",
            "kind": "AgentRun",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"model": "claude-sonnet-5", **spec},
        }
    )


def with_reason(name: str, *reasons: str) -> Any:
    def matches(event: Event) -> bool:
        status = event.object.get("status") or {}
        return event.object["metadata"]["name"] == name and status.get("reason") in reasons

    return matches


@pytest.fixture
def operator(
    control_plane: ControlPlane, tmp_path: Path
) -> Iterator[tuple[ControlPlane, str, FileStore, OperatorProcess]]:
    with operator_in_namespace(control_plane, tmp_path, "fork") as (namespace, folder, process):
        yield control_plane, namespace, FileStore(folder), process


def test_a_fork_starts_from_its_sources_entries_and_says_what_it_inherited(
    operator: tuple[ControlPlane, str, FileStore, OperatorProcess],
) -> None:
    plane, namespace, store, process = operator
    client = plane.api_client()
    with (
        EventLog(client, namespace, "pods") as pods,
        EventLog(client, namespace, "agentruns") as runs,
    ):
        process.start()
        plane.kubectl("create", "-f", "-", input=manifest(namespace, "source", prompt="Go."))
        pods.wait_for(pod_added("source"))
        uid = json.loads(
            plane.kubectl("get", "agentrun", "source", "-n", namespace, "-o", "json").stdout
        )["metadata"]["uid"]
        # What the source's pod would have saved: a run with every kind of entry.
        source_id = state_id_for(namespace, "source", uid)
        saved = a_run(source_id)
        store.delete(source_id)
        store.save(saved)
        before = store.read(source_id)

        plane.kubectl(
            "create",
            "-f",
            "-",
            input=manifest(namespace, "retry", forkFrom={"run": "source", "entry": 2}),
        )
        pods.wait_for(pod_added("retry"))
        plane.kubectl(
            "create",
            "-f",
            "-",
            input=manifest(namespace, "far", forkFrom={"run": "source", "entry": 99}),
        )
        plane.kubectl(
            "create",
            "-f",
            "-",
            input=manifest(namespace, "orphan", forkFrom={"run": "nobody", "entry": 0}),
        )
        far = runs.wait_for(with_reason("far", "ForkInvalid")).object["status"]
        orphan = runs.wait_for(with_reason("orphan", "ForkSourceMissing")).object["status"]

    retry = json.loads(
        plane.kubectl("get", "agentrun", "retry", "-n", namespace, "-o", "json").stdout
    )
    inherited = retry["status"]["forkedFrom"]
    assert inherited == {
        "run": "source",
        "entry": 2,
        "stateId": source_id,
        "turns": 1,
        "usage": {
            "inputTokens": 10,
            "outputTokens": 5,
            "cacheCreationInputTokens": 0,
            "cacheReadInputTokens": 0,
        },
        "costUSD": "0.0100",
    }
    fork = store.load(retry["status"]["stateId"])
    assert fork.forked_from == ForkPoint(source_id, 2)
    assert [e.kind for e in fork.history] == [
        "message",
        "model_request",
        "model_reply",
        "tool_result",
    ]
    assert fork.history[-1].outcome == "aborted"  # in flight at entry 2: never run again
    assert store.read(source_id) == before
    assert far["phase"] == "Failed" and "it has entries 0 to 7" in far["message"], far
    assert "no AgentRun 'nobody' in namespace" in orphan["message"], orphan
    assert not [
        e for e in pods.events if e.object["metadata"]["name"].startswith(("far", "orphan"))
    ]
