"""One AgentRun per model provider on the real node: its pod deleted mid-step, resumed,
Succeeded, and the provider's credential never in a log, an Event, the State or the status.

Each provider's scripted wire (tests/providers' servers: a gateway taking its own header,
Vertex AI with a GKE metadata server, Foundry with its key, Bedrock with its STS, the pod's
token given by an IRSA webhook as on EKS: tests/bench/pod_identity_webhook.py) listens on
the node's bridge, where pods reach it, in front of a scripted model. Its error answers quote the request's
headers, credentials and all, as a careless proxy's do. The run's one tool call is held by
the tool gate while the test deletes the pod; the replacement resumes with the call
aborted, its next request is refused with 500s quoting the request until the runner gives
up (a retryable exit: the operator restarts it), and the third pod answers. Then every
place a user can look is searched for every credential's bytes.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from alpineagents.redaction import MASK
from alpineagents.testing import ModelServer, error, reply, tool_use
from alpineagents.testing.bedrock_wire import BedrockServer
from alpineagents.testing.foundry_wire import FoundryServer
from alpineagents.testing.gateway_wire import GatewayServer
from alpineagents.testing.provider_wire import QUOTE, ProviderServer
from alpineagents.testing.vertex_wire import MetadataServer, VertexServer
from tests.bench.pod_identity_webhook import ROLE_ANNOTATION, ClusterSTS, PodIdentityWebhook
from tests.bench.tool_gate import ToolGate
from tests.e2e.environment import Environment, apply_run, wait_phase
from tests.e2e.test_secret_leaks import everything_a_user_can_look_at

pytestmark = pytest.mark.e2e

API_KEY = "sk-ant-api03-node-" + uuid.uuid4().hex
GATEWAY_KEY = "gw-node-key-" + uuid.uuid4().hex
FOUNDRY_KEY = "foundry-node-key-" + uuid.uuid4().hex
ROLE = "arn:aws:iam::123456789012:role/alpineagents-runs"
REFUSALS = 2  # the runner's tries of a request failing for a transient error (set below)


@dataclass
class OnNode:
    """A provider's servers on the bridge and what an AgentRun needs to use them."""

    model_id: str
    provider: dict[str, Any]
    env: list[dict[str, Any]]
    secrets: dict[str, dict[str, str]]
    """Secrets to create: name -> data."""
    wires: list[ProviderServer]
    issued: Callable[[], list[str]] = lambda: []
    given: list[str] = field(default_factory=list)
    service_account: str | None = None
    """The run pods' ServiceAccount (one with a cloud's identity), if not the chart's."""


def _ref(name: str, key: str) -> dict[str, Any]:
    return {"secretKeyRef": {"name": name, "key": key}}


