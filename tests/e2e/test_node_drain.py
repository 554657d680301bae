"""``kubectl drain`` of a node carrying runs, on the bench's three real nodes: every run
resumes on another node, no tool call runs twice and no saved entry is lost.

The runs go to worker ``node-1`` (``node-0`` and ``node-2`` are cordoned while they start);
each holds its one tool call in the bench's :class:`~tests.bench.tool_gate.ToolGate`,
which counts every start of the call in any pod. Then ``node-1`` is drained as a platform
team drains a node: ``kubectl drain --ignore-daemonsets --delete-emptydir-data`` (a run
pod's emptyDirs are scratch space; what matters is in the store), which evicts every pod
through the Eviction API and waits until they are gone.

The operator's PodDisruptionBudget: the e2e release runs one operator replica, for which
the chart renders no budget (one with ``minAvailable: 1`` would block every drain of the
operator's node). The operator and the bundled MinIO (on an emptyDir) stay on ``node-0``,
which is not drained, so the drain is not held up by them and the store keeps what the
runs saved. With two replicas the budget lets a drain evict them one at a time (see
``charts/alpineagents/templates/pdb.yaml``).

Suite scale: four runs. ``python -m benchmarks drain`` drains a node carrying twenty and
measures how long until all resumed (``benchmarks/drain.py``).

A run of days lives through a node drain every week or so: one run drained ten times in a
row (the workers drained in turn, each uncordoned after) ends Succeeded with the default
``restartPolicy`` (five restarts), as drains are disruptions, not failures; each stopping
pod's own stop save is kept (the operator waits for it before it claims the State).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from alpineagents.testing import ModelServer, Turn, reply, tool_use
from tests.bench.real_node import RealCluster
from tests.bench.tool_gate import ToolGate
from tests.e2e.environment import (
    CLOSED_ON_STOP,
    JSON,
    Environment,
    apply_run,
    gated,
    run_pods,
    wait_phase,
)

pytestmark = pytest.mark.e2e
RUNS = 4
CONTROL_PLANE_NODE = "node-0"
DRAINED, OTHER_WORKER = "node-1", "node-2"


def drain(env: Environment, node: str) -> str:
    """``kubectl drain`` as a platform team runs it; what it printed."""
    result = env.kubectl(
        "drain",
        node,
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        "--timeout=300s",
        timeout=360,
    )
    return result.stdout + result.stderr


@pytest.fixture(scope="module")
def workers(node_env: Environment) -> Iterator[RealCluster]:
    """The bench's cluster with both workers up; they go again after the module."""
    cluster = node_env.real_node
    assert cluster is not None
    cluster.add_node(DRAINED)
    cluster.add_node(OTHER_WORKER)
    try:
        yield cluster
    finally:
        for node in (DRAINED, OTHER_WORKER):
            if node in cluster.nodes:
                cluster.remove_node(node)


