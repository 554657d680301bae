"""Runs the operator must get right when things happen while it cannot see them, and
inputs at the edge of what Kubernetes carries, on the bench's real node.

A run's one tool call goes through the bench's :class:`~tests.bench.tool_gate.ToolGate`,
which counts every start of the call in any pod and holds it until the test releases
it. These tests need the real node (they skip on a cluster of your own, where the gate
cannot be reached).
"""

from __future__ import annotations

import uuid

import pytest

from alpineagents.messages import Message
from tests.bench.tool_gate import ToolGate
from tests.e2e.environment import (
    Environment,
    apply_run,
    ended,
    gated,
    in_phase,
    run_pods,
    wait_for_run,
)

pytestmark = pytest.mark.e2e
OPERATOR_PODS = "app.kubernetes.io/component=operator"


def run_name() -> str:
    return f"o-{uuid.uuid4().hex[:6]}"


def test_a_run_that_answered_and_lost_its_pod_unseen_succeeds_without_a_restart(
    node_env: Environment, gate: ToolGate
) -> None:
    name = run_name()
    apply_run(
        node_env,
        name,
        gated(gate, name),
        restartPolicy={"maxRestarts": 0, "initialBackoffSeconds": 0},
    )
    gate.wait_started(name, timeout=300)
    wait_for_run(node_env, name, in_phase("Running"), "Running", 300)
    operator = f"deployment/{node_env.operator}"
    node_env.kubectl("scale", operator, "--replicas=0")
    try:
        # No selector match left is what "deleted" means here; kubectl says so as an error.
        node_env.kubectl(
            "wait", "--for=delete", "pods", "-l", OPERATOR_PODS, "--timeout=300s", check=False
        )
        assert not node_env.kubectl("get", "pods", "-l", OPERATOR_PODS, "-o", "name").stdout
        # While no operator watches, the pod saves its answer, exits 0, and is deleted.
        gate.release(name)
        node_env.kubectl(
            "wait",
            "--for=jsonpath={.status.phase}=Succeeded",
            f"pod/{name}-1",
            "--timeout=300s",
            timeout=330,
        )
        node_env.kubectl("delete", "pod", f"{name}-1", "--timeout=300s", timeout=330)
    finally:
        node_env.kubectl("scale", operator, "--replicas=1")
    node_env.kubectl("rollout", "status", operator, "--timeout=300s", timeout=330)
    done = ended(node_env, name)
    # Its answer is in the store: no loss, even with no restart to spare.
    assert done["phase"] == "Succeeded", done
    assert done["answer"].startswith("shell returned: exit code 0"), done
    assert f"{name} done" in done["answer"]
    assert done.get("restarts", 0) == 0 and done["attempt"] == 1, done
    assert not run_pods(node_env, name)  # no replacement was started
    assert gate.starts(name) == 1


def test_a_prompt_too_long_for_an_environment_variable_runs(
    node_env: Environment, gate: ToolGate
) -> None:
    name = run_name()
    # 200 KiB: one environment variable holds at most 128 KiB, so it must travel otherwise.
    prompt = gated(gate, name) + "\n" + "Context line of the long prompt.\n" * (200 * 1024 // 33)
    gate.release(name)
    apply_run(node_env, name, prompt)
    done = ended(node_env, name)
    assert done["phase"] == "Succeeded", done
    assert done["answer"].startswith("shell returned: exit code 0"), done
    assert gate.starts(name) == 1
    history = node_env.history(done["stateId"]) or []
    first = next(e for e in history if e["kind"] == "message")
    assert Message.from_dict(first["data"]["message"]).text == prompt
