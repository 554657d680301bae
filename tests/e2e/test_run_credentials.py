"""A run's pod holds store credentials for its own run only, and new ones after a loss.

The operator mints each run short-lived credentials scoped to that run's State and puts
them in the run's own Secret, which the kubelet mounts into the pod. Checked from inside
the pod (``kubectl exec``), with the credentials it really has: its own State can be
read; another run's State, and listing the store, are refused by the store (403).
"""

from __future__ import annotations

import json
import uuid

import pytest
import yaml

from tests.e2e.environment import (
    CLOSED_ON_STOP,
    JSON,
    SLOW_STEP,
    Environment,
    apply_run,
    in_phase,
    secret_data,
    status,
    wait_for_run,
    wait_until_tool_runs,
)

pytestmark = pytest.mark.e2e

# Run inside the agent container: what the store lets these credentials do, as HTTP codes.
_PROBE = """
import json, os, sys
from minio import Minio
from minio.error import S3Error
from alpineagents.store.base import encode_id
from alpineagents.store.s3.objects import checked_prefix
from alpineagents.store.url import s3_credentials, s3_location
url = os.environ["ALPINEAGENTS_STORE"]
where, key = s3_location(url), s3_credentials(url, os.environ)
client = Minio(where.endpoint, access_key=key.access_key, secret_key=key.secret_key,
               session_token=key.session_token, secure=where.secure, region=where.region)
prefix = checked_prefix(where.prefix)
def code(action):
    try:
        action()
        return 200
    except S3Error as error:
        return error.response.status
info = lambda state: client.stat_object(where.bucket, f"{prefix}{encode_id(state)}/info.json")
print(json.dumps({
    "own": code(lambda: info(sys.argv[1])),
    "other": code(lambda: info(sys.argv[2])),
    "list_prefix": code(lambda: list(client.list_objects(where.bucket, prefix=prefix))),
    "list_bucket": code(lambda: list(client.list_objects(where.bucket))),
}))
"""


def operator_setting(env: Environment, key: str) -> str:
    config = json.loads(env.kubectl("get", "configmap", env.operator, "-o", "json").stdout)
    return str(config["data"][key])


def test_a_run_pod_holds_credentials_for_its_own_run_only(e2e: Environment) -> None:
    other = f"other-{uuid.uuid4().hex[:6]}"
    apply_run(e2e, other, "Say hello.")
    other_state = status(wait_for_run(e2e, other, in_phase("Succeeded"), "Succeeded"))["stateId"]

    name = f"own-{uuid.uuid4().hex[:6]}"
    apply_run(e2e, name, f"Run the slow step.\n{SLOW_STEP}")
    run = status(wait_until_tool_runs(e2e, name))
    pod: JSON = json.loads(e2e.kubectl("get", "pod", run["pod"], "-o", "json").stdout)
    # The pod names its own run's Secret, never the store's broad key.
    spec = pod["spec"]
    secrets = {v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v} | {
        e["valueFrom"]["secretKeyRef"]["name"]
        for e in spec["containers"][0]["env"]
        if "secretKeyRef" in (e.get("valueFrom") or {})
    }
    store_secret = operator_setting(e2e, "ALPINEAGENTS_STORE_SECRET")
    assert f"{name}-store-credentials" in secrets and store_secret not in secrets, secrets
    names = {e["name"] for e in spec["containers"][0]["env"]}
    assert "AWS_ACCESS_KEY_ID" not in names and "AWS_ACCESS_KEY_ID_FILE" in names
    first = secret_data(e2e, f"{name}-store-credentials")
    broad_key = secret_data(e2e, store_secret)[
        operator_setting(e2e, "ALPINEAGENTS_STORE_ACCESS_KEY")
    ]
    assert first["AWS_ACCESS_KEY_ID"] != broad_key

    probe = e2e.kubectl(
        "exec", run["pod"], "-c", "agent", "--", "python", "-c", _PROBE, run["stateId"], other_state
    )
    codes = json.loads(probe.stdout.strip().splitlines()[-1])
    assert codes == {"own": 200, "other": 403, "list_prefix": 403, "list_bucket": 403}, codes

    # A resumed run's pod gets new credentials; the run goes on with them.
    e2e.kubectl("delete", "pod", run["pod"], "--wait=false")
    done = status(wait_for_run(e2e, name, in_phase("Succeeded"), "Succeeded after the loss"))
    assert done["attempt"] == 2
    assert done["answer"].startswith(CLOSED_ON_STOP), done["answer"]
    second = secret_data(e2e, f"{name}-store-credentials")
    assert second["AWS_ACCESS_KEY_ID"] != first["AWS_ACCESS_KEY_ID"]


def test_a_forks_pod_holds_credentials_for_the_fork_only_never_its_source(
    e2e: Environment,
) -> None:
    """The operator copies the source's entries with its own key; the fork's pod reads only
    the fork's State, and the store refuses it the source's (docs/fork.md)."""
    source = f"source-{uuid.uuid4().hex[:6]}"
    apply_run(e2e, source, f"Run the slow step.\n{SLOW_STEP}")
    source_state = status(wait_until_tool_runs(e2e, source))["stateId"]

    name = f"fork-{uuid.uuid4().hex[:6]}"
    body = {
        "apiVersion": "alpineagents.dev/v1",
        "kind": "AgentRun",
        "metadata": {"name": name},
        "spec": {
            "model": "claude-sonnet-5",
            "tools": ["shell"],
            "maxTurns": 5,
            "forkFrom": {"run": source, "entry": 0},  # the prompt: the fork asks again
            "env": [{"name": "ALPINEAGENTS_LOG_FORMAT", "value": "json"}],
        },
    }
    e2e.kubectl("apply", "-f", "-", input=yaml.safe_dump(body))
    fork = status(wait_until_tool_runs(e2e, name))
    assert fork["forkedFrom"]["run"] == source, fork
    assert fork["stateId"] != source_state

    probe = e2e.kubectl(
        "exec",
        fork["pod"],
        "-c",
        "agent",
        "--",
        "python",
        "-c",
        _PROBE,
        fork["stateId"],
        source_state,
    )
    codes = json.loads(probe.stdout.strip().splitlines()[-1])
    assert codes == {"own": 200, "other": 403, "list_prefix": 403, "list_bucket": 403}, codes
