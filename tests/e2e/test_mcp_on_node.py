"""MCP servers of an AgentRun (``spec.mcpServers``), reached from a run's pod on the real
node: headers come from a Secret by reference, and a server that cannot be reached is a
loss the status names.

The MCP server is the tests' own (``tests/agents/mcp_server.py``, the SDK's MCPServer)
on this machine, listening on the real node's bridge (the tests' servers' address, which
the bench's NetworkPolicy opens to run pods): pods reach it there, and
nothing outside the machine does. These tests need the real node (they skip on a cluster
of your own, which cannot reach the bridge).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from tests.bench.mcp_server import MCPTestServer, header_digest
from tests.e2e.environment import (
    JSON,
    Environment,
    apply_run,
    wait_phase,
)

pytestmark = pytest.mark.e2e


def run_name() -> str:
    return f"m-{uuid.uuid4().hex[:6]}"


def test_an_mcp_header_comes_from_a_secret_through_the_pod(
    node_env: Environment, mcp_servers: Callable[..., MCPTestServer]
) -> None:
    from tests.bench.node_network import TEST_SERVERS_ADDRESS

    server = mcp_servers(host=TEST_SERVERS_ADDRESS)
    name = run_name()
    token = f"Bearer {uuid.uuid4().hex}"
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": f"{name}-mcp"},
        "stringData": {"authorization": token},
    }
    node_env.kubectl("apply", "-f", "-", input=yaml.safe_dump(secret))
    reference = {"name": f"{name}-mcp", "key": "authorization"}
    calc = {
        "name": "calc",
        "url": server.url,
        "headers": [{"name": "Authorization", "secretKeyRef": reference}],
        "tools": ["whoami"],
    }
    apply_run(node_env, name, "Who am I?\nuse whoami", mcpServers=[calc])
    done = wait_phase(node_env, name, "Succeeded")
    # The server saw the Secret's value (the history holds only its digest).
    assert done["answer"] == f"whoami returned: {header_digest(token)}", done
    assert server.calls() == ["whoami"]
    pod: JSON = json.loads(node_env.kubectl("get", "pod", f"{name}-1", "-o", "json").stdout)
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    assert env["ALPINEAGENTS_MCP_CALC_HEADER_AUTHORIZATION"] == {
        "name": "ALPINEAGENTS_MCP_CALC_HEADER_AUTHORIZATION",
        "valueFrom": {"secretKeyRef": reference},
    }
    run: Any = json.loads(node_env.kubectl("get", "agentrun", name, "-o", "json").stdout)
    assert token not in json.dumps(pod) and token not in json.dumps(run)
    assert token not in node_env.logs(f"{name}-1") and token not in node_env.operator_log()


def test_an_unreachable_mcp_server_is_a_retryable_loss_in_status(node_env: Environment) -> None:
    name = run_name()
    # Nothing listens on the pod's own loopback.
    url = "http://127.0.0.1:9/mcp"
    calc = {"name": "calc", "url": url, "timeoutSeconds": 20}
    apply_run(
        node_env,
        name,
        "Add",
        mcpServers=[calc],
        restartPolicy={"maxRestarts": 0, "initialBackoffSeconds": 0},
    )
    failed = wait_phase(node_env, name, "Failed")
    # A loss (the server may come back), not a refusal: the restart budget ran out.
    assert failed["reason"] == "RestartLimitExceeded", failed
    assert f"tools unavailable: MCP server 'calc' at {url} cannot be reached" in json.dumps(
        failed
    ), failed
