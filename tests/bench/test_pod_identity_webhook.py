"""The bench's IRSA (tests/bench/pod_identity_webhook.py) does what EKS's does, on the real
kube-apiserver: a pod of the annotated ServiceAccount is given the projected token and the
AWS SDK's variables, another pod is left alone, and the local STS takes only a token the
cluster issued to that ServiceAccount for STS's audience."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
import yaml

from tests.bench.control_plane import ControlPlane
from tests.bench.pod_identity_webhook import (
    AUDIENCE,
    ROLE_ANNOTATION,
    TOKEN_DIR,
    ClusterSTS,
    PodIdentityWebhook,
)

pytestmark = pytest.mark.bench_infra
ROLE = "arn:aws:iam::123456789012:role/runs"


@pytest.fixture
def namespace(control_plane: ControlPlane) -> Iterator[str]:
    name = f"irsa-{uuid.uuid4().hex[:6]}"
    control_plane.kubectl("create", "namespace", name)
    for account in ("runs", "other"):
        body = {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": account, "namespace": name},
        }
        if account == "runs":
            body["metadata"]["annotations"] = {ROLE_ANNOTATION: ROLE}  # type: ignore[index]
        control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(body))
    yield name
    control_plane.kubectl("delete", "namespace", name, "--wait=false", check=False)


def _pod(plane: ControlPlane, namespace: str, name: str, account: str) -> dict[str, object]:
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "serviceAccountName": account,
            "automountServiceAccountToken": False,
            "containers": [{"name": "runner", "image": "runner:dev"}],
        },
    }
    made = plane.kubectl("create", "-f", "-", "-o", "json", input=yaml.safe_dump(body))
    pod: dict[str, object] = json.loads(made.stdout)
    return pod


def test_a_pod_of_the_annotated_account_gets_the_token_and_the_sdk_variables(
    control_plane: ControlPlane, namespace: str
) -> None:
    with PodIdentityWebhook(control_plane, namespace, "runs", ROLE) as webhook:
        given = _pod(control_plane, namespace, "given", "runs")
        other = _pod(control_plane, namespace, "other", "other")

    spec = given["spec"]
    assert isinstance(spec, dict)
    (volume,) = spec["volumes"]
    (source,) = volume["projected"]["sources"]
    assert source["serviceAccountToken"]["audience"] == AUDIENCE
    (container,) = spec["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env == {"AWS_ROLE_ARN": ROLE, "AWS_WEB_IDENTITY_TOKEN_FILE": f"{TOKEN_DIR}/token"}
    assert container["volumeMounts"][0]["mountPath"] == TOKEN_DIR
    assert "volumes" not in other["spec"]  # type: ignore[operator]
    assert webhook.mutated == ["given"]
    listing = control_plane.kubectl("get", "mutatingwebhookconfigurations", "-o", "name").stdout
    assert webhook.name not in listing  # unregistered when done


def test_the_sts_takes_only_the_accounts_token_for_its_audience(
    control_plane: ControlPlane, namespace: str
) -> None:
    sts = ClusterSTS(control_plane, ROLE, namespace, "runs")

    def token(account: str, audience: str) -> str:
        made = control_plane.kubectl(
            "create", "token", account, "-n", namespace, f"--audience={audience}"
        )
        return made.stdout.strip()

    assert sts.accepts(token("runs", AUDIENCE))
    assert not sts.accepts(token("runs", "https://kubernetes.default.svc.cluster.local"))
    assert not sts.accepts(token("other", AUDIENCE))
    assert not sts.accepts("not-a-token")
