"""spec.provider on the cluster: the operator passes its Secrets to the pod by reference
(masked by the runner), labels a Foundry pod for Entra workload identity, and the chart
makes the run pods' ServiceAccount with a cloud's identity annotations and opens only the
node-local identity endpoint asked for."""

from __future__ import annotations

from typing import Any

from alpineagents_operator.kube.pods import pod_manifest
from tests.bench.helm import Helm
from tests.operator.test_operator_parts import CONFIG, agentrun, env_of


def test_provider_secrets_reach_the_pod_by_reference_and_cannot_be_overridden() -> None:
    portkey = {"name": "portkey", "key": "api-key"}
    run = agentrun(
        provider={
            "baseURL": "https://gateway.internal",
            "headers": [
                {"name": "x-portkey-provider", "value": "anthropic"},
                {"name": "x-portkey-api-key", "secretKeyRef": portkey},
            ],
        },
        env=[{"name": "ALPINEAGENTS_PROVIDER_HEADER_X_PORTKEY_API_KEY", "value": "forged"}],
    )
    env = env_of(pod_manifest(run, 1, CONFIG))
    assert env["ALPINEAGENTS_PROVIDER_HEADER_X_PORTKEY_API_KEY"] == {"secretKeyRef": portkey}
    assert "ALPINEAGENTS_PROVIDER_HEADER_X_PORTKEY_API_KEY" in str(env["ALPINEAGENTS_SECRET_ENV"])
    assert not [n for n in env if "PORTKEY_PROVIDER" in n]  # plain values stay in the spec


def test_a_foundry_run_without_a_key_is_labelled_for_entra_workload_identity() -> None:
    keyless = pod_manifest(agentrun(provider={"type": "foundry", "resource": "r"}), 1, CONFIG)
    assert keyless["metadata"]["labels"]["azure.workload.identity/use"] == "true"
    key = {"secretKeyRef": {"name": "foundry", "key": "key"}}
    keyed = pod_manifest(
        agentrun(provider={"type": "foundry", "resource": "r", "credentials": key}), 1, CONFIG
    )
    assert "azure.workload.identity/use" not in keyed["metadata"]["labels"]
    assert env_of(keyed)["ALPINEAGENTS_PROVIDER_CREDENTIALS"] == key


def _of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o.get("kind") == kind]


def test_the_chart_makes_the_run_service_account_with_identity_annotations(
    helm: Helm,
) -> None:
    role = "eks.amazonaws.com/role-arn"
    objects = helm.template(
        {
            "watchNamespaces": ["team-a", "team-b"],
            "anthropic": {"apiKey": "sk-ant-example"},
            "runs": {
                "serviceAccount": {
                    "create": True,
                    "annotations": {role: "arn:aws:iam::123456789012:role/runs"},
                    "namespaceAnnotations": {
                        "team-b": {role: "arn:aws:iam::123456789012:role/team-b"}
                    },
                }
            },
        }
    )
    made = {
        o["metadata"]["namespace"]: o
        for o in _of_kind(objects, "ServiceAccount")
        if o["metadata"]["name"].endswith("-run")
    }
    assert made["team-a"]["metadata"]["annotations"][role].endswith("role/runs")
    assert made["team-b"]["metadata"]["annotations"][role].endswith("role/team-b")
    assert made["team-a"]["automountServiceAccountToken"] is False
    (settings,) = [
        o for o in _of_kind(objects, "ConfigMap") if "ALPINEAGENTS_SERVICE_ACCOUNT" in o["data"]
    ]
    assert settings["data"]["ALPINEAGENTS_SERVICE_ACCOUNT"] == made["team-a"]["metadata"]["name"]


def _identity_rules(objects: list[dict[str, Any]]) -> set[str]:
    cidrs = set()
    for policy in _of_kind(objects, "NetworkPolicy"):
        for rule in policy["spec"].get("egress", []):
            for peer in rule.get("to", []):
                cidr = peer.get("ipBlock", {}).get("cidr", "")
                if cidr.startswith("169.254.") and not peer["ipBlock"].get("except"):
                    cidrs.add(f"{cidr}:{rule['ports'][0]['port']}")
    return cidrs


def test_the_network_policy_opens_only_the_identity_endpoint_asked_for(helm: Helm) -> None:
    assert _identity_rules(helm.template({})) == set()
    gke = helm.template({"networkPolicy": {"cloudIdentity": "gke"}})
    assert _identity_rules(gke) == {"169.254.169.254/32:80", "169.254.169.252/32:988"}
    eks = helm.template({"networkPolicy": {"cloudIdentity": "eks-pod-identity"}})
    assert _identity_rules(eks) == {"169.254.170.23/32:80"}
