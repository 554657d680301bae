"""The operator's plain parts: the pod it creates, what it reads from a saved State,
its configuration and its metrics."""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from pathlib import Path

import pytest

from alpineagents import FileStore, Message, Record, State
from alpineagents.state import UNKNOWN_RESULT
from alpineagents_operator.credentials.saved_state import read_saved, saved_view
from alpineagents_operator.kube.config import OperatorConfig
from alpineagents_operator.kube.metrics import OperatorMetrics
from alpineagents_operator.kube.pods import pod_manifest, spec_secret
from alpineagents_operator.kube.views import AgentRunView

UID = "6f1d2c3b-0000-4000-8000-000000000001"


def agentrun(**spec: object) -> AgentRunView:
    return AgentRunView.from_body(
        {
            "metadata": {"name": "triage", "namespace": "agents", "uid": UID, "generation": 1},
            "spec": {"model": "claude-sonnet-5", "prompt": "hi", **spec},
        }
    )


CONFIG = OperatorConfig(
    image="runner:1",
    store="s3://runs/prod?endpoint=minio:9000&secure=false",
    anthropic_secret="anthropic",
    store_secret="store-credentials",
    anthropic_base_url="http://model:8080",
)


def env_of(pod: dict[str, object]) -> dict[str, object]:
    container = pod["spec"]["containers"][0]  # type: ignore[index]
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in container["env"]}


