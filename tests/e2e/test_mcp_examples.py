"""MCP servers as an AgentRun's tools on a cluster: the example server deployed beside the
example AgentRun (examples/mcp-server.yaml, examples/mcp-agentrun.yaml), its
Authorization header going from a Secret through the pod to the server, never through
the AgentRun; a wrong one is refused by the server and shows in the run's status."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
import yaml

from tests.e2e.environment import JSON, Environment, in_phase, status, wait_for_run
from tests.paths import REPO

pytestmark = pytest.mark.e2e

EXAMPLES = REPO / "examples"


def examples(name: str) -> list[JSON]:
    return [o for o in yaml.safe_load_all((EXAMPLES / name).read_text()) if o]


def deploy_example_server(env: Environment) -> str:
    """examples/mcp-server.yaml on the environment's image; returns its Secret's value."""
    image = env.values["image"]
    objects = examples("mcp-server.yaml")
    for body in objects:
        if body["kind"] == "Deployment":
            container = body["spec"]["template"]["spec"]["containers"][0]
            container["image"] = f"{image['repository']}:{image['tag']}"
            container["imagePullPolicy"] = image.get("pullPolicy", "IfNotPresent")
    env.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objects))
    env.kubectl("rollout", "status", "deployment/runbooks-mcp", "--timeout=120s")
    secret = next(o for o in objects if o["kind"] == "Secret")
    value: str = secret["stringData"]["authorization"]
    return value


def test_the_example_agentrun_reads_a_runbook_with_its_header_from_a_secret(
    e2e: Environment,
) -> None:
    authorization = deploy_example_server(e2e)
    (run,) = examples("mcp-agentrun.yaml")
    name = run["metadata"]["name"]
    e2e.kubectl("apply", "-f", "-", input=yaml.safe_dump(run))

    done = status(wait_for_run(e2e, name, in_phase("Succeeded"), "Succeeded"))
    assert "read_runbook returned: 1. Find the biggest folders" in done["answer"]
    pod = json.loads(e2e.kubectl("get", "pod", done["pod"], "-o", "json").stdout)
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    assert env["ALPINEAGENTS_MCP_RUNBOOKS_HEADER_AUTHORIZATION"]["valueFrom"] == {
        "secretKeyRef": {"name": "runbooks-mcp", "key": "authorization"}
    }
    agentrun = e2e.kubectl("get", "agentrun", name, "-o", "json").stdout
    assert authorization not in json.dumps(pod) and authorization not in agentrun
    history = e2e.history(done["stateId"]) or []
    tools = [entry for entry in history if entry["kind"] == "tools"]
    assert [t["name"] for t in tools[0]["data"]["tools"]] == ["list_runbooks", "read_runbook"]


def test_a_header_the_server_refuses_is_a_retryable_loss_with_the_reason(
    e2e: Environment,
) -> None:
    deploy_example_server(e2e)
    name = f"mcp-refused-{uuid.uuid4().hex[:6]}"
    wrong: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name},
        "stringData": {"authorization": "Bearer not-the-token"},
    }
    e2e.kubectl("apply", "-f", "-", input=yaml.safe_dump(wrong))
    (run,) = examples("mcp-agentrun.yaml")
    run["metadata"]["name"] = name
    run["spec"]["mcpServers"][0]["headers"][0]["secretKeyRef"]["name"] = name
    run["spec"]["restartPolicy"] = {"maxRestarts": 0}
    e2e.kubectl("apply", "-f", "-", input=yaml.safe_dump(run))

    failed = status(wait_for_run(e2e, name, in_phase("Failed"), "Failed"))
    assert "MCP server 'runbooks'" in json.dumps(failed)
    assert "refused the request (HTTP 401)" in json.dumps(failed)
