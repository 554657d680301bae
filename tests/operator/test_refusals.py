"""What the operator refuses to act for, as pure functions: Secrets that hold its keys,
stores its key must not reach, State ids read from status, and env shapes no pod takes.

The same refusals on the bench's real kube-apiserver and MinIO are in
``test_refused_runs.py``.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from alpineagents_operator.credentials.store_policy import (
    StoreNotAllowed,
    guarded_opener,
    store_refusal,
)
from alpineagents_operator.deciding.decide import refused
from alpineagents_operator.kube.config import OperatorConfig
from alpineagents_operator.kube.resource_caps import parse_quantity
from alpineagents_operator.kube.views import AgentRunView
from alpineagents_operator.watching.refusals import env_shape_problem, run_refusal, secret_names

UID = "6f1d2c3b-0000-4000-8000-000000000001"
STORE = "s3://runs/prod?endpoint=minio.alpine.svc:9000&secure=false"
CONFIG = OperatorConfig(
    store=STORE,
    store_secret="aa-alpineagents-store",
    protected_secrets=("aa-alpineagents-minio", "aa-alpineagents-anthropic"),
)
NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def agentrun(status: dict[str, Any] | None = None, **spec: Any) -> AgentRunView:
    return AgentRunView.from_body(
        {
            "metadata": {"name": "triage", "namespace": "agents", "uid": UID, "generation": 1},
            "spec": {"model": "claude-sonnet-5", "prompt": "hi", **spec},
            "status": status or {},
        }
    )


def secret_env(secret: Any) -> dict[str, Any]:
    return {"name": "K", "valueFrom": {"secretKeyRef": {"name": secret, "key": "k"}}}


def header_from(secret: str) -> list[dict[str, Any]]:
    return [
        {
            "name": "leaky",
            "url": "http://mcp.example/mcp",
            "headers": [{"name": "X-Key", "secretKeyRef": {"name": secret, "key": "x"}}],
        }
    ]


def stdio_env_from(secret: str) -> list[dict[str, Any]]:
    return [
        {
            "name": "tool",
            "command": ["tool"],
            "env": [{"name": "TOKEN", "secretKeyRef": {"name": secret, "key": "x"}}],
        }
    ]


# ------------------------------------------------------------------------------ Secrets
@pytest.mark.parametrize(
    "secret", ["aa-alpineagents-minio", "aa-alpineagents-anthropic", "aa-alpineagents-store"]
)
@pytest.mark.parametrize("how", ["env", "envFrom", "mcp header", "mcp stdio env"])
def test_a_run_naming_a_secret_of_the_installation_is_refused(secret: str, how: str) -> None:
    specs: dict[str, dict[str, Any]] = {
        "env": {"env": [secret_env(secret)]},
        "envFrom": {"envFrom": [{"secretRef": {"name": secret}}]},
        "mcp header": {"mcpServers": header_from(secret)},
        "mcp stdio env": {"mcpServers": stdio_env_from(secret)},
    }
    refusal = run_refusal(agentrun(**specs[how]), CONFIG)
    assert refusal is not None and refusal.reason == "SecretNotAllowed"
    assert repr(secret) in refusal.message and "Remove the reference" in refusal.message


@pytest.mark.parametrize("secret", ["other-run-store-credentials", "other-run-3-spec"])
def test_a_run_naming_a_secret_the_operator_wrote_for_a_run_is_refused(secret: str) -> None:
    refusal = run_refusal(agentrun(envFrom=[{"secretRef": {"name": secret}}]), CONFIG)
    assert refusal is not None and refusal.reason == "SecretNotAllowed"
    assert "the operator's" in refusal.message


def test_a_run_naming_its_own_secrets_is_not_refused() -> None:
    run = agentrun(
        env=[secret_env("github-token")],
        envFrom=[{"secretRef": {"name": "team-keys"}}, {"configMapRef": {"name": "settings"}}],
        mcpServers=header_from("mcp-token"),
    )
    assert run_refusal(run, CONFIG) is None
    assert secret_names(run.spec) == ["github-token", "team-keys", "mcp-token"]


def test_with_shared_credentials_the_store_secret_is_the_pods_anyway() -> None:
    shared = replace(CONFIG, run_credentials="shared")
    assert run_refusal(agentrun(env=[secret_env("aa-alpineagents-store")]), shared) is None
    # The chart's other Secrets stay refused in either mode.
    assert run_refusal(agentrun(env=[secret_env("aa-alpineagents-minio")]), shared) is not None


def test_the_protected_secrets_come_from_the_environment() -> None:
    config = OperatorConfig.from_env(
        {
            "ALPINEAGENTS_PROTECTED_SECRETS": " r-minio, r-store,,r-minio ",
            "ALPINEAGENTS_ALLOWED_STORES": "s3://other/x?endpoint=h:1",
        }
    )
    assert config.protected_secrets == ("r-minio", "r-store")
    assert config.allowed_stores == ("s3://other/x?endpoint=h:1",)


# ------------------------------------------------------------------------------ shapes
ODD_SHAPES: list[tuple[str, dict[str, Any], str]] = [
    ("secretRef-as-a-string", {"envFrom": [{"secretRef": "aa-alpineagents-minio"}]}, "secretRef"),
    ("secretKeyRef-name-a-list", {"env": [secret_env(["aa-alpineagents-minio"])]}, ".name"),
    (
        "secretKeyRef-as-a-string",
        {"env": [{"name": "K", "valueFrom": {"secretKeyRef": "s"}}]},
        "secretKeyRef",
    ),
    (
        "two-sources",
        {
            "env": [
                {
                    "name": "K",
                    "valueFrom": {
                        "secretKeyRef": {"name": "a", "key": "b"},
                        "fieldRef": {"fieldPath": "x"},
                    },
                }
            ]
        },
        "exactly one",
    ),
    (
        "unknown-source",
        {"env": [{"name": "K", "valueFrom": {"vaultRef": {"name": "a"}}}]},
        "vaultRef",
    ),
    ("value-and-valueFrom", {"env": [{"name": "K", "value": "v", **secret_env("a")}]}, "both"),
    (
        "envFrom-both-kinds",
        {"envFrom": [{"secretRef": {"name": "a"}, "configMapRef": {"name": "b"}}]},
        "exactly one",
    ),
    ("envFrom-item-a-string", {"envFrom": ["aa-alpineagents-minio"]}, "spec.envFrom[0]"),
    ("envFrom-not-a-list", {"envFrom": {"secretRef": {"name": "a"}}}, "list"),
    ("secretRef-without-name", {"envFrom": [{"secretRef": {}}]}, "needs name"),
    ("secretRef-name-empty", {"envFrom": [{"secretRef": {"name": ""}}]}, "empty"),
    (
        "optional-a-string",
        {"envFrom": [{"secretRef": {"name": "a", "optional": "yes"}}]},
        "optional",
    ),
    (
        "key-a-number",
        {"env": [{"name": "K", "valueFrom": {"secretKeyRef": {"name": "a", "key": 1}}}]},
        ".key",
    ),
    ("resources-limits-a-list", {"resources": {"limits": ["1Gi"]}}, "spec.resources.limits"),
    ("resources-a-string", {"resources": "big"}, "spec.resources"),
]


@pytest.mark.parametrize(
    ("spec", "words"), [(s, w) for _, s, w in ODD_SHAPES], ids=[i for i, _, _ in ODD_SHAPES]
)
def test_an_odd_env_shape_is_refused_with_the_field_named(spec: dict[str, Any], words: str) -> None:
    problem = env_shape_problem(spec)
    assert problem is not None and words in problem
    refusal = run_refusal(agentrun(**spec), CONFIG)
    assert refusal is not None and refusal.reason == "InvalidSpec"
    # The message names the field, never a value (which may be confidential).
    assert "aa-alpineagents-minio" not in refusal.message


def test_the_shapes_a_pod_takes_pass() -> None:
    spec = {
        "env": [
            {"name": "A", "value": "1"},
            {"name": "B"},
            secret_env("s"),
            {
                "name": "C",
                "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k", "optional": True}},
            },
            {"name": "D", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {
                "name": "E",
                "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": 1}},
            },
        ],
        "envFrom": [{"secretRef": {"name": "s"}, "prefix": "S_"}, {"configMapRef": {"name": "c"}}],
        "resources": {"requests": {"cpu": "100m"}, "limits": {"memory": "1Gi", "cpu": 2}},
    }
    assert env_shape_problem(spec) is None


def test_a_refused_run_fails_once_with_one_event_and_no_pod() -> None:
    run = agentrun(envFrom=[{"secretRef": "x"}])
    refusal = run_refusal(run, CONFIG)
    assert refusal is not None
    decision = refused(run, 1, refusal, NOW)
    assert decision.status["phase"] == "Failed" and decision.status["reason"] == "InvalidSpec"
    assert decision.create_pod is None
    assert [(e.type, e.reason) for e in decision.events] == [("Warning", "Failed")]
    # Failed is final: the next step refuses nothing and so posts nothing again.
    failed = agentrun({**decision.status}, envFrom=[{"secretRef": "x"}])
    assert run_refusal(failed, CONFIG) is None


# ------------------------------------------------------------------------------ State id
def test_the_state_id_is_derived_never_read_from_status() -> None:
    derived = "agents.triage.6f1d2c3b"
    assert agentrun().state_id == derived
    patched = agentrun({"phase": "Interrupted", "attempt": 1, "stateId": "other.victim.0a0a0a0a"})
    assert patched.state_id == derived
    refusal = run_refusal(patched, CONFIG)
    assert refusal is not None and refusal.reason == "StateIdMismatch"
    assert "'other.victim.0a0a0a0a'" in refusal.message and repr(derived) in refusal.message


def test_a_run_of_the_previous_version_with_the_derived_id_goes_on() -> None:
    earlier = agentrun({"phase": "Running", "attempt": 1, "stateId": "agents.triage.6f1d2c3b"})
    assert run_refusal(earlier, CONFIG) is None


# ------------------------------------------------------------------------------ stores
ALLOWED_STORES = [
    STORE,
    "s3://runs/prod/team-a?endpoint=minio.alpine.svc:9000&secure=false",
    "s3://runs/prod/team-a/b.c_d?endpoint=http://minio.alpine.svc:9000&timeout=2",
    "s3://runs//prod/?endpoint=MINIO.alpine.svc:9000&secure=false&encrypted=true",
]
REFUSED_STORES = [
    ("s3://other-bucket/prod?endpoint=minio.alpine.svc:9000&secure=false", "bucket"),
    ("s3://runs/prod?endpoint=attacker.example:9000&secure=false", "endpoint"),
    ("s3://runs/prod?endpoint=minio.alpine.svc:9001&secure=false", "endpoint"),
    ("s3://runs/prod?endpoint=minio.alpine.svc:9000", "endpoint"),  # https: another service
    ("s3://runs/prod?secure=false", "endpoint"),  # AWS itself
    ("s3://runs/elsewhere?endpoint=minio.alpine.svc:9000&secure=false", "not under"),
    ("s3://runs?endpoint=minio.alpine.svc:9000&secure=false", "not under"),
    ("s3://runs/product?endpoint=minio.alpine.svc:9000&secure=false", "not under"),
    # Inside another run's State folder (its encoded id holds %2E).
    (
        "s3://runs/prod/agents%252Evictim%252E0a0a0a0a?endpoint=minio.alpine.svc:9000&secure=false",
        "not plain",
    ),
    ("s3://runs/prod/../other?endpoint=minio.alpine.svc:9000&secure=false", "'..'"),
    ("s3://runs/prod/x?endpoint=minio.alpine.svc:9000&secure=false&sneaky=1", "unknown option"),
    ("file:///etc", "a file store"),
]


@pytest.mark.parametrize("url", ALLOWED_STORES)
def test_a_store_under_the_configured_one_is_allowed(url: str) -> None:
    assert store_refusal(url, CONFIG, env={}) is None


@pytest.mark.parametrize(("url", "words"), REFUSED_STORES)
def test_a_store_elsewhere_is_refused(url: str, words: str) -> None:
    problem = store_refusal(url, CONFIG, env={})
    assert problem is not None and words in problem
    assert "store.allowedStores" in problem or "not a store URL" in problem


def test_an_encrypted_store_cannot_be_left_through_spec_store() -> None:
    encrypted = replace(CONFIG, store=STORE + "&encrypted=true")
    problem = store_refusal(STORE, encrypted, env={})
    assert problem is not None and "encrypted=true" in problem
    assert store_refusal(STORE + "&encrypted=true", encrypted, env={}) is None
    assert (
        store_refusal(STORE.replace("prod", "prod/t") + "&encrypted=TRUE", encrypted, env={})
        is None
    )


def test_the_allow_list_opens_more_stores_and_no_others() -> None:
    other = "s3://archive/runs?endpoint=s3.example.com"
    config = replace(CONFIG, allowed_stores=(other,))
    assert store_refusal("s3://archive/runs/x?endpoint=s3.example.com:443", config, env={}) is None
    assert store_refusal("s3://archive/other?endpoint=s3.example.com", config, env={}) is not None


def test_file_stores_stay_under_the_configured_folder() -> None:
    config = OperatorConfig(store="file:///var/lib/alpineagents/runs")
    assert store_refusal("file:///var/lib/alpineagents/runs/team", config, env={}) is None
    assert store_refusal("/var/lib/alpineagents/runs/team", config, env={}) is None
    assert store_refusal("file:///var/lib/alpineagents", config, env={}) is not None
    assert store_refusal("var/lib/alpineagents/runs", config, env={}) is not None


def test_a_run_with_a_store_elsewhere_is_refused_and_nothing_is_opened() -> None:
    opened: list[str] = []

    def open_store(url: str) -> Any:
        opened.append(url)
        return object()

    run = agentrun(store="s3://runs/prod?endpoint=attacker.example:80&secure=false")
    refusal = run_refusal(run, CONFIG)
    assert refusal is not None and refusal.reason == "StoreNotAllowed"
    guarded = guarded_opener(open_store, CONFIG)
    with pytest.raises(StoreNotAllowed, match=r"attacker\.example"):
        guarded(str(run.spec["store"]))
    guarded(STORE)
    assert opened == [STORE]


# ------------------------------------------------------------------------------ resource caps
CAPPED = replace(CONFIG, max_run_resources={"cpu": "4", "memory": "8Gi"})


@pytest.mark.parametrize(
    ("amount", "value"),
    [
        ("1Gi", 1024**3),
        ("500m", 0.5),
        ("2", 2),
        (3, 3),
        ("8G", 8 * 10**9),
        ("2e9", 2 * 10**9),
        ("1.5Ki", 1536),
        ("1E", 10**18),
    ],
)
def test_quantities_read_as_kubernetes_reads_them(amount: str | int, value: float) -> None:
    assert parse_quantity(amount) == pytest.approx(value)


@pytest.mark.parametrize("amount", ["", "lots", "1 Gi", "1GB", "Gi", True])
def test_what_is_no_quantity_is_refused(amount: Any) -> None:
    with pytest.raises(ValueError):
        parse_quantity(amount)


@pytest.mark.parametrize(
    "resources",
    [
        pytest.param({"limits": {"memory": "9Gi"}}, id="a-limit"),
        pytest.param({"requests": {"cpu": "4500m"}}, id="a-request"),
        pytest.param({"limits": {"memory": "8589934593"}}, id="one-byte-over"),
    ],
)
def test_a_run_asking_more_than_the_cap_is_refused_with_what_it_asked(
    resources: dict[str, Any],
) -> None:
    refusal = run_refusal(agentrun(resources=resources), CAPPED)
    assert refusal is not None and refusal.reason == "ResourcesNotAllowed" and refusal.final
    ((part, amounts),) = resources.items()
    ((resource, amount),) = amounts.items()
    cap = CAPPED.max_run_resources[resource]
    assert refusal.message == (
        f"spec.resources.{part}.{resource} asks {amount}, more than the {cap} the "
        "platform allows a run (the chart's runs.maxResources)"
    )


def test_a_run_within_the_cap_or_asking_an_uncapped_resource_goes_on() -> None:
    within = {"limits": {"memory": "8Gi", "cpu": 4, "ephemeral-storage": "100Gi"}}
    assert run_refusal(agentrun(resources=within), CAPPED) is None
    assert run_refusal(agentrun(resources={"limits": {"memory": "64Gi"}}), CONFIG) is None


def test_an_amount_that_is_no_quantity_is_refused_before_any_pod() -> None:
    refusal = run_refusal(agentrun(resources={"limits": {"memory": "lots"}}), CAPPED)
    assert refusal is not None and refusal.reason == "ResourcesNotAllowed"
    assert refusal.message == "spec.resources.limits.memory must be a quantity like '1Gi' or '500m'"


def test_the_cap_comes_from_the_charts_json_and_a_bad_one_stops_the_operator() -> None:
    env = {"ALPINEAGENTS_RUN_MAX_RESOURCES": '{"memory": "8Gi", "cpu": 4}'}
    assert OperatorConfig.from_env(env).max_run_resources == {"memory": "8Gi", "cpu": "4"}
    assert OperatorConfig.from_env({}).max_run_resources == {}
    for bad in ('["8Gi"]', '{"memory": "lots"}', "{"):
        with pytest.raises(ValueError, match="ALPINEAGENTS_RUN_MAX_RESOURCES must be"):
            OperatorConfig.from_env({"ALPINEAGENTS_RUN_MAX_RESOURCES": bad})
