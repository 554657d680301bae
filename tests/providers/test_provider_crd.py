"""spec.provider in the AgentRun CRD, against a real kube-apiserver: each provider's
manifest is accepted (the type defaulted), one that cannot work is refused saying why."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
import yaml

from tests.bench.control_plane import ControlPlane

SECRET = {"secretKeyRef": {"name": "s", "key": "k"}}


@pytest.fixture(scope="module")
def plane(control_plane: ControlPlane) -> ControlPlane:
    assert "agentruns.alpineagents.dev" in control_plane.apply_crds()
    return control_plane


def create(plane: ControlPlane, provider: dict[str, Any]) -> tuple[int, str]:
    body = {
        "apiVersion": "alpineagents.dev/v1",
        "kind": "AgentRun",
        "metadata": {"name": f"p-{uuid.uuid4().hex[:8]}", "namespace": "default"},
        "spec": {"model": "m", "prompt": "hi", "provider": provider},
    }
    result = plane.kubectl(
        "create",
        "--dry-run=server",
        "-f",
        "-",
        "-o",
        "json",
        input=yaml.safe_dump(body),
        check=False,
    )
    return result.returncode, result.stdout if result.returncode == 0 else result.stderr


@pytest.mark.parametrize(
    "provider",
    [
        {"type": "bedrock", "region": "us-east-1"},
        {"type": "vertex", "region": "us-east5", "projectId": "p", "credentials": SECRET},
        {"type": "foundry", "resource": "my-foundry"},
        {
            "type": "foundry",
            "baseURL": "https://x.services.ai.azure.com/anthropic/",
            "credentials": SECRET,
        },
        {
            "baseURL": "https://gw.internal",
            "headers": [{"name": "x-k", **SECRET}, {"name": "x-r", "value": "a"}],
        },
    ],
)
def test_each_providers_manifest_is_accepted(plane: ControlPlane, provider: dict[str, Any]) -> None:
    code, out = create(plane, provider)
    assert code == 0, out
    assert json.loads(out)["spec"]["provider"]["type"] == provider.get("type", "anthropic")


@pytest.mark.parametrize(
    ("provider", "says"),
    [
        ({"type": "openai"}, "Unsupported value"),
        ({"type": "bedrock"}, "type bedrock needs region"),
        ({"type": "vertex", "region": "us-east5"}, "type vertex needs region and projectId"),
        ({"type": "foundry"}, "a resource or a baseURL, one of the two"),
        (
            {"type": "bedrock", "region": "us-east-1", "credentials": SECRET},
            "Bedrock takes the pod's AWS identity",
        ),
        ({"headers": [{"name": "x-k"}]}, "give a header a value or a secretKeyRef"),
        ({"baseURL": "gw.internal"}, "spec.provider.baseURL"),
    ],
)
def test_a_provider_that_cannot_work_is_refused(
    plane: ControlPlane, provider: dict[str, Any], says: str
) -> None:
    code, out = create(plane, provider)
    assert code != 0
    assert says in out
