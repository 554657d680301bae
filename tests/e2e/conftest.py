"""The ``e2e`` fixture: the chart installed on a cluster of your own or the bench's real node."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.bench.helm import Helm
from tests.bench.infra import missing
from tests.bench.tool_gate import ToolGate
from tests.e2e.environment import (
    Environment,
    cluster_environment,
    e2e_kubeconfig,
    image_values,
)


@pytest.fixture(scope="session")
def e2e(request: pytest.FixtureRequest, helm: Helm) -> Iterator[Environment]:
    """The chart, installed and running, in a fresh namespace (see tests/e2e/environment.py).

    With ``ALPINEAGENTS_E2E_KUBECONFIG`` set: the cluster it points to, image
    ``ALPINEAGENTS_E2E_IMAGE`` (default ``alpineagents:dev``). Otherwise the real node.
    """
    kubeconfig = e2e_kubeconfig()
    if kubeconfig is not None:
        image = os.environ.get("ALPINEAGENTS_E2E_IMAGE", "alpineagents:dev")
        with cluster_environment(kubeconfig, helm, image_values(image)) as cluster:
            yield cluster
        return
    # Only now: a run against a cluster of your own must not start the bench's node.
    node = request.getfixturevalue("real_node")
    with cluster_environment(
        node.kubeconfig, helm, node.chart_values(), node.plane.kubectl_path, node
    ) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def node_env(e2e: Environment) -> Environment:
    """The e2e environment, for tests that need the bench's own real node (its tool gate,
    its kubelet, its host): they do not run against a cluster of your own."""
    # Only a cluster of your own (ALPINEAGENTS_E2E_KUBECONFIG, which .ci/run never sets)
    # has no bench node: these tests skip there, and fail under ALPINEAGENTS_REQUIRE_INFRA.
    if e2e.real_node is None:
        missing("the bench's real node", "unset ALPINEAGENTS_E2E_KUBECONFIG to run it")
    return e2e


@pytest.fixture(scope="session")
def gate(node_env: Environment, tool_gate: ToolGate) -> ToolGate:
    """The real node's tool gate, which holds a run's tool call until a test releases it.

    ``node_env`` comes first, so on a cluster of your own the test skips before the gate
    (and the bench node under it) is asked for.
    """
    return tool_gate
