"""Runs that cannot succeed end with a status that says why, and cost nothing more.

Each is what a cluster user would meet: an AgentRun the API server refuses, one whose
agent cannot be imported or whose resources are invalid, a model that never answers
(the restart budget runs out), and a store elsewhere than the operator's (refused before
the operator sends its key there, so no pod is started).
"""

from __future__ import annotations

import uuid

import pytest
import yaml

from tests.e2e.environment import (
    Environment,
    apply_run,
    run_pods,
    wait_phase,
)

pytestmark = pytest.mark.e2e


def run_name() -> str:
    return f"f-{uuid.uuid4().hex[:6]}"


def test_a_malformed_agentrun_is_refused_or_fails_with_a_clear_message(e2e: Environment) -> None:
    refused = e2e.kubectl(
        "apply",
        "-f",
        "-",
        check=False,
        input=yaml.safe_dump(
            {
                "apiVersion": "alpineagents.dev/v1",
                "kind": "AgentRun",
                "metadata": {"name": run_name()},
                "spec": {"prompt": "hi", "maxTurns": -1},
            }
        ),
    )
    assert refused.returncode != 0
    assert "spec.model: Required value" in refused.stderr and "spec.maxTurns" in refused.stderr
    name = run_name()
    apply_run(e2e, name, "hi", agent="tests.agents.no_such_agent:make_agent")
    failed = wait_phase(e2e, name, "Failed")
    assert failed["reason"] == "NotRetryable" and failed["attempt"] == 1
    assert "cannot import 'tests.agents.no_such_agent'" in failed["message"]
    # The schema leaves resources opaque; the operator refuses a bad one before any pod.
    name = run_name()
    apply_run(e2e, name, "hi", resources={"limits": {"memory": "lots"}})
    failed = wait_phase(e2e, name, "Failed")
    assert failed["reason"] == "ResourcesNotAllowed", failed
    assert "spec.resources.limits.memory must be a quantity" in failed["message"]
    assert not run_pods(e2e, name)


def test_an_exhausted_restart_budget_ends_failed(e2e: Environment) -> None:
    name = run_name()
    # Nothing listens on the pod's own loopback: every pod finds the model unavailable.
    apply_run(
        e2e,
        name,
        "hi",
        env=[
            {"name": "ANTHROPIC_BASE_URL", "value": "http://127.0.0.1:9"},
            {"name": "ALPINEAGENTS_MODEL_RETRIES", "value": "1"},
        ],
        restartPolicy={"maxRestarts": 1, "initialBackoffSeconds": 0},
    )
    failed = wait_phase(e2e, name, "Failed")
    assert failed["reason"] == "RestartLimitExceeded"
    assert failed["restarts"] == 2 and failed["attempt"] == 2
    assert "model unavailable" in failed["message"] and "maxRestarts=1" in failed["message"]


def test_a_store_elsewhere_fails_the_run_before_the_operator_contacts_it(
    e2e: Environment,
) -> None:
    name = run_name()
    # Another endpoint than the operator's store: its key must never be sent there.
    apply_run(
        e2e,
        name,
        "hi",
        store="s3://runs/x?endpoint=127.0.0.1:9&secure=false&timeout=1&retry_budget=1",
    )
    failed = wait_phase(e2e, name, "Failed")
    assert failed["reason"] == "StoreNotAllowed"
    assert "endpoint http://127.0.0.1:9" in failed["message"]
    assert not run_pods(e2e, name)
