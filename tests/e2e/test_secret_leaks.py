"""No secret leaks: after real runs, no secret value is found anywhere a user can look.

Real runs on the real node (the chart's operator in its pod, agent pods under a real
kubelet, the bundled MinIO, the real ``anthropic`` client), with a model API key of the
AgentRun's own Secret, the store's key, the runs' own STS credentials and two
Secret-backed ``env`` values. One run's agent greps its secret variables with the shell
tool (an accident a debugging agent makes); another run's model gateway answers 401 with
the API key echoed in the error body. Then every place a secret could land is searched
for every value: the runner's and the operator's logs, the AgentRuns' status, the Events,
the saved history (the raw objects and ``alpineagents show``), and the termination
messages.

The model is a scripted server of the test's own on the node's bridge (the tests' servers'
address: pods reach it there), so it needs the real node: it skips on a cluster of your own.
"""

from __future__ import annotations

import json
import secrets
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from alpineagents.testing import ModelServer, error, reply, tool_use
from tests.e2e.environment import JSON, Environment, in_phase, secret_data, status, wait_for_run

pytestmark = pytest.mark.e2e

API_KEY = "sk-ant-api03-" + secrets.token_hex(20)
TEAM_TOKEN = "team-token-" + secrets.token_hex(12)  # spec.env secretKeyRef
DB_PASSWORD = "db-pass-" + secrets.token_hex(12)  # spec.envFrom secretRef

# Inside the operator's container (it holds the store's URL and key): every object's body.
_DUMP_OBJECTS = """
import os
from alpineagents.store.url import s3_credentials, s3_location
from minio import Minio
url = os.environ["ALPINEAGENTS_STORE"]
where, key = s3_location(url), s3_credentials(url)
client = Minio(where.endpoint, access_key=key.access_key, secret_key=key.secret_key,
               secure=where.secure, region=where.region)
for item in client.list_objects(where.bucket, recursive=True):
    body = client.get_object(where.bucket, item.object_name)
    print(item.object_name)
    print(body.read().decode("utf-8", "replace"))
"""


@pytest.fixture
def leaky(node_env: Environment) -> Iterator[tuple[Environment, ModelServer, str]]:
    """The environment, a scripted model pods can reach, and a prefix for Secret names."""
    e2e = node_env
    from tests.bench.node_network import TEST_SERVERS_ADDRESS

    prefix = f"leak-{uuid.uuid4().hex[:6]}"
    for name, data in [
        ("api", {"key": API_KEY}),
        ("team", {"token": TEAM_TOKEN}),
        ("database", {"DB_PASSWORD": DB_PASSWORD}),
    ]:
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": f"{prefix}-{name}"},
            "stringData": data,
        }
        e2e.kubectl("apply", "-f", "-", input=yaml.safe_dump(secret))
    with ModelServer(host=TEST_SERVERS_ADDRESS) as model:
        yield e2e, model, prefix


def run_spec(model: ModelServer, prefix: str) -> dict[str, Any]:
    """The AgentRun fields that give its pod the test's model, API key and secrets."""
    secret_ref = {"name": f"{prefix}-api", "key": "key"}
    return {
        "env": [
            {"name": "ALPINEAGENTS_LOG_FORMAT", "value": "json"},
            {"name": "ANTHROPIC_BASE_URL", "value": model.url},
            {"name": "ANTHROPIC_API_KEY", "valueFrom": {"secretKeyRef": secret_ref}},
            {
                "name": "TEAM_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": f"{prefix}-team", "key": "token"}},
            },
        ],
        "envFrom": [{"secretRef": {"name": f"{prefix}-database"}}],
        "restartPolicy": {"maxRestarts": 0, "initialBackoffSeconds": 0},
    }