def test_a_drained_nodes_runs_resume_on_other_nodes_without_rerunning_a_call(
    node_env: Environment, gate: ToolGate, workers: RealCluster
) -> None:
    cluster = workers
    names = [f"drain-{uuid.uuid4().hex[:6]}" for _ in range(RUNS)]
    cluster.kubectl("cordon", CONTROL_PLANE_NODE, OTHER_WORKER)
    try:
        for name in names:
            apply_run(node_env, name, gated(gate, name))
        for name in names:
            gate.wait_started(name)
    finally:
        cluster.kubectl("uncordon", CONTROL_PLANE_NODE, OTHER_WORKER)
    before: dict[str, list[JSON]] = {}
    for name in names:
        [first] = run_pods(node_env, name)
        assert first["spec"]["nodeName"] == DRAINED
        state_id = wait_phase(node_env, name, "Running")["stateId"]
        before[name] = node_env.history(state_id) or []
        # The prompt, the model's request and its reply with the tool call are saved.
        assert [e["kind"] for e in before[name]].count("model_reply") == 1

    output = drain(node_env, DRAINED)
    assert all(f"evicting pod {node_env.namespace}/{n}-1" in output for n in names), output

    for name in names:
        done = wait_phase(node_env, name, "Succeeded")
        # Resumed once, on a node that was not drained; the call started once in all,
        # and the runner, given SIGTERM by the eviction, closed it as aborted.
        # A drain is a disruption, not a restart toward maxRestarts.
        assert done["attempt"] == 2 and done["disruptions"] == 1, done
        assert not done.get("restarts"), done
        assert gate.starts(name) == 1
        assert done["answer"].startswith(CLOSED_ON_STOP), done["answer"]
        [second] = [p for p in run_pods(node_env, name) if p["metadata"]["name"] == f"{name}-2"]
        assert second["spec"]["nodeName"] in (CONTROL_PLANE_NODE, OTHER_WORKER)
        # Nothing saved before the drain is lost: the history grew from it.
        after = node_env.history(done["stateId"]) or []
        assert after[: len(before[name])] == before[name], json.dumps(after, indent=1)
        kinds = [e["kind"] for e in after]
        assert kinds.count("message") == 1 and kinds.count("model_reply") == 2
        [result] = [e["data"] for e in after if e["kind"] == "tool_result"]
        assert result["outcome"] == "aborted"
    assert (
        node_env.kubectl(
            "get", "pods", f"--field-selector=spec.nodeName={DRAINED}", "-o", "name"
        ).stdout.strip()
        == ""
    )
    cluster.kubectl("uncordon", DRAINED)


DRAINS = 10


def test_one_run_drained_ten_times_succeeds_with_the_default_restart_policy(
    node_env: Environment, gate: ToolGate, workers: RealCluster
) -> None:
    from tests.bench.node_network import TEST_SERVERS_ADDRESS

    name = f"days-{uuid.uuid4().hex[:6]}"
    steps = [f"{name}-{i}" for i in range(DRAINS)]

    def respond(request: Mapping[str, Any]) -> Turn:
        # One held call per pod: the k-th answer calls step k, until every step was tried.
        done = sum(
            1
            for message in request["messages"]
            if isinstance(message["content"], list)
            for block in message["content"]
            if block.get("type") == "tool_result"
        )
        if done < DRAINS:
            return reply(f"Step {done}.", tool_use("shell", {"command": gate.command(steps[done])}))
        return reply(f"{name}: all {DRAINS} steps tried.")

    with ModelServer(respond=respond, host=TEST_SERVERS_ADDRESS) as model:
        workers.kubectl("cordon", CONTROL_PLANE_NODE)  # the run moves between the workers
        try:
            apply_run(
                node_env,
                name,
                "Work through the steps.",
                env=[{"name": "ANTHROPIC_BASE_URL", "value": model.url}],
                maxTurns=DRAINS + 5,
                restartPolicy={},  # the defaults: five restarts
            )
            for step in steps:
                gate.wait_started(step)
                pod = wait_phase(node_env, name, "Running")["pod"]
                node = json.loads(node_env.kubectl("get", "pod", pod, "-o", "json").stdout)
                drained = node["spec"]["nodeName"]
                output = drain(node_env, drained)
                assert f"evicting pod {node_env.namespace}/{pod}" in output, output
                workers.kubectl("uncordon", drained)
        finally:
            workers.kubectl("uncordon", CONTROL_PLANE_NODE)
        done = wait_phase(node_env, name, "Succeeded")
    # Ten drains: ten disruptions, no restart counted, so the default maxRestarts (5) never
    # came near; each call started once and was closed by its own pod's stop save.
    assert done["attempt"] == DRAINS + 1 and done["disruptions"] == DRAINS, done
    assert not done.get("restarts"), done
    assert all(gate.starts(step) == 1 for step in steps)
    history = node_env.history(done["stateId"]) or []
    results = [e["data"] for e in history if e["kind"] == "tool_result"]
    assert [r["outcome"] for r in results] == ["aborted"] * DRAINS
    closed = [r["content"] for r in results]
    assert all(text.startswith("(aborted") for text in closed), closed
    stops = [e["data"] for e in history if e["kind"] == "stop"]
    assert [s["reason"] for s in stops] == ["interrupted"] * DRAINS + ["answered"], stops
