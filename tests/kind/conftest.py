"""Fixtures for kind clusters on this machine: the nodes' dockerd and the node image.

``kind_bench`` (session) starts the kind nodes' dockerd (tests/bench/kind_cluster.py) and
builds or finds the locally assembled node image (tests/bench/kind_node_image.py); a
machine that cannot provide them skips these tests, or fails them in CI.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.bench.images import Docker
from tests.bench.infra import missing
from tests.bench.kind_cluster import kind, kind_docker, kind_sessions_lock
from tests.bench.kind_node_image import ensure_node_image
from tests.bench.testbin import ProvisioningError


@dataclass(frozen=True)
class KindBench:
    """The dockerd kind uses, and the node image to pass as ``--image``."""

    docker: Docker
    node_image: str


@pytest.fixture(scope="session")
def kind_bench(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KindBench]:
    """The kind daemon and node image, for one test session at a time on this machine
    (clusters are named by kind-config.yaml and map its fixed host ports)."""
    if os.geteuid() != 0:
        missing("a kind cluster", "kind's dockerd runs as root here: run the tests as root")
    try:
        with kind_sessions_lock(), kind_docker() as docker:
            # A session that was killed leaves its clusters behind; the daemon is ours.
            kubeconfig = tmp_path_factory.mktemp("kind") / "kubeconfig"
            for stale in kind(docker, "get", "clusters", kubeconfig=kubeconfig).split():
                kind(docker, "delete", "cluster", f"--name={stale}", kubeconfig=kubeconfig)
            image = ensure_node_image(docker)
            yield KindBench(docker, image)
    except ProvisioningError as error:
        missing("a kind cluster", str(error))
