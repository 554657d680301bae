"""Admission caps, with the operator as its own process on a real kube-apiserver without
a node (pods stay Pending, as on a full cluster): a namespace capped at two runs gets two
pods, the rest queue in order of priority then age and start as places free, and a run
holding a place that loses its pod is replaced without queueing.

The cap here is the Namespace's own annotation (``alpineagents.dev/max-running``) over
the chart's ``admission.maxRunningPerNamespace``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from alpineagents_operator.kube.admission import ANNOTATION
from tests.bench.control_plane import ControlPlane
from tests.bench.operator_process import (
    Event,
    EventLog,
    OperatorProcess,
    agentrun,
    operator_in_namespace,
    pod_added,
    run_label,
)


def queued_as(name: str, place: int) -> Any:
    def matches(event: Event) -> bool:
        status = event.object.get("status") or {}
        return (
            event.object["metadata"]["name"] == name
            and status.get("phase") == "Queued"
            and status.get("queuePlace") == place
        )

    return matches


@pytest.fixture
def capped(
    control_plane: ControlPlane, tmp_path: Path
) -> Iterator[tuple[ControlPlane, str, OperatorProcess]]:
    with operator_in_namespace(control_plane, tmp_path, "caps") as (namespace, _, operator):
        control_plane.kubectl("annotate", "namespace", namespace, f"{ANNOTATION}=2")
        operator.env["ALPINEAGENTS_MAX_RUNNING_PER_NAMESPACE"] = "10"
        operator.env["ALPINEAGENTS_NAMESPACE_CAPS"] = "true"
        yield control_plane, namespace, operator


def test_a_capped_namespace_queues_by_priority_then_age_and_admits_as_places_free(
    capped: tuple[ControlPlane, str, OperatorProcess],
) -> None:
    plane, namespace, operator = capped
    client = plane.api_client()
    with (
        EventLog(client, namespace, "pods") as pods,
        EventLog(client, namespace, "agentruns") as runs,
    ):
        operator.start()
        first = [json.loads(agentrun(namespace, name)) for name in ("first", "second")]
        plane.kubectl("create", "-f", "-", input=yaml.safe_dump_all(first))
        for name in ("first", "second"):
            pods.wait_for(pod_added(name))
        # Three more, oldest first; the youngest is urgent: first in line as it joins.
        for name, priority, place in (("old", 0, 1), ("young", 0, 2), ("urgent", 5, 1)):
            plane.kubectl("create", "-f", "-", input=agentrun(namespace, name, priority=priority))
            runs.wait_for(queued_as(name, place))
        queued = {
            item["metadata"]["name"]: item["status"]
            for item in json.loads(
                plane.kubectl("get", "agentruns", "-n", namespace, "-o", "json").stdout
            )["items"]
            if item["status"].get("phase") == "Queued"
        }
        assert set(queued) == {"old", "young", "urgent"}, queued
        old = queued["old"]
        assert old["reason"] == "NamespaceCap" and old["message"].startswith(
            f"queued: 1st in line for namespace {namespace}'s 2 places "
            "(its annotation alpineagents.dev/max-running), 2 in use"
        ), old
        admitted = {c["type"]: c for c in old["conditions"]}["Admitted"]
        assert admitted["status"] == "False" and admitted["reason"] == "NamespaceCap"

        # A run that ends gives its place up: the urgent one, youngest but first in line.
        plane.kubectl("delete", "agentrun", "first", "-n", namespace)
        pods.wait_for(pod_added("urgent"))
        # A run holding a place that loses its pod is replaced without queueing.
        plane.kubectl("delete", "pod", "second-1", "-n", namespace)
        pods.wait_for(lambda e: e.type == "ADDED" and e.object["metadata"]["name"] == "second-2")
        plane.kubectl("delete", "agentrun", "urgent", "-n", namespace)
        pods.wait_for(pod_added("old"))

        # Never more than two runs with a live pod at once.
        live: set[str] = set()
        most = 0
        for event in list(pods.events):
            run = run_label(event)
            if event.type == "DELETED" or event.object["metadata"].get("deletionTimestamp"):
                live.discard(run)
            else:
                live.add(run)
            most = max(most, len(live))
        assert most == 2, [(e.type, run_label(e)) for e in pods.events]
        assert not [e for e in pods.events if run_label(e) == "young"]
    reasons = json.loads(
        plane.kubectl(
            "get",
            "events",
            "-n",
            namespace,
            "--field-selector=involvedObject.name=old",
            "-o",
            "json",
        ).stdout
    )["items"]
    assert {"Queued", "Admitted"} <= {e["reason"] for e in reasons}
