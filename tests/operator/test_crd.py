"""The AgentRun CRD against a real kube-apiserver: accepted, defaulted, documented, and
refusing malformed AgentRuns with a message that says what is wrong."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
import yaml

from tests.bench.control_plane import ControlPlane


@pytest.fixture(scope="module")
def plane(control_plane: ControlPlane) -> ControlPlane:
    names = control_plane.apply_crds()
    assert "agentruns.alpineagents.dev" in names
    return control_plane


def manifest(**spec: Any) -> str:
    body = {
        "apiVersion": "alpineagents.dev/v1",
        "kind": "AgentRun",
        "metadata": {"name": f"crd-{uuid.uuid4().hex[:8]}", "namespace": "default"},
        "spec": spec,
    }
    return yaml.safe_dump(body)


def refusal(plane: ControlPlane, **spec: Any) -> str:
    """The API server's answer to creating an AgentRun with ``spec`` (must be refused)."""
    result = plane.kubectl(
        "create", "--dry-run=server", "-f", "-", input=manifest(**spec), check=False
    )
    assert result.returncode != 0, f"accepted: {spec}"
    return result.stderr


def test_a_valid_agentrun_is_accepted_with_defaults(plane: ControlPlane) -> None:
    text = manifest(model="claude-sonnet-5", prompt="Summarise the README", tools=["read_file"])
    created = plane.kubectl("create", "-f", "-", "-o", "json", input=text)
    body = json.loads(created.stdout)
    try:
        spec = body["spec"]
        assert spec["restartPolicy"] == {
            "maxRestarts": 5,
            "initialBackoffSeconds": 1,
            "maxBackoffSeconds": 60,
        }
        assert spec["suspend"] is False
        assert spec["onDelete"] == "Keep"
    finally:
        plane.kubectl("delete", "agentrun", body["metadata"]["name"], "--wait=false")


