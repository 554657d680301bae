"""`kind create cluster --config kind-config.yaml` gives a Ready node on our machines.

With the node image assembled here (tests/bench/kind_node_image.py) and the test
config's patches for this machine's quirks (tests/bench/kind_cluster.py).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.bench.kind_cluster import config_for_our_machines, environment, kind, node_logs
from tests.kind.conftest import KindBench

pytestmark = pytest.mark.kind

REPO_ROOT = Path(__file__).resolve().parents[2]
CLUSTER = "alpineagents"  # the name kind-config.yaml gives it


def test_cluster_from_the_users_config_has_a_ready_node(
    kind_bench: KindBench, tmp_path: Path
) -> None:
    config = config_for_our_machines(REPO_ROOT / "kind-config.yaml", tmp_path / "kind-config.yaml")
    kubeconfig = tmp_path / "kubeconfig"
    docker = kind_bench.docker
    try:
        kind(
            docker,
            "create",
            "cluster",
            f"--config={config}",
            f"--image={kind_bench.node_image}",
            "--wait=300s",
            kubeconfig=kubeconfig,
        )
        env = environment(docker, kubeconfig)
        nodes = json.loads(
            subprocess.run(
                ["kubectl", "get", "nodes", "-o", "json"],
                env=env,
                capture_output=True,
                text=True,
                check=True,
                timeout=120,
            ).stdout
        )
        ready = {
            item["metadata"]["name"]: next(
                c["status"] for c in item["status"]["conditions"] if c["type"] == "Ready"
            )
            for item in nodes["items"]
        }
        assert ready == {f"{CLUSTER}-control-plane": "True"}, node_logs(docker, CLUSTER)
    finally:
        kind(docker, "delete", "cluster", f"--name={CLUSTER}", kubeconfig=kubeconfig)
    listed = kind(docker, "get", "clusters", kubeconfig=kubeconfig)
    assert CLUSTER not in listed.split()
