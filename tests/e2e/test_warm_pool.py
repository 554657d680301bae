"""The warm pool (``runs.warmPool``) on the real node: a run that loses its pod resumes in
the standby that was waiting, and a pool of zero leaves no waiting standby behind.

The pool's decisions and races are tests/operator/test_warm_pool.py's, against a real API
server and store; here the chart, the operator's pod, the standby's pod and its runner are
the real ones, as a user installs them (``benchmarks/warm_pool.py`` measures the same).
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import yaml

from tests.bench.helm import Helm
from tests.bench.tool_gate import ToolGate
from tests.e2e.environment import (
    CLOSED_ON_STOP,
    JSON,
    STANDBYS_WAITING,
    Environment,
    gated,
    upgrade_release,
    wait_for_pods,
    wait_phase,
)

pytestmark = pytest.mark.e2e


def running(pod: Any) -> bool:
    statuses = pod.status.container_statuses or []
    return not pod.metadata.deletion_timestamp and any(s.state.running for s in statuses)


def apply_pool_run(env: Environment, name: str, prompt: str) -> None:
    """An AgentRun whose pod would be the pool's: nothing in its spec (no ``env``, no
    ``resources``) makes its pod differ from a standby."""
    body: JSON = {
        "apiVersion": "alpineagents.dev/v1",
        "kind": "AgentRun",
        "metadata": {"name": name},
        "spec": {
            "model": "claude-sonnet-5",
            "prompt": prompt,
            "tools": ["shell"],
            "maxTurns": 5,
            "restartPolicy": {"initialBackoffSeconds": 0},
        },
    }
    env.kubectl("apply", "-f", "-", input=yaml.safe_dump(body))


def test_a_lost_pod_resumes_in_the_waiting_standby_and_a_pool_of_zero_leaves_none(
    node_env: Environment, gate: ToolGate, helm: Helm
) -> None:
    runs = dict(node_env.values.get("runs") or {})
    upgrade_release(node_env, helm, {"runs": {**runs, "warmPool": 1}})
    try:
        [standby] = wait_for_pods(
            node_env,
            STANDBYS_WAITING,
            lambda pods: len(pods) == 1 and running(pods[0]),
            "one running",
        )
        name = f"wp-{uuid.uuid4().hex[:6]}"
        apply_pool_run(node_env, name, gated(gate, name))
        gate.wait_started(name)
        node_env.kubectl("delete", "pod", f"{name}-1", "--wait=false")

        done = wait_phase(node_env, name, "Succeeded")
        assert done["pod"] == standby.metadata.name, done
        assert done["attempt"] == 2 and done["disruptions"] == 1, done
        assert done["answer"].startswith(CLOSED_ON_STOP), done["answer"]
        assert gate.starts(name) == 1
        handed = node_env.kubectl(
            "get", "pod", standby.metadata.name, "-o", "jsonpath={.metadata.labels}"
        ).stdout
        assert f'"alpineagents.dev/run":"{name}"' in handed, handed
        # A new standby waits behind the one handed the run.
        [behind] = wait_for_pods(
            node_env, STANDBYS_WAITING, lambda pods: len(pods) == 1, "refilled"
        )
        assert behind.metadata.name != standby.metadata.name
    finally:
        upgrade_release(node_env, helm, {"runs": runs})
    # runs.warmPool back to 0: the operator removes every waiting standby.
    wait_for_pods(node_env, STANDBYS_WAITING, lambda pods: not pods, "all removed")