def test_a_run_with_messages_and_every_pod_field_is_accepted(plane: ControlPlane) -> None:
    text = manifest(
        model="claude-sonnet-5",
        messages=[
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": [{"type": "text", "text": "hi"}]},
            {"role": "user", "content": "go on"},
        ],
        system="Be brief.",
        maxTurns=10,
        maxTokens=4096,
        agent="my_team.agents:make_agent",
        requireApproval=["shell"],
        approvals=[{"callId": "toolu_1", "allow": True, "note": "ok"}],
        image="example.com/runner:1",
        resources={"limits": {"memory": "512Mi"}},
        env=[
            {"name": "LEVEL", "value": "1"},
            {"name": "RUN_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ],
        envFrom=[{"secretRef": {"name": "extra"}}],
        serviceAccountName="agent",
        nodeSelector={"pool": "agents"},
        tolerations=[{"key": "agents", "operator": "Exists", "effect": "NoSchedule"}],
        affinity={"nodeAffinity": {}},
        store="s3://runs/prod?endpoint=minio:9000&secure=false",
        restartPolicy={"maxRestarts": 0},
        suspend=True,
        onDelete="Delete",
    )
    result = plane.kubectl("create", "--dry-run=server", "-f", "-", "-o", "json", input=text)
    spec = json.loads(result.stdout)["spec"]
    assert spec["messages"][1]["content"] == [{"type": "text", "text": "hi"}]
    assert spec["env"][1]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert spec["restartPolicy"]["maxRestarts"] == 0
    assert spec["restartPolicy"]["initialBackoffSeconds"] == 1


def test_missing_model_is_refused(plane: ControlPlane) -> None:
    assert "spec.model: Required value" in refusal(plane, prompt="hi")


def test_negative_max_turns_is_refused(plane: ControlPlane) -> None:
    message = refusal(plane, model="claude-sonnet-5", prompt="hi", maxTurns=-1)
    assert (
        "spec.maxTurns: Invalid value: -1: spec.maxTurns in body should be greater than or equal to 1"
        in message
    )


def test_unknown_tool_is_refused_with_the_known_ones(plane: ControlPlane) -> None:
    message = refusal(plane, model="claude-sonnet-5", prompt="hi", tools=["shel"])
    assert 'Unsupported value: "shel"' in message
    assert '"shell"' in message and '"read_file"' in message


def test_prompt_and_messages_are_exclusive(plane: ControlPlane) -> None:
    both = refusal(
        plane, model="claude-sonnet-5", prompt="hi", messages=[{"role": "user", "content": "hi"}]
    )
    neither = refusal(plane, model="claude-sonnet-5")
    for message in (both, neither):
        assert "give exactly one of spec.prompt" in message


def test_first_message_must_be_the_users(plane: ControlPlane) -> None:
    message = refusal(
        plane, model="claude-sonnet-5", messages=[{"role": "assistant", "content": "x"}]
    )
    assert "the first of spec.messages must be the user's" in message


def test_bad_values_are_refused(plane: ControlPlane) -> None:
    assert "Unsupported value" in refusal(plane, model="m", prompt="hi", onDelete="Forget")
    assert "spec.agent" in refusal(plane, model="m", prompt="hi", agent="not an import path")
    assert "spec.approvals[0].allow: Required value" in refusal(
        plane, model="m", prompt="hi", approvals=[{"callId": "toolu_1"}]
    )
    assert "should be greater than or equal to 0" in refusal(
        plane, model="m", prompt="hi", restartPolicy={"maxRestarts": -1}
    )


def named(name: str, **spec: Any) -> str:
    body = yaml.safe_load(manifest(**spec))
    body["metadata"]["name"] = name
    return yaml.safe_dump(body)


def test_a_name_too_long_to_label_the_pods_is_refused_naming_the_limit(
    plane: ControlPlane,
) -> None:
    # The name labels every pod of the run, and a label value holds at most 63 characters.
    longest = "n" * 54 + uuid.uuid4().hex[:9]
    accepted = plane.kubectl(
        "create", "--dry-run=server", "-f", "-", input=named(longest, model="m", prompt="hi")
    )
    assert accepted.returncode == 0
    refused = plane.kubectl(
        "create",
        "--dry-run=server",
        "-f",
        "-",
        input=named(longest + "x", model="m", prompt="hi"),
        check=False,
    )
    assert refused.returncode != 0
    assert "metadata.name may be at most 63 characters" in refused.stderr


def test_a_prompt_too_large_for_the_pods_secret_is_refused_naming_the_limit(
    plane: ControlPlane,
) -> None:
    message = refusal(plane, model="m", prompt="x" * 2_000_000)
    assert "spec.prompt may be at most 262144 characters" in message
    assert "1 MiB" in message
    system = refusal(plane, model="m", prompt="hi", system="s" * 262_145)
    assert "spec.system may be at most 262144 characters" in system
    at_limit = manifest(model="m", prompt="x" * 262_144)
    plane.kubectl("create", "--dry-run=server", "-f", "-", input=at_limit)


@pytest.mark.parametrize(
    ("store", "message"),
    [
        ("ftp://runs.example.com/agents", "spec.store must be file:///path or s3://"),
        ("s3://AKIA1:topsecret@runs/x?endpoint=m:9000", "spec.store must not hold credentials"),
        ("s3://?endpoint=minio:9000", "spec.store names no bucket"),
        ("s3:///prefix", "spec.store names no bucket"),
    ],
)
def test_a_store_url_that_cannot_work_is_refused(
    plane: ControlPlane, store: str, message: str
) -> None:
    refused = refusal(plane, model="m", prompt="hi", store=store)
    assert message in refused
    assert "topsecret" not in refused


@pytest.mark.parametrize(
    "store", ["file:///var/lib/runs", "s3://runs/prod?endpoint=minio:9000&secure=false", "runs"]
)
def test_store_urls_that_work_are_accepted(plane: ControlPlane, store: str) -> None:
    text = manifest(model="m", prompt="hi", store=store)
    plane.kubectl("create", "--dry-run=server", "-f", "-", input=text)


def test_kubectl_explain_teaches_the_spec(plane: ControlPlane) -> None:
    spec = plane.kubectl("explain", "agentrun.spec").stdout
    assert "Give the model and exactly one of prompt or messages" in spec
    assert "restartPolicy" in spec and "onDelete" in spec
    policy = plane.kubectl("explain", "agentrun.spec.restartPolicy.maxRestarts").stdout
    assert "Failed pods tolerated" in policy and "disruption" in policy
    status = plane.kubectl("explain", "agentrun.status").stdout
    assert "pendingApprovals" in status and "lastSavedSeq" in status


MCP_SERVERS: list[dict[str, Any]] = [
    {
        "name": "github",
        "url": "http://github-mcp.tools.svc:8080/mcp",
        "headers": [
            {"name": "Authorization", "secretKeyRef": {"name": "github-mcp", "key": "token"}}
        ],
        "tools": ["search_issues", "get_issue"],
        "timeoutSeconds": 30,
    },
    {
        "name": "files",
        "command": ["python", "-m", "files_mcp"],
        "args": ["--root", "/work"],
        "env": [
            {"name": "LOG_LEVEL", "value": "info"},
            {"name": "FILES_TOKEN", "secretKeyRef": {"name": "files-mcp", "key": "token"}},
        ],
    },
]


def test_mcp_servers_are_accepted_as_given(plane: ControlPlane) -> None:
    text = manifest(model="claude-sonnet-5", prompt="hi", mcpServers=MCP_SERVERS)
    result = plane.kubectl("create", "--dry-run=server", "-f", "-", "-o", "json", input=text)
    assert json.loads(result.stdout)["spec"]["mcpServers"] == MCP_SERVERS


@pytest.mark.parametrize(
    ("server", "message"),
    [
        (
            {"name": "both", "url": "http://x/mcp", "command": ["x"]},
            "give exactly one of url (Streamable HTTP) or command",
        ),
        ({"name": "neither"}, "give exactly one of url (Streamable HTTP) or command"),
        (
            {"name": "plain", "url": "http://x/mcp", "headers": [{"name": "Authorization"}]},
            "spec.mcpServers[0].headers[0].secretKeyRef: Required value",
        ),
        (
            {
                "name": "stdio",
                "command": ["x"],
                "headers": [{"name": "A", "secretKeyRef": {"name": "s", "key": "k"}}],
            },
            "headers are for url servers",
        ),
        ({"name": "web", "url": "http://x/mcp", "args": ["-v"]}, "args and env are for command"),
        ({"name": "Web", "url": "http://x/mcp"}, "spec.mcpServers[0].name"),
        ({"name": "web", "url": "ftp://x/mcp"}, "spec.mcpServers[0].url"),
        ({"name": "web", "url": "http://x/mcp", "timeoutSeconds": 0}, "timeoutSeconds"),
        (
            {"name": "env", "command": ["x"], "env": [{"name": "A"}]},
            "give exactly one of value or secretKeyRef",
        ),
    ],
)
def test_bad_mcp_servers_are_refused(
    plane: ControlPlane, server: dict[str, Any], message: str
) -> None:
    assert message in refusal(plane, model="m", prompt="hi", mcpServers=[server])


def test_mcp_server_names_are_unique(plane: ControlPlane) -> None:
    twice = [{"name": "web", "url": "http://a/mcp"}, {"name": "web", "url": "http://b/mcp"}]
    assert "Duplicate value" in refusal(plane, model="m", prompt="hi", mcpServers=twice)


def test_kubectl_explain_documents_mcp_servers(plane: ControlPlane) -> None:
    def explain(field: str) -> str:  # its lines are wrapped where kubectl likes
        return " ".join(plane.kubectl("explain", field).stdout.split())

    servers = explain("agentrun.spec.mcpServers")
    assert "MCP servers whose tools the agent may call" in servers
    assert "headers" in servers and "command" in servers and "timeoutSeconds" in servers
    assert "never written in the AgentRun" in explain("agentrun.spec.mcpServers.headers")


def test_status_subresource_and_printer_columns(plane: ControlPlane) -> None:
    name = f"cols-{uuid.uuid4().hex[:6]}"
    body = yaml.safe_load(manifest(model="claude-sonnet-5", prompt="hi"))
    body["metadata"]["name"] = name
    plane.kubectl("create", "-f", "-", input=yaml.safe_dump(body))
    try:
        status = {
            "status": {
                "phase": "Succeeded",
                "attempt": 2,
                "lastSavedSeq": 14,
                "answer": "All done.",
                "usage": {
                    "inputTokens": 10,
                    "outputTokens": 3,
                    "cacheCreationInputTokens": 100,
                    "cacheReadInputTokens": 900,
                },
                "costUSD": "0.0012",
                "pendingApprovals": [{"callId": "c", "name": "shell", "input": {"command": "ls"}}],
                "conditions": [
                    {
                        "type": "Succeeded",
                        "status": "True",
                        "reason": "Answered",
                        "message": "",
                        "lastTransitionTime": "2026-03-01T12:00:00Z",
                        "observedGeneration": 1,
                    }
                ],
            }
        }
        plane.kubectl(
            "patch",
            "agentrun",
            name,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps(status),
        )
        wide = plane.kubectl("get", "ar", name, "-o", "wide").stdout
        header, row = wide.splitlines()[:2]
        assert header.split()[:6] == ["NAME", "PHASE", "ATTEMPT", "SAVED", "COST", "AGE"]
        assert "ANSWER" in header
        assert row.split()[:5] == [name, "Succeeded", "2", "14", "0.0012"]
        assert "All done." in row
        got = json.loads(plane.kubectl("get", "ar", name, "-o", "json").stdout)
        assert got["status"]["pendingApprovals"][0]["input"] == {"command": "ls"}
        assert got["status"]["usage"]["cacheReadInputTokens"] == 900  # kept, not pruned
        # A status write through the main resource is ignored (status is a subresource).
        plane.kubectl(
            "patch", "agentrun", name, "--type=merge", "-p", '{"status": {"phase": "Failed"}}'
        )
        again = json.loads(plane.kubectl("get", "ar", name, "-o", "json").stdout)
        assert again["status"]["phase"] == "Succeeded"
    finally:
        plane.kubectl("delete", "agentrun", name, "--wait=false")