@contextlib.contextmanager
def provider_on_node(
    kind: str, model: ModelServer, prefix: str, env: Environment
) -> Iterator[OnNode]:
    from tests.bench.node_network import TEST_SERVERS_ADDRESS as HOST

    if kind == "gateway":
        with GatewayServer(model, {"x-gateway-key": GATEWAY_KEY}, host=HOST) as gateway:
            yield OnNode(
                "claude-sonnet-4-5",
                {
                    "baseURL": gateway.url,
                    "headers": [
                        {"name": "x-gateway-route", "value": "team-a"},
                        {"name": "x-gateway-key", **_ref(f"{prefix}-gateway", "key")},
                    ],
                },
                [{"name": "ANTHROPIC_API_KEY", "valueFrom": _ref(f"{prefix}-gateway", "api-key")}],
                {f"{prefix}-gateway": {"key": GATEWAY_KEY, "api-key": API_KEY}},
                [gateway],
                given=[GATEWAY_KEY, API_KEY],
            )
    elif kind == "vertex":
        metadata = MetadataServer("runs-project", "runs@runs-project.iam", host=HOST)
        with metadata, VertexServer(model, metadata, "us-east5", host=HOST) as vertex:
            yield OnNode(
                "claude-sonnet-4-5@20250929",
                {
                    "type": "vertex",
                    "region": "us-east5",
                    "projectId": "runs-project",
                    "baseURL": vertex.base_url,
                },
                [{"name": k, "value": v} for k, v in metadata.env().items()],
                {},
                [metadata, vertex],
                issued=lambda: list(metadata.tokens),
            )
    elif kind == "foundry":
        with FoundryServer(model, api_key=FOUNDRY_KEY, host=HOST) as foundry:
            yield OnNode(
                "claude-sonnet-4-5",
                {
                    "type": "foundry",
                    "baseURL": foundry.base_url,
                    "credentials": _ref(f"{prefix}-foundry", "key"),
                },
                [],
                {f"{prefix}-foundry": {"key": FOUNDRY_KEY}},
                [foundry],
                given=[FOUNDRY_KEY],
            )
    elif kind == "bedrock":
        # IRSA as on EKS: the ServiceAccount names the role, the pod identity webhook gives
        # the pod a projected token, the SDK exchanges it at STS (checked by TokenReview).
        assert env.real_node is not None
        plane, account = env.real_node.plane, f"{prefix}-aws"
        account_body = {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": account, "annotations": {ROLE_ANNOTATION: ROLE}},
            "automountServiceAccountToken": False,
        }
        env.kubectl("apply", "-f", "-", input=yaml.safe_dump(account_body))
        sts = ClusterSTS(plane, ROLE, env.namespace, account, host=HOST)
        with (
            sts,
            BedrockServer(model, sts, "us-east-1", host=HOST) as bedrock,
            PodIdentityWebhook(plane, env.namespace, account, ROLE) as webhook,
        ):
            yield OnNode(
                "us.anthropic.claude-sonnet-4-5-20250929-v1:0",
                {"type": "bedrock", "region": "us-east-1", "baseURL": bedrock.url},
                [{"name": "AWS_ENDPOINT_URL_STS", "value": sts.url}],
                {},
                [sts, bedrock],
                issued=lambda: [
                    *sts.presented,
                    *(v for key, pair in sts.issued.items() for v in (key, *pair)),
                ],
                service_account=account,
            )
            assert webhook.mutated, "no run pod was given the role"
    else:
        raise ValueError(kind)


@pytest.mark.parametrize("kind", ["gateway", "vertex", "foundry", "bedrock"])
def test_a_run_on_each_provider_resumes_after_its_pod_is_deleted_and_writes_no_credential(
    node_env: Environment, gate: ToolGate, kind: str
) -> None:
    from tests.bench.node_network import TEST_SERVERS_ADDRESS

    env, name = node_env, f"p-{kind}-{uuid.uuid4().hex[:6]}"
    with (
        ModelServer(host=TEST_SERVERS_ADDRESS) as model,
        provider_on_node(kind, model, name, env) as cloud,
    ):
        for wire in cloud.wires:
            wire.quotes_requests = True
        for secret, data in cloud.secrets.items():
            body = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": secret}}
            env.kubectl("apply", "-f", "-", input=yaml.safe_dump({**body, "stringData": data}))
        model.add(
            reply("On it.", tool_use("shell", {"command": gate.command(name), "timeout": 1800})),
            *[error(500, "upstream unavailable") for _ in range(REFUSALS)],
            reply("Done."),
        )
        apply_run(
            env,
            name,
            "Do the job.",
            model=cloud.model_id,
            provider=cloud.provider,
            env=[{"name": "ALPINEAGENTS_MODEL_RETRIES", "value": str(REFUSALS)}, *cloud.env],
            restartPolicy={"initialBackoffSeconds": 0, "maxRestarts": 3},
            **({"serviceAccountName": cloud.service_account} if cloud.service_account else {}),
        )
        gate.wait_started(name)
        env.kubectl("delete", "pod", f"{name}-1", "--wait=false")
        done = wait_phase(env, name, "Succeeded")
        places = everything_a_user_can_look_at(env, [name], [done])
        credentials = [*cloud.given, *cloud.issued()]
        refused = [why for wire in cloud.wires for why in wire.refused]

    # Resumed after the deletion (the call ran once, closed as aborted), restarted once
    # after the refusals, answered by the third pod.
    assert done["answer"] == "Done.", done
    assert done["attempt"] == 3 and done["disruptions"] == 1 and done["restarts"] == 1, done
    assert gate.starts(name) == 1
    assert refused == []
    # The refusal quoted the request, credentials and all, and was saved masked.
    saved = places["saved history (objects)"]
    assert QUOTE in saved and MASK in saved
    assert credentials, f"{kind}: no credential was given or obtained"
    found = [
        f"a credential in {where}"
        for where, text in places.items()
        for credential in credentials
        if credential in text
    ]
    assert not found, f"{kind}: " + "; ".join(found)
