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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``bench_node`` every test that asks for the bench's own node, so a run against a
    cluster of your own deselects them (``-m "not bench_node"``) rather than skipping them."""
    for item in items:
        if "node_env" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.bench_node)


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
    # Only a cluster of your own (ALPINEAGENTS_E2E_KUBECONFIG) has no bench node. Such runs
    # deselect these tests (-m "not bench_node", as tests/kind does); one that does not is
    # told so: a skip on a user's machine, a failure under ALPINEAGENTS_REQUIRE_INFRA.
    if e2e.real_node is None:
        missing("the bench's real node", "unset ALPINEAGENTS_E2E_KUBECONFIG to run it")
    return e2e


@pytest.fixture(scope="session")
def gate(node_env: Environment, tool_gate: ToolGate) -> ToolGate:
    """The real node's tool gate, which holds a run's tool call until a test releases it.

    ``node_env`` comes first, so on a cluster of your own the test stops before the gate
    (and the bench node under it) is asked for.
    """
    return tool_gate
