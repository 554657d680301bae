"""``helm uninstall`` keeps what runs saved: the bundled MinIO's volume and the AgentRuns
outlive the release, and a new install of it finds every saved State again. What the
release ran for no run goes with it: the warm pool's waiting standbys.

The release here is one of its own, with the chart's default MinIO persistence (a
PersistentVolumeClaim). On the bench's real node a hostPath PersistentVolume stands in
for a volume provisioner (there is none); a cluster of your own uses its default
StorageClass.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.bench.helm import Helm
from tests.e2e.environment import (
    STANDBYS_WAITING,
    ClusterEnvironment,
    Environment,
    apply_run,
    in_phase,
    status,
    wait_for_pods,
    wait_for_run,
    wait_until_operator_watches,
)

pytestmark = pytest.mark.e2e
RELEASE = "keep"
CLAIM = f"data-{RELEASE}-alpineagents-minio-0"  # the StatefulSet's volumeClaimTemplate
STORAGE_CLASS = "bench-local"


def _volume(env: Environment, namespace: str) -> Iterator[str]:
    """A hostPath PersistentVolume bound in advance to MinIO's claim; yields its class."""
    folder = Path(env.real_node.workdir) / "volumes" / namespace
    folder.mkdir(parents=True)
    os.chown(folder, 65532, 65532)  # MinIO's user; fsGroup does not apply to hostPath
    name = f"{namespace}-minio"
    volume = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": STORAGE_CLASS,
            "hostPath": {"path": str(folder), "type": "Directory"},
            "claimRef": {"namespace": namespace, "name": CLAIM},
        },
    }
    env.real_node.kubectl("apply", "-f", "-", input=yaml.safe_dump(volume))
    try:
        yield STORAGE_CLASS
    finally:
        env.real_node.kubectl("delete", "pv", name, "--wait=false", check=False)


@pytest.fixture
def keep_env(e2e: Environment) -> Iterator[ClusterEnvironment]:
    namespace = f"e2e-keep-{uuid.uuid4().hex[:6]}"
    e2e.kubectl("create", "namespace", namespace)
    env = ClusterEnvironment(
        e2e.kubeconfig, e2e.kubectl_path, namespace, e2e.real_node, release=RELEASE
    )
    try:
        yield env
    finally:
        env.kubectl("delete", "agentruns", "--all", "--wait=false", check=False)
        env.kubectl("patch", "agentruns", "--all", "--type=merge", "-p",
                    '{"metadata":{"finalizers":null}}', check=False)  # fmt: skip
        e2e.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        env.close()


def test_helm_uninstall_leaves_the_saved_states_and_a_reinstall_finds_them(
    e2e: Environment, keep_env: ClusterEnvironment, helm: Helm
) -> None:
    env = keep_env
    minio: dict[str, Any] = {
        **e2e.values.get("minio", {}),
        # Fixed, so the reinstall's MinIO opens the data the first one wrote.
        "rootPassword": "keep-" + uuid.uuid4().hex,
        "persistence": {"enabled": True, "size": "1Gi"},
    }
    volumes = _volume(env, env.namespace) if env.real_node is not None else iter([""])
    minio["persistence"]["storageClass"] = next(volumes)
    values = {
        **e2e.values,
        "minio": minio,
        "operator": {"resyncSeconds": 5, "replicas": 1},
        "runs": {**e2e.values.get("runs", {}), "warmPool": 1},
    }
    try:
        helm.install(RELEASE, env.namespace, env.kubeconfig, values, "--wait", "--timeout=5m")
        wait_until_operator_watches(env)
        apply_run(env, "kept", "Remember this.")
        done = status(wait_for_run(env, "kept", in_phase("Succeeded"), "Succeeded"))
        saved = env.history(done["stateId"])
        assert saved and [e["kind"] for e in saved].count("model_reply") == 1

        wait_for_pods(env, STANDBYS_WAITING, lambda pods: len(pods) == 1, "one waiting")

        helm.run("uninstall", RELEASE, "--namespace", env.namespace, "--wait",
                 kubeconfig=env.kubeconfig)  # fmt: skip
        # The standby was owned by the release's operator Role: the garbage collector
        # deletes it once the Role is gone.
        wait_for_pods(env, STANDBYS_WAITING, lambda pods: not pods, "removed with the release")
        # The volume and the AgentRun are not the release's to delete.
        claim = json.loads(env.kubectl("get", "pvc", CLAIM, "-o", "json").stdout)
        assert claim["status"]["phase"] == "Bound"
        assert status(wait_for_run(env, "kept", in_phase("Succeeded"), "kept"))["answer"]

        helm.install(RELEASE, env.namespace, env.kubeconfig, values, "--wait", "--timeout=5m")
        assert env.history(done["stateId"]) == saved
    finally:
        helm.uninstall(RELEASE, env.namespace, env.kubeconfig)
        next(volumes, None)