def secrets_named(pod: dict[str, object]) -> set[str]:
    """Every Secret a pod refers to (env, envFrom, volumes)."""
    found: set[str] = set()

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key in ("secretKeyRef", "secretRef"):
                if isinstance(node.get(key), dict):
                    found.add(node[key]["name"])
            if isinstance(node.get("secret"), dict):
                found.add(node["secret"]["secretName"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(pod)
    return found


# ------------------------------------------------------------------------------ the pod
def test_the_charts_prices_reach_every_run_pod() -> None:
    table = '{"claude-sonnet": {"input": 2, "output": 10}}'
    priced = replace(CONFIG, prices=table)
    env = pod_manifest(agentrun(), 1, priced)["spec"]["containers"][0]["env"]
    assert {"name": "ALPINEAGENTS_PRICES", "value": table} in env
    plain = pod_manifest(agentrun(), 1, CONFIG)["spec"]["containers"][0]["env"]
    assert all(e["name"] != "ALPINEAGENTS_PRICES" for e in plain)


def test_the_pod_is_owned_labelled_and_named_by_attempt() -> None:
    pod = pod_manifest(agentrun(), 3, CONFIG)
    meta = pod["metadata"]
    assert meta["name"] == "triage-3" and meta["namespace"] == "agents"
    assert meta["labels"] == {
        "app.kubernetes.io/name": "alpineagents",
        "app.kubernetes.io/component": "agent-run",
        "app.kubernetes.io/managed-by": "alpineagents-operator",
        "alpineagents.dev/run": "triage",
        "alpineagents.dev/attempt": "3",
    }
    [owner] = meta["ownerReferences"]
    assert owner == {
        "apiVersion": "alpineagents.dev/v1",
        "kind": "AgentRun",
        "name": "triage",
        "uid": UID,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def test_the_pod_is_locked_down() -> None:
    spec = pod_manifest(agentrun(), 1, CONFIG)["spec"]
    assert spec["restartPolicy"] == "Never"
    assert spec["automountServiceAccountToken"] is False
    assert spec["terminationGracePeriodSeconds"] == 30
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] == 65532
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    [container] = spec["containers"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert set(mounts) == {
        "/tmp",
        "/work",
        "/etc/alpineagents",
        "/var/run/secrets/alpineagents/store",
    }
    assert mounts["/etc/alpineagents"]["readOnly"] is True
    assert mounts["/var/run/secrets/alpineagents/store"]["readOnly"] is True
    assert container["workingDir"] == "/work"
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["tmp"]["emptyDir"] == volumes["work"]["emptyDir"] == {"sizeLimit": "2Gi"}
    assert volumes["spec"]["secret"] == {"secretName": "triage-1-spec", "defaultMode": 0o440}
    assert volumes["store-credentials"]["secret"] == {
        "secretName": "triage-store-credentials",
        "defaultMode": 0o440,
    }
    # Limited even when the AgentRun says nothing: a runaway tool cannot take the node.
    assert container["resources"] == {
        "requests": {"cpu": "100m", "memory": "256Mi"},
        "limits": {"memory": "1Gi", "ephemeral-storage": "2Gi"},
    }
    assert container["terminationMessagePath"] == "/dev/termination-log"
    assert container["command"] == ["python", "-m", "alpineagents", "run"]
    assert container["image"] == "runner:1"


def test_the_pod_gets_the_runner_contract_and_secrets_by_reference() -> None:
    run = agentrun(tools=["shell"], approvals=[{"callId": "c1", "allow": True}])
    pod = pod_manifest(run, 1, CONFIG)
    env = env_of(pod)
    assert "ALPINEAGENTS_SPEC" not in env  # exec refuses one variable over 128 KiB
    assert env["ALPINEAGENTS_SPEC_FILE"] == "/etc/alpineagents/spec.json"
    [mount] = [m for m in pod["spec"]["containers"][0]["volumeMounts"] if m["name"] == "spec"]
    assert mount == {"name": "spec", "mountPath": "/etc/alpineagents", "readOnly": True}
    [volume] = [v for v in pod["spec"]["volumes"] if v["name"] == "spec"]
    assert volume["secret"] == {"secretName": "triage-1-spec", "defaultMode": 0o440}
    assert env["ALPINEAGENTS_STORE"] == CONFIG.store
    assert env["ALPINEAGENTS_STATE_ID"] == "agents.triage.6f1d2c3b"
    assert env["TERMINATION_MESSAGE_PATH"] == "/dev/termination-log"
    assert env["ANTHROPIC_BASE_URL"] == "http://model:8080"
    assert env["ANTHROPIC_API_KEY"] == {
        "secretKeyRef": {"name": "anthropic", "key": "ANTHROPIC_API_KEY"}
    }
    # The run's own credentials, as files the runner reads again when they are renewed;
    # never the store Secret's broad key.
    assert env["AWS_SECRET_ACCESS_KEY_FILE"] == (
        "/var/run/secrets/alpineagents/store/AWS_SECRET_ACCESS_KEY"
    )
    assert env["AWS_SESSION_TOKEN_FILE"] == "/var/run/secrets/alpineagents/store/AWS_SESSION_TOKEN"
    assert "AWS_SECRET_ACCESS_KEY" not in env and "AWS_ACCESS_KEY_ID" not in env
    assert secrets_named(pod_manifest(run, 1, CONFIG)) == {
        "anthropic",
        "triage-store-credentials",
        "triage-1-spec",
    }


def test_with_shared_credentials_the_pod_gets_the_store_secret() -> None:
    shared = replace(CONFIG, run_credentials="shared")
    pod = pod_manifest(agentrun(), 1, shared)
    env = env_of(pod)
    assert env["MINIO_SECRET_KEY"] == {
        "secretKeyRef": {"name": "store-credentials", "key": "AWS_SECRET_ACCESS_KEY"}
    }
    # Never under AWS_* names: a Bedrock run's AWS SDK would sign with the store's key.
    assert not [name for name in env if name.startswith("AWS_")]
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["tmp", "work", "spec"]


def test_a_file_store_needs_no_credentials_at_all() -> None:
    pod = pod_manifest(agentrun(store="file:///data/runs"), 1, CONFIG)
    env = env_of(pod)
    assert not [name for name in env if name.startswith("AWS_")]
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["tmp", "work", "spec"]


def test_the_spec_travels_in_an_immutable_secret_owned_by_the_agentrun() -> None:
    run = agentrun(prompt="é" * 10, approvals=[{"callId": "c1", "allow": True}])
    secret = spec_secret(run, 2)
    assert secret["metadata"]["name"] == "triage-2-spec"
    assert secret["metadata"]["labels"]["alpineagents.dev/run"] == "triage"
    assert secret["metadata"]["labels"]["alpineagents.dev/attempt"] == "2"
    assert [o["uid"] for o in secret["metadata"]["ownerReferences"]] == [UID]
    assert secret["metadata"]["annotations"] == {"alpineagents.dev/state-id": run.state_id}
    text = base64.b64decode(secret["data"]["spec.json"]).decode("utf-8")
    assert json.loads(text) == dict(run.spec)
    assert "é" * 10 in text  # not \u-escaped: six bytes a character would not fit


def test_run_pods_ask_the_shared_limiter_in_their_own_namespace_share() -> None:
    from dataclasses import replace

    config = replace(CONFIG, pacer_url="http://pacer.system.svc:8470")
    run = agentrun(env=[{"name": "ALPINEAGENTS_PACER_SHARE", "value": "someone-else"}])
    env = env_of(pod_manifest(run, 1, config))
    assert env["ALPINEAGENTS_PACER"] == "http://pacer.system.svc:8470"
    # Read by the kubelet from the pod itself: a run cannot take another namespace's share.
    assert env["ALPINEAGENTS_PACER_SHARE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert "ALPINEAGENTS_PACER" not in env_of(pod_manifest(agentrun(), 1, CONFIG))


def test_the_agentrun_shapes_its_pod() -> None:
    run = agentrun(
        image="mine:2",
        store="file:///data/runs",
        resources={"limits": {"memory": "1Gi"}},
        env=[
            {"name": "ANTHROPIC_BASE_URL", "value": "http://proxy"},
            {"name": "ALPINEAGENTS_STATE_ID", "value": "hijack"},
            {"name": "EXTRA", "value": "1"},
        ],
        envFrom=[{"secretRef": {"name": "more"}}],
        serviceAccountName="agent",
        nodeSelector={"pool": "agents"},
        tolerations=[{"key": "agents", "operator": "Exists"}],
        affinity={"nodeAffinity": {}},
    )
    pod = pod_manifest(run, 1, CONFIG)
    spec, container = pod["spec"], pod["spec"]["containers"][0]
    env = env_of(pod)
    assert container["image"] == "mine:2"
    assert container["resources"] == {
        "requests": {"cpu": "100m", "memory": "256Mi"},
        "limits": {"memory": "1Gi", "ephemeral-storage": "2Gi"},
    }
    assert container["envFrom"] == [{"secretRef": {"name": "more"}}]
    assert env["ALPINEAGENTS_STORE"] == "file:///data/runs"
    assert env["ANTHROPIC_BASE_URL"] == "http://proxy"  # theirs wins
    assert env["ALPINEAGENTS_STATE_ID"] == "agents.triage.6f1d2c3b"  # the contract does not
    assert env["EXTRA"] == "1"
    names = [item["name"] for item in container["env"]]
    assert len(names) == len(set(names))
    assert spec["serviceAccountName"] == "agent"
    assert spec["nodeSelector"] == {"pool": "agents"}
    assert spec["tolerations"] == [{"key": "agents", "operator": "Exists"}]
    assert spec["affinity"] == {"nodeAffinity": {}}


def test_mcp_server_secrets_reach_the_pod_by_reference_and_cannot_be_overridden() -> None:
    token = {"name": "github-mcp", "key": "token"}
    run = agentrun(
        mcpServers=[
            {
                "name": "github",
                "url": "http://github-mcp:8080/mcp",
                "headers": [{"name": "Authorization", "secretKeyRef": token}],
            },
            {
                "name": "files",
                "command": ["files-mcp"],
                "env": [
                    {"name": "LEVEL", "value": "debug"},
                    {"name": "FILES_TOKEN", "secretKeyRef": {"name": "files", "key": "t"}},
                ],
            },
        ],
        env=[{"name": "ALPINEAGENTS_MCP_GITHUB_HEADER_AUTHORIZATION", "value": "Bearer forged"}],
    )
    env = env_of(pod_manifest(run, 1, CONFIG))
    assert env["ALPINEAGENTS_MCP_GITHUB_HEADER_AUTHORIZATION"] == {"secretKeyRef": token}
    assert env["ALPINEAGENTS_MCP_FILES_ENV_FILES_TOKEN"] == {
        "secretKeyRef": {"name": "files", "key": "t"}
    }
    assert [name for name in env if name.startswith("ALPINEAGENTS_MCP_")] == [
        "ALPINEAGENTS_MCP_GITHUB_HEADER_AUTHORIZATION",
        "ALPINEAGENTS_MCP_FILES_ENV_FILES_TOKEN",
    ]  # plain values stay in the spec; only Secret references become variables


def test_no_secret_refs_when_none_are_configured() -> None:
    env = env_of(pod_manifest(agentrun(), 1, OperatorConfig(anthropic_secret="")))
    assert "ANTHROPIC_API_KEY" not in env and "AWS_ACCESS_KEY_ID" not in env


# ------------------------------------------------------------------------------ the store
def test_a_state_killed_mid_tool_shows_its_aborted_call_and_last_seq(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "runs")
    state = State("agents.triage.6f1d2c3b", [Message.user("go")])
    state.add("model_request", "request", {})
    reply = Message.assistant(
        [{"type": "tool_use", "id": "toolu_1", "name": "step", "input": {"name": "a"}}]
    )
    state.add("model_reply", "reply", {"message": reply.to_dict(), "usage": {"input_tokens": 3}})
    store.save(state)  # then the pod is killed: the call never gets a result
    view = read_saved(store, state.id)
    assert view.exists and view.error is None
    assert view.last_saved_seq == 2
    assert view.aborted_calls == ("toolu_1",)
    assert view.answer is None and view.stopped is None
    assert view.turns == 1 and view.usage["input_tokens"] == 3
    # Reading changes nothing in the store: the closing entry is the next pod's to save.
    record = store.read(state.id)
    assert record is not None and len(record.entries) == 3
    assert store.load(state.id).history[3].text.startswith(UNKNOWN_RESULT[:20])


def test_a_missing_state_and_an_unreadable_one(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "runs")
    assert not read_saved(store, "nope").exists
    unreadable = saved_view("x", store_record({"v": 99}))
    assert unreadable.exists and unreadable.error is not None and "format 99" in unreadable.error


def store_record(info: dict[str, object]) -> Record:
    return Record([], dict(info))


# ------------------------------------------------------------------------------ config
def test_config_from_the_environment() -> None:
    config = OperatorConfig.from_env(
        {
            "ALPINEAGENTS_NAMESPACES": "agents, team-*",
            "ALPINEAGENTS_IMAGE": "img:1",
            "ALPINEAGENTS_STORE": "s3://b/p",
            "ALPINEAGENTS_POD_COMMAND": '["alpineagents", "run"]',
            "ALPINEAGENTS_RESYNC_SECONDS": "5",
            "ANTHROPIC_BASE_URL": "http://model",
        }
    )
    assert config.namespaces == ("agents", "team-*")
    # The namespaces whose run pods the operator's own listing at its start keeps, as
    # kopf's watches take them in (each entry on its own; "!glob": all but those).
    assert [config.watches_namespace(n) for n in ("agents", "team-a", "other")] == [
        True,
        True,
        False,
    ]
    assert OperatorConfig.from_env({}).watches_namespace("any")
    but_system = OperatorConfig.from_env({"ALPINEAGENTS_NAMESPACES": "!kube-*"})
    assert but_system.watches_namespace("agents") and not but_system.watches_namespace("kube-x")
    assert config.pod_command == ("alpineagents", "run")
    assert config.resync_seconds == 5.0 and config.anthropic_base_url == "http://model"
    assert OperatorConfig.from_env({}).pod_command == ("python", "-m", "alpineagents", "run")
    with pytest.raises(ValueError, match="JSON list of strings"):
        OperatorConfig.from_env({"ALPINEAGENTS_POD_COMMAND": "python -m x"})
    assert OperatorConfig.from_env({}).per_run_credentials
    shared = OperatorConfig.from_env(
        {"ALPINEAGENTS_RUN_CREDENTIALS": "Shared", "ALPINEAGENTS_RUN_CREDENTIALS_SECONDS": "900"}
    )
    assert not shared.per_run_credentials and shared.run_credentials_seconds == 900
    with pytest.raises(ValueError, match="sts or shared"):
        OperatorConfig.from_env({"ALPINEAGENTS_RUN_CREDENTIALS": "maybe"})
    owned = OperatorConfig.from_env({"ALPINEAGENTS_WARM_POOL_OWNER": "ClusterRole/op-ns"})
    assert owned.warm_pool_owner == ("ClusterRole", "op-ns")
    assert OperatorConfig.from_env({}).warm_pool_owner is None
    with pytest.raises(ValueError, match="ALPINEAGENTS_WARM_POOL_OWNER must be Role/<name>"):
        OperatorConfig.from_env({"ALPINEAGENTS_WARM_POOL_OWNER": "Deployment/op"})
    limits = OperatorConfig.from_env(
        {"ALPINEAGENTS_RUN_RESOURCES": '{"limits": {"memory": "2Gi", "cpu": "1"}}'}
    )
    assert limits.run_resources == {"limits": {"memory": "2Gi", "cpu": "1"}}
    with pytest.raises(ValueError, match="ALPINEAGENTS_RUN_RESOURCES must be a JSON object"):
        OperatorConfig.from_env({"ALPINEAGENTS_RUN_RESOURCES": '{"memory": "2Gi"}'})
    with pytest.raises(ValueError, match="900 to 43200"):
        OperatorConfig.from_env({"ALPINEAGENTS_RUN_CREDENTIALS_SECONDS": "60"})
    priced = OperatorConfig.from_env(
        {"ALPINEAGENTS_PRICES": '{"claude-sonnet": {"input": 2, "output": 10}}'}
    )
    assert priced.prices == '{"claude-sonnet": {"input": 2, "output": 10}}'
    assert OperatorConfig.from_env({"ALPINEAGENTS_PRICES": "{}"}).prices == ""
    with pytest.raises(ValueError, match="ALPINEAGENTS_PRICES must be a JSON object"):
        OperatorConfig.from_env({"ALPINEAGENTS_PRICES": '{"claude-sonnet": 3}'})


def test_runs_by_phase_follow_each_run() -> None:
    metrics = OperatorMetrics()
    metrics.record_phase("a", "one", "Running")
    metrics.record_phase("a", "two", "Running")
    metrics.record_phase("a", "one", "Succeeded")
    metrics.record_phase("a", "two", None)

    def value(phase: str) -> float:
        sample = metrics.registry.get_sample_value("alpineagents_runs", {"phase": phase})
        return float(sample or 0)

    assert (value("Running"), value("Succeeded")) == (0, 1)


def test_with_encryption_the_pod_gets_the_keyring_by_reference() -> None:
    config = replace(CONFIG, encryption_secret="keyring")
    env = env_of(pod_manifest(agentrun(), 1, config))
    assert env["ALPINEAGENTS_ENCRYPTION_KEYS"] == {
        "secretKeyRef": {"name": "keyring", "key": "keys"}
    }
    # Listed as a secret: the runner masks the keys wherever it writes.
    assert "ALPINEAGENTS_ENCRYPTION_KEYS" in str(env["ALPINEAGENTS_SECRET_ENV"]).split(",")
    # Not the AgentRun's to override.
    run = agentrun(env=[{"name": "ALPINEAGENTS_ENCRYPTION_KEYS", "value": "mine:xx"}])
    assert env_of(pod_manifest(run, 1, config))["ALPINEAGENTS_ENCRYPTION_KEYS"] == {
        "secretKeyRef": {"name": "keyring", "key": "keys"}
    }


def test_an_agentrun_may_change_its_limits_but_never_remove_one() -> None:
    # Leaving a limit out, or giving resources of its own, keeps the operator's others.
    run = agentrun(resources={"limits": {"memory": "8Gi"}, "requests": {"cpu": "2"}})
    pod = pod_manifest(run, 1, CONFIG)
    container = pod["spec"]["containers"][0]
    assert container["resources"] == {
        "requests": {"cpu": "2", "memory": "256Mi"},
        "limits": {"memory": "8Gi", "ephemeral-storage": "2Gi"},
    }
    # The writable folders are bounded by the disk limit too, whatever the run asks.
    bigger = pod_manifest(agentrun(resources={"limits": {"ephemeral-storage": "5Gi"}}), 1, CONFIG)
    volumes = {v["name"]: v for v in bigger["spec"]["volumes"]}
    assert volumes["tmp"]["emptyDir"] == volumes["work"]["emptyDir"] == {"sizeLimit": "5Gi"}