def test_no_secret_value_lands_anywhere_a_user_can_look(
    leaky: tuple[Environment, ModelServer, str],
) -> None:
    env, model, prefix = leaky
    # A run whose agent greps its secret variables (as a debugging agent might), then answers.
    model.add(
        reply(
            "Checking the connection.",
            tool_use("shell", {"command": "env | grep -E 'KEY|TOKEN|PASSWORD' | sort"}),
        ),
        reply("The connection settings are in place."),
    )
    prints = f"{prefix}-prints"
    apply(env, prints, "Check the database connection.", run_spec(model, prefix))
    done = status(wait_for_run(env, prints, in_phase("Succeeded"), "Succeeded", 300))
    run_keys = secret_data(env, f"{prints}-store-credentials")

    # A run whose model gateway refuses it and echoes the API key in the error body.
    model.add(error(401, f"invalid x-api-key: {API_KEY} (header echoed by the gateway)"))
    refused = f"{prefix}-refused"
    apply(env, refused, "Say hello.", run_spec(model, prefix))
    failed = status(wait_for_run(env, refused, in_phase("Failed"), "Failed", 300))

    store_key = secret_data(env, f"{env.operator.removesuffix('-operator')}-store")
    secret_values = {
        "the API key": API_KEY,
        "the env secret": TEAM_TOKEN,
        "the envFrom secret": DB_PASSWORD,
        "the store's key": store_key["AWS_SECRET_ACCESS_KEY"],
        "the run's secret key": run_keys["AWS_SECRET_ACCESS_KEY"],
        "the run's session token": run_keys["AWS_SESSION_TOKEN"],
    }
    places = everything_a_user_can_look_at(env, [prints, refused], [done, failed])

    # The places hold what happened (the scan is not looking at nothing) ...
    saved = places["saved history (objects)"]
    assert "grep -E 'KEY|TOKEN|PASSWORD'" in saved
    for name in ("TEAM_TOKEN", "DB_PASSWORD"):
        assert f"{name}=***" in saved  # the tool's output, masked before it was saved
    assert "invalid x-api-key: ***" in places["AgentRun status"]
    assert "invalid x-api-key: ***" in places["termination messages"]
    assert "tool" in places["saved history (show)"]
    assert failed["reason"] == "NotRetryable"
    # ... and none of them holds any secret value.
    found = [
        f"{what} in {where}"
        for what, value in secret_values.items()
        for where, text in places.items()
        if value in text
    ]
    assert not found, "secrets leaked: " + "; ".join(found)


def apply(env: Environment, name: str, prompt: str, spec: dict[str, Any]) -> None:
    """``kubectl apply`` an AgentRun with the shell tool and ``spec``'s env and secrets."""
    body = {
        "apiVersion": "alpineagents.dev/v1",
        "kind": "AgentRun",
        "metadata": {"name": name},
        "spec": {"model": "claude-sonnet-5", "prompt": prompt, "tools": ["shell"], **spec},
    }
    env.kubectl("apply", "-f", "-", input=yaml.safe_dump(body))


def everything_a_user_can_look_at(
    env: Environment, runs: list[str], statuses: list[JSON]
) -> dict[str, str]:
    pods = [
        pod
        for run in runs
        for pod in json.loads(
            env.kubectl("get", "pods", "-l", f"alpineagents.dev/run={run}", "-o", "json").stdout
        )["items"]
    ]
    messages = "\n".join(
        str(s["state"]["terminated"].get("message", ""))
        for p in pods
        for s in p["status"].get("containerStatuses") or []
        if "terminated" in s["state"]
    )
    events = env.kubectl("get", "events", "-o", "json").stdout
    shown = "\n".join(
        env.kubectl(
            "exec",
            f"deployment/{env.operator}",
            "-c",
            "operator",
            "--",
            "python",
            "-m",
            "alpineagents",
            "show",
            s["stateId"],
            "--log-format",
            fmt,
        ).stdout
        for s in statuses
        for fmt in ("text", "json")
    )
    objects = env.kubectl(
        "exec", f"deployment/{env.operator}", "-c", "operator", "--", "python", "-c", _DUMP_OBJECTS
    ).stdout
    assert objects.strip(), "nothing saved in the store"
    return {
        "runner logs": "\n".join(env.logs(p["metadata"]["name"]) for p in pods),
        "operator log": env.operator_log(),
        "AgentRun status": json.dumps(statuses),
        "Events": events,
        "termination messages": messages,
        "saved history (objects)": objects,
        "saved history (show)": shown,
    }
