"""The e2e suite (tests/e2e) against a kind cluster, as users run it against their own.

The walkthrough's last section: with the image loaded, ``ALPINEAGENTS_E2E_KUBECONFIG`` and
``ALPINEAGENTS_E2E_IMAGE`` point the suite at the cluster; the tests that need the bench's
own node (its kubelet, its host; marked ``bench_node``) are deselected there, everything
else must pass.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.bench.images import ensure_images
from tests.bench.kind_cluster import config_for_our_machines, environment, kind, node_logs
from tests.kind.conftest import KindBench
from tests.paths import REPO

pytestmark = pytest.mark.kind

CLUSTER = "alpineagents"
IMAGE = "alpineagents:dev"


def test_e2e_suite_passes_on_a_kind_cluster(kind_bench: KindBench, tmp_path: Path) -> None:
    docker = kind_bench.docker
    kubeconfig = tmp_path / "kubeconfig"
    config = config_for_our_machines(REPO / "kind-config.yaml", tmp_path / "kind.yaml")
    kind(
        docker,
        "create",
        "cluster",
        f"--config={config}",
        f"--image={kind_bench.node_image}",
        "--wait=300s",
        kubeconfig=kubeconfig,
    )
    try:
        images = ensure_images()
        values = yaml.safe_load((REPO / "charts/alpineagents/values.yaml").read_text())
        minio = values["minio"]["image"]
        for image, tag in (
            (images["alpineagents"], IMAGE),
            (images["minio"], f"{minio['repository']}:{minio['tag']}"),
        ):
            if not docker.has(image.ref):
                docker.run("load", "--input", str(image.archive))
            docker.run("tag", image.ref, tag)
            kind(docker, "load", "docker-image", tag, f"--name={CLUSTER}", kubeconfig=kubeconfig)
        env = {
            **environment(docker, kubeconfig),
            "ALPINEAGENTS_E2E_KUBECONFIG": str(kubeconfig),
            "ALPINEAGENTS_E2E_IMAGE": IMAGE,
        }
        suite = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "tests/e2e",
                "-q",
                "-p",
                "no:cacheprovider",
                "-m",
                "not bench_node",
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=2400,
            check=False,
        )
        summary = suite.stdout.strip().splitlines()[-1] if suite.stdout.strip() else ""
        assert suite.returncode == 0, f"{suite.stdout[-8000:]}\n{node_logs(docker, CLUSTER)}"
        assert " passed" in summary, summary
    finally:
        kind(docker, "delete", "cluster", f"--name={CLUSTER}", kubeconfig=kubeconfig)
