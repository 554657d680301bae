"""The AgentSchedule CRD against a real kube-apiserver: CronJob's defaults, refusals that
say what is wrong, and the printer columns of ``kubectl get agentschedules``."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from tests.bench.control_plane import ControlPlane


@pytest.fixture(scope="module")
def plane(control_plane: ControlPlane) -> ControlPlane:
    assert "agentschedules.alpineagents.dev" in control_plane.apply_crds()
    return control_plane


def manifest(name: str = "", **spec: Any) -> str:
    body = {
        "apiVersion": "alpineagents.dev/v1",
        "kind": "AgentSchedule",
        "metadata": {"name": name or f"sch-{uuid.uuid4().hex[:8]}", "namespace": "default"},
        "spec": {
            "schedule": "*/5 * * * *",
            "runTemplate": {"spec": {"model": "claude-sonnet-5", "prompt": "hi"}},
            **spec,
        },
    }
    return json.dumps(body)


def refusal(plane: ControlPlane, name: str = "", **spec: Any) -> str:
    result = plane.kubectl(
        "create", "--dry-run=server", "-f", "-", input=manifest(name, **spec), check=False
    )
    assert result.returncode != 0, f"accepted: {spec}"
    return str(result.stderr)


def test_cronjobs_defaults(plane: ControlPlane) -> None:
    created = json.loads(
        plane.kubectl(
            "create", "--dry-run=server", "-o", "json", "-f", "-", input=manifest()
        ).stdout
    )
    spec = created["spec"]
    assert spec["concurrencyPolicy"] == "Allow" and spec["suspend"] is False
    assert (spec["successfulRunsHistoryLimit"], spec["failedRunsHistoryLimit"]) == (3, 1)


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ({"concurrencyPolicy": "Sometimes"}, 'supported values: "Allow", "Forbid", "Replace"'),
        ({"startingDeadlineSeconds": -1}, "should be greater than or equal to 0"),
        ({"successfulRunsHistoryLimit": -1}, "should be greater than or equal to 0"),
        ({"runTemplate": {"spec": {"prompt": "no model"}}}, "spec.runTemplate.spec.model"),
        ({"schedule": ""}, "spec.schedule"),
    ],
)
def test_bad_fields_are_refused_naming_them(
    plane: ControlPlane, spec: dict[str, Any], says: str
) -> None:
    assert says in refusal(plane, **spec)


def test_a_name_too_long_for_its_runs_is_refused_naming_the_limit(plane: ControlPlane) -> None:
    assert "at most 54 characters" in refusal(plane, "s" * 55)


def test_printer_columns(plane: ControlPlane) -> None:
    name = f"cols-{uuid.uuid4().hex[:6]}"
    plane.kubectl("create", "-f", "-", input=manifest(name))
    try:
        status = {
            "status": {
                "lastScheduleTime": "2026-03-01T12:00:00Z",
                "active": [{"name": "nightly-29536320", "namespace": "default", "uid": "u"}],
            }
        }
        plane.kubectl(
            "patch", "agentschedule", name, "-n", "default", "--subresource=status",
            "--type=merge", "-p", json.dumps(status),
        )  # fmt: skip
        header, row = plane.kubectl("get", "as", name, "-n", "default").stdout.splitlines()[:2]
        assert header.split() == [
            "NAME",
            "SCHEDULE",
            "SUSPEND",
            "ACTIVE",
            "LAST",
            "SCHEDULE",
            "AGE",
        ]
        assert row.split()[:6] == [name, "*/5", "*", "*", "*", "*"]
        assert "false" in row and "nightly-29536320" in row
    finally:
        plane.kubectl("delete", "agentschedule", name, "-n", "default", "--wait=false")
