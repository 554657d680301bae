"""No secret leaks: after real runs, no secret value is found anywhere a user can look.

Real runs on the bench (kube-apiserver, the operator process, pods run by the stand-in
kubelet, MinIO, the scripted model behind the real ``anthropic`` client), with an API key,
the store's key, the runs' own STS credentials and two Secret-backed ``env`` values. One
run's agent prints its secret variables with the shell tool (an accident a debugging
agent makes); another run's model gateway answers 401 with the API key echoed in the
error body. Then every place a secret could land is searched for every value: the
runner's and the operator's logs, the AgentRuns' status, the Events, the saved history
(the raw objects and ``alpineagents show``), and the termination messages.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from alpineagents.testing import ModelServer, error, reply, tool_use
from tests.bench.control_plane import ControlPlane
from tests.bench.minio_server import S3Server
from tests.bench.operator_process import OperatorProcess, bench_env
from tests.bench.pod_runner import PodRunner

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parent.parent
NAMESPACE = "leaks"
DEADLINE = 120.0  # seconds any one awaited condition may take: a safety net, not a measure
JSON = dict[str, Any]

API_KEY = "sk-ant-api03-" + secrets.token_hex(20)
TEAM_TOKEN = "team-token-" + secrets.token_hex(12)  # spec.env secretKeyRef
DB_PASSWORD = "db-pass-" + secrets.token_hex(12)  # spec.envFrom secretRef


@dataclass
class Leaks:
    plane: ControlPlane
    minio: S3Server
    model: ModelServer
    operator: OperatorProcess
    node: PodRunner
    store_url: str
    prefix: str

    def kubectl_json(self, *args: str) -> JSON:
        result: JSON = json.loads(self.plane.kubectl(*args, "-o", "json").stdout)
        return result

    def run(self, name: str) -> JSON:
        return self.kubectl_json("get", "agentrun", name, "-n", NAMESPACE)

    def wait_phase(self, name: str, *phases: str) -> JSON:
        deadline = time.monotonic() + DEADLINE
        while True:
            body = self.run(name)
            if (body.get("status") or {}).get("phase") in phases:
                return body
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{name} never reached {phases}: {json.dumps(body.get('status'))}\n"
                    f"{self.operator.log_tail()}"
                )
            time.sleep(0.1)

    def apply(self, name: str, **spec: Any) -> None:
        manifest = {
            "apiVersion": "alpineagents.dev/v1",
            "kind": "AgentRun",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {
                "model": "claude-sonnet-5",
                "maxTokens": 1024,
                "env": [
                    {
                        "name": "TEAM_TOKEN",
                        "valueFrom": {"secretKeyRef": {"name": "team", "key": "token"}},
                    }
                ],
                "envFrom": [{"secretRef": {"name": "database"}}],
                "restartPolicy": {"maxRestarts": 0},
                **spec,
            },
        }
        self.plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest))


def secret_manifest(name: str, data: dict[str, str]) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
        }
    )


@pytest.fixture(scope="module")
def leaks(control_plane: ControlPlane, minio: S3Server) -> Iterator[Leaks]:
    control_plane.apply_crds()
    control_plane.kubectl("create", "namespace", NAMESPACE, check=False)
    for name, data in [
        ("anthropic", {"ANTHROPIC_API_KEY": API_KEY}),
        ("team", {"token": TEAM_TOKEN}),
        ("database", {"DB_PASSWORD": DB_PASSWORD}),
    ]:
        control_plane.kubectl("apply", "-f", "-", input=secret_manifest(name, data))
    prefix = minio.unique_prefix()
    store_url = f"s3://{minio.bucket}/{prefix}?endpoint={minio.endpoint}&secure=false"
    workdir = Path(tempfile.mkdtemp(prefix="alpineagents-leaks-"))
    with ModelServer() as model, contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        operator = OperatorProcess(
            control_plane.kubeconfig,
            workdir,
            bench_env(
                store_url,
                minio,
                model.url,
                ALPINEAGENTS_NAMESPACES=NAMESPACE,
                ALPINEAGENTS_IMAGE="alpineagents:leaks",
            ),
        )
        stack.callback(operator.stop)
        operator.start()
        path = os.pathsep.join([str(REPO / "operator"), str(REPO)])
        node = PodRunner(
            control_plane.api_client(),
            node_name="leaks-node",
            namespace=NAMESPACE,
            base_env={"PATH": os.environ.get("PATH", os.defpath), "PYTHONPATH": path},
        )
        node.start()
        stack.callback(node.stop)
        yield Leaks(control_plane, minio, model, operator, node, store_url, prefix)


def test_no_secret_value_lands_anywhere_a_user_can_look(leaks: Leaks) -> None:
    # A run whose agent prints its secret variables (the model asks for it, as a
    # debugging agent might), then answers.
    leaks.model.add(
        reply(
            "Checking the connection.",
            tool_use("shell", {"command": "env | grep -E 'KEY|TOKEN|PASSWORD' | sort"}),
        ),
        reply("The connection settings are in place."),
    )
    leaks.apply("prints-env", prompt="Check the database connection.", tools=["shell"])
    done = leaks.wait_phase("prints-env", "Succeeded")
    # Its own credentials, read while they are still the ones it used.
    run_secret = leaks.kubectl_json(
        "get", "secret", "prints-env-store-credentials", "-n", NAMESPACE
    )
    run_keys = {k: base64.b64decode(v).decode() for k, v in run_secret["data"].items()}

    # A run whose model gateway refuses it and echoes the API key in the error body.
    leaks.model.add(error(401, f"invalid x-api-key: {API_KEY} (header echoed by the gateway)"))
    leaks.apply("refused", prompt="Say hello.")
    refused = leaks.wait_phase("refused", "Failed")

    secret_values = {
        "the API key": API_KEY,
        "the env secret": TEAM_TOKEN,
        "the envFrom secret": DB_PASSWORD,
        "the store's key": leaks.minio.secret_key,
        "the run's secret key": run_keys["AWS_SECRET_ACCESS_KEY"],
        "the run's session token": run_keys["AWS_SESSION_TOKEN"],
    }
    places = everything_a_user_can_look_at(leaks, ["prints-env", "refused"])

    # The places hold what happened (the scan is not looking at nothing) ...
    saved = places["saved history (objects)"]
    assert "grep -E 'KEY|TOKEN|PASSWORD'" in saved
    for name in ("TEAM_TOKEN", "DB_PASSWORD"):
        assert f"{name}=***" in saved  # the tool's output, masked before it was saved
    assert "tool shell ok" in places["saved history (show)"]
    assert "authentication_error" in places["AgentRun status"]
    assert "invalid x-api-key: ***" in places["AgentRun status"]
    assert (done["status"]["phase"], refused["status"]["reason"]) == ("Succeeded", "NotRetryable")
    assert "invalid x-api-key" in places["termination messages"]
    # ... and none of them holds any secret value.
    found = [
        f"{what} in {where}"
        for what, value in secret_values.items()
        for where, text in places.items()
        if value in text
    ]
    assert not found, "secrets leaked: " + "; ".join(found)


def everything_a_user_can_look_at(leaks: Leaks, runs: list[str]) -> dict[str, str]:
    pods = leaks.kubectl_json("get", "pods", "-n", NAMESPACE)["items"]
    runner_logs = "\n".join(leaks.node.logs(NAMESPACE, p["metadata"]["name"]) for p in pods)
    messages = "\n".join(
        str(s["state"]["terminated"].get("message", ""))
        for p in pods
        for s in p["status"].get("containerStatuses") or []
        if "terminated" in s["state"]
    )
    statuses = json.dumps([leaks.run(name)["status"] for name in runs])
    events = json.dumps(leaks.kubectl_json("get", "events", "-n", NAMESPACE)["items"])
    operator_log = (leaks.operator.workdir / "operator.log").read_text()
    return {
        "runner logs": runner_logs,
        "operator log": operator_log,
        "AgentRun status": statuses,
        "Events": events,
        "termination messages": messages,
        "saved history (objects)": raw_objects(leaks),
        "saved history (show)": shown(
            leaks, [leaks.run(name)["status"]["stateId"] for name in runs]
        ),
    }


def raw_objects(leaks: Leaks) -> str:
    client = leaks.minio.client()
    bodies = []
    for item in client.list_objects(leaks.minio.bucket, prefix=leaks.prefix, recursive=True):
        response = client.get_object(leaks.minio.bucket, str(item.object_name))
        try:
            bodies.append(response.read().decode("utf-8", errors="replace"))
        finally:
            response.close()
            response.release_conn()
    assert bodies, "nothing saved under the runs' prefix"
    return "\n".join(bodies)


def shown(leaks: Leaks, state_ids: list[str]) -> str:
    env = {
        "PATH": os.environ.get("PATH", os.defpath),
        "PYTHONPATH": os.pathsep.join([str(REPO / "operator"), str(REPO)]),
        "AWS_ACCESS_KEY_ID": leaks.minio.access_key,
        "AWS_SECRET_ACCESS_KEY": leaks.minio.secret_key,
    }
    outputs = []
    for state_id in state_ids:
        for fmt in ("text", "json"):
            command = ["show", state_id, "--store", leaks.store_url, "--log-format", fmt]
            result = subprocess.run(
                [sys.executable, "-m", "alpineagents", *command],
                env=env,
                capture_output=True,
                text=True,
                timeout=DEADLINE,
                check=False,
            )
            assert result.returncode == 0, result.stderr
            outputs.append(result.stdout + result.stderr)
    return "\n".join(outputs)
