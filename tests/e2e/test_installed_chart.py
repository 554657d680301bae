"""AgentRuns through the installed chart, as a cluster user sees them.

The chart is installed with ``helm install`` and its operator runs with the chart's
configuration and the chart's own ServiceAccount (see ``tests/e2e/environment.py`` for
where it runs). The model is the echo model: a prompt line ``use shell {...}`` becomes
that tool call, and its answer to a tool result is ``"shell returned: ..."`` or
``"shell failed: ..."``, so an answer tells whether the command ran to its end.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
import yaml

from tests.e2e.environment import JSON, Environment, wait_for_log, wait_for_run

pytestmark = pytest.mark.e2e

# Long enough to be interrupted on purpose; never waited out by a passing test.
SLOW_STEP = 'use shell {"command": "sleep 60; echo finished"}'


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def apply_run(env: Environment, name: str, prompt: str, **spec: Any) -> None:
    """``kubectl apply`` an AgentRun with the shell tool and JSON progress logs."""
    body = {
        "apiVersion": "alpineagents.dev/v1",
        "kind": "AgentRun",
        "metadata": {"name": name},
        "spec": {
            "model": "claude-sonnet-5",
            "prompt": prompt,
            "tools": ["shell"],
            "maxTurns": 5,
            "restartPolicy": {"initialBackoffSeconds": 0},
            "env": [{"name": "ALPINEAGENTS_LOG_FORMAT", "value": "json"}],
            **spec,
        },
    }
    env.kubectl("apply", "-f", "-", input=yaml.safe_dump(body))


def status(run: JSON | None) -> JSON:
    return dict((run or {}).get("status") or {})


def in_phase(phase: str) -> Any:
    return lambda run: status(run).get("phase") == phase


def wait_until_tool_runs(env: Environment, name: str) -> JSON:
    """Wait for the run's pod to have saved the model's tool call (the shell now runs)."""
    run = wait_for_run(env, name, lambda r: bool(status(r).get("pod")), "given a pod")
    pod = status(run)["pod"]
    wait_for_log(
        env,
        pod,
        lambda lines: any(line.get("kind") == "model_reply" for line in lines),
        "a saved model reply",
    )
    assert run is not None
    return run


def pod_gone(env: Environment, pod: str) -> bool:
    result = env.kubectl("get", "pod", pod, "-o", "name", "--ignore-not-found")
    return result.stdout.strip() == ""


def wait_for_pod_deleted(env: Environment, pod: str) -> None:
    env.kubectl("wait", "--for=delete", f"pod/{pod}", "--timeout=120s")


def kinds(history: list[JSON] | None) -> list[str]:
    return [entry["kind"] for entry in history or []]


def test_a_run_goes_from_created_to_succeeded_with_its_answer(e2e: Environment) -> None:
    name = _name("hello")
    apply_run(e2e, name, "Say hello to the cluster.")
    run = wait_for_run(e2e, name, in_phase("Succeeded"), "Succeeded")
    got = status(run)
    assert got["answer"] == "Echo: Say hello to the cluster."
    assert got["attempt"] == 1
    pod = json.loads(e2e.kubectl("get", "pod", f"{name}-1", "-o", "json").stdout)
    assert pod["status"]["phase"] == "Succeeded"
    history = e2e.history(got["stateId"])
    assert kinds(history).count("message") == 1
    assert "model_reply" in kinds(history)


def test_a_deleted_pod_is_replaced_and_the_run_resumes_where_it_was(e2e: Environment) -> None:
    name = _name("resume")
    apply_run(e2e, name, f"Run the slow step.\n{SLOW_STEP}")
    run = wait_until_tool_runs(e2e, name)
    first_pod = status(run)["pod"]

    # What a user (or a node drain) does: delete the pod in the middle of the shell command.
    e2e.kubectl("delete", "pod", first_pod, "--wait=false")

    run = wait_for_run(e2e, name, in_phase("Succeeded"), "Succeeded after the pod was deleted")
    got = status(run)
    assert got["attempt"] >= 2 and got["pod"] != first_pod
    # Resumed, not restarted: the interrupted command was not run again to its end.
    assert got["answer"].startswith("shell failed:"), got["answer"]
    assert "finished" not in got["answer"]
    history = e2e.history(got["stateId"])
    assert kinds(history).count("message") == 1  # the prompt, once: not a second fresh start
    replies = [e for e in history or [] if e["kind"] == "model_reply"]
    assert len(replies) == 2  # the tool call before the loss, the answer after


def test_suspend_stops_the_pod_and_resume_finishes_the_run(e2e: Environment) -> None:
    name = _name("suspend")
    apply_run(e2e, name, f"Run the slow step.\n{SLOW_STEP}")
    pod = status(wait_until_tool_runs(e2e, name))["pod"]

    e2e.kubectl("patch", "agentrun", name, "--type=merge", "-p", '{"spec":{"suspend":true}}')
    wait_for_run(e2e, name, in_phase("Suspended"), "Suspended")
    wait_for_pod_deleted(e2e, pod)
    live = e2e.kubectl("get", "pods", "-l", f"alpineagents.dev/run={name}", "-o", "json")
    phases = [p["status"].get("phase") for p in json.loads(live.stdout)["items"]]
    assert all(p in ("Succeeded", "Failed") for p in phases), phases

    e2e.kubectl("patch", "agentrun", name, "--type=merge", "-p", '{"spec":{"suspend":false}}')
    got = status(wait_for_run(e2e, name, in_phase("Succeeded"), "Succeeded after resuming"))
    assert got["attempt"] >= 2
    assert got["answer"].startswith("shell failed:") and "finished" not in got["answer"]


def test_deleting_a_run_stops_its_pod_and_deletes_its_saved_state(e2e: Environment) -> None:
    name = _name("delete")
    apply_run(e2e, name, f"Run the slow step.\n{SLOW_STEP}", onDelete="Delete")
    run = wait_until_tool_runs(e2e, name)
    state_id, pod = status(run)["stateId"], status(run)["pod"]
    assert e2e.history(state_id)

    e2e.kubectl("delete", "agentrun", name, "--wait=false")
    wait_for_run(e2e, name, lambda r: r is None, "deleted")
    wait_for_pod_deleted(e2e, pod)
    assert e2e.history(state_id) is None, e2e.diagnostics()


def test_the_operator_needs_no_more_than_the_charts_rbac(e2e: Environment) -> None:
    refused = [line for line in e2e.operator_log().splitlines() if "forbidden" in line.lower()]
    assert not refused, "\n".join(refused[:5])


def test_the_charts_role_grants_exactly_what_the_operator_calls(e2e: Environment) -> None:
    """After the runs above (created, resumed, suspended, deleted with their State), the
    operator's real requests, read from the API server's audit log, use every permission
    its Role grants and no other."""
    calls = e2e.operator_calls()
    if calls is None:
        pytest.skip("this cluster's audit log cannot be read (the test bench's can)")
    used = {
        (
            event["objectRef"].get("apiGroup", ""),
            "/".join(
                filter(
                    None, [event["objectRef"]["resource"], event["objectRef"].get("subresource")]
                )
            ),
            event["verb"],
        )
        for event in calls
        if event.get("objectRef") and event["objectRef"].get("namespace") == e2e.namespace
    }
    refused = [e for e in calls if e.get("responseStatus", {}).get("code") == 403]
    assert not refused, [(e["verb"], e["objectRef"]) for e in refused[:5]]
    role = json.loads(e2e.kubectl("get", "role", "e2e-alpineagents-operator", "-o", "json").stdout)
    granted = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert used <= granted, f"called without a grant: {sorted(used - granted)}"
    assert granted <= used, f"granted but never called: {sorted(granted - used)}"
