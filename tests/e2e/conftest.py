"""The ``e2e`` fixture: the chart installed on a real cluster or on the test bench."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from alpineagents.testing import ModelServer
from tests.bench.helm import Helm
from tests.e2e.environment import (
    Environment,
    bench_environment,
    cluster_environment,
    e2e_kubeconfig,
)


@pytest.fixture(scope="module")
def e2e(
    request: pytest.FixtureRequest, helm: Helm, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Environment]:
    """The chart, installed and running, in a fresh namespace (see tests/e2e/environment.py).

    With ``ALPINEAGENTS_E2E_KUBECONFIG`` set: the cluster it points to, image
    ``ALPINEAGENTS_E2E_IMAGE`` (default ``alpineagents:dev``). Otherwise the test bench.
    """
    kubeconfig = e2e_kubeconfig()
    if kubeconfig is not None:
        image = os.environ.get("ALPINEAGENTS_E2E_IMAGE", "alpineagents:dev")
        with cluster_environment(kubeconfig, helm, image) as cluster:
            yield cluster
        return
    # Only now: a run against a real cluster must not start the bench's servers.
    plane = request.getfixturevalue("control_plane")
    minio = request.getfixturevalue("minio")
    workdir = tmp_path_factory.mktemp("e2e-operator")
    with (
        ModelServer(echo=True) as model,
        bench_environment(plane, helm, minio, model.url, workdir) as bench,
    ):
        yield bench
