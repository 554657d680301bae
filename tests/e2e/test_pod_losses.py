"""Every way a run's pod is lost, done for real on the bench's real node, and what the
run makes of it: it ends Succeeded, the tool call it was in is closed once (``aborted``
or ``unknown`` when the runner had SIGTERM to save on, see ``CLOSED_ON_STOP``;
``unknown`` when it was killed outright) and never run again, and nothing saved is lost.

The chart is installed as a user installs it (``e2e`` fixture); the operator runs in its
pod with the chart's ServiceAccount. A run's one tool call goes through the bench's
:class:`~tests.bench.tool_gate.ToolGate`, which counts every start of the call in any pod
and holds the call until the test releases it. These tests need the real node (they
skip on a cluster of your own, where the gate cannot be reached).
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Mapping
from typing import Any

import pytest

from alpineagents.testing import ModelServer, Turn, reply, tool_use
from tests.bench.tool_gate import ToolGate
from tests.e2e.environment import (
    CLOSED_ON_STOP,
    JSON,
    Environment,
    apply_run,
    gated,
    in_phase,
    run_pods,
    status,
    wait_for_event,
    wait_for_run,
    wait_phase,
)

pytestmark = pytest.mark.e2e
OPERATOR_PODS = "app.kubernetes.io/component=operator"


def run_name() -> str:
    return f"r-{uuid.uuid4().hex[:6]}"


def event_reasons(env: Environment, name: str, *awaited: str) -> dict[str, str]:
    """The AgentRun's Events: reason -> message (one of each reason), once there is one of
    each ``awaited`` reason (the operator posts a step's Events after its status)."""
    for reason in awaited:
        wait_for_event(env, name, reason, "")
    listing = env.kubectl(
        "get", "events", f"--field-selector=involvedObject.name={name}", "-o", "json"
    )
    items = json.loads(listing.stdout)["items"]
    return {
        e["reason"]: e.get("message", "")
        for e in items
        if e["involvedObject"]["kind"] == "AgentRun"
    }


def results(env: Environment, state_id: str) -> list[JSON]:
    return [e["data"] for e in env.history(state_id) or [] if e["kind"] == "tool_result"]


KILLED = ("shell failed: (unknown",)
STOP_SAVED = ("shell failed: (aborted",)
"""A call closed by the stopping pod's own save (SIGTERM), which the operator waits for."""


def assert_resumed_once(
    env: Environment, gate: ToolGate, name: str, closed_as: tuple[str, ...]
) -> JSON:
    """The run Succeeded in a second pod; its call ran once and was closed, the answer
    starting with one of ``closed_as`` (``CLOSED_ON_STOP`` or ``KILLED``). A pod the
    cluster stopped is a disruption; one that was killed (OOM) counts a restart."""
    done = wait_phase(env, name, "Succeeded")
    counted = "restarts" if closed_as == KILLED else "disruptions"
    assert done["attempt"] == 2 and done[counted] == 1, done
    assert sum(int(done.get(k) or 0) for k in ("restarts", "disruptions")) == 1, done
    assert gate.starts(name) == 1
    assert done["answer"].startswith(closed_as), done["answer"]
    [result] = results(env, done["stateId"])
    said = "shell failed: " + result["content"]
    assert result["outcome"] == "aborted" and said.startswith(closed_as), result
    kinds = [e["kind"] for e in env.history(done["stateId"]) or []]
    assert kinds.count("message") == 1 and kinds.count("model_reply") == 2
    return done


def test_a_run_applied_with_kubectl_succeeds_with_its_answer_in_status(
    node_env: Environment, gate: ToolGate
) -> None:
    name = run_name()
    gate.release(name)
    apply_run(node_env, name, gated(gate, name))
    done = wait_phase(node_env, name, "Succeeded")
    assert (
        done["answer"].startswith("shell returned: exit code 0")
        and f"{name} done" in done["answer"]
    )
    assert done["attempt"] == 1 and done.get("restarts", 0) == 0
    assert done["lastSavedSeq"] >= 4  # message, request, reply, result, request, reply...
    assert done["stateId"].startswith(f"{node_env.namespace}.{name}.")
    conditions = {c["type"]: c["status"] for c in done["conditions"]}
    assert conditions == {"Succeeded": "True", "Running": "False", "WaitingForApproval": "False"}
    assert gate.starts(name) == 1
    assert [p["metadata"]["name"] for p in run_pods(node_env, name)] == [f"{name}-1"]
    # The kubelet reports the phase once the pod is torn down, after the exit it acts on.
    node_env.kubectl("wait", "--for=jsonpath={.status.phase}=Succeeded", f"pod/{name}-1")
    row = node_env.kubectl("get", "agentrun", name).stdout.splitlines()[1]
    assert row.split()[1:3] == ["Succeeded", "1"]
    assert {"PodCreated", "Succeeded"} <= set(event_reasons(node_env, name, "Succeeded"))


def test_a_pod_deleted_mid_tool_is_replaced_at_once_and_the_call_is_not_run_again(
    node_env: Environment, gate: ToolGate
) -> None:
    name = run_name()
    apply_run(node_env, name, gated(gate, name))
    gate.wait_started(name)
    node_env.kubectl("delete", "pod", f"{name}-1", "--wait=false")
    done = assert_resumed_once(node_env, gate, name, STOP_SAVED)
    # The runner, PID 1 of its container, got SIGTERM and saved its stop record; the
    # operator, seeing the pod terminating on a store that fences, waited for that save,
    # then claimed the State and started the replacement (a later save of the old pod is
    # refused).
    [result] = results(node_env, done["stateId"])
    assert done["abortedCalls"] == [result["call_id"]]
    stops = [e["data"] for e in node_env.history(done["stateId"]) or [] if e["kind"] == "stop"]
    assert [s["reason"] for s in stops] == ["interrupted", "answered"], stops
    assert "SystemExit" in stops[0]["error"], stops
    events = event_reasons(node_env, name, "PodLost", "Resumed")
    # Which the operator saw first depends on the machine's load: the pod terminating
    # (then it waited for the stop save) or already stopped by the SIGTERM.
    lost = events["PodLost"]
    assert "terminating" in lost or "was stopped (SIGTERM, exit 143)" in lost, lost
    assert "Resumed" in events
    operator = node_env.kubectl(
        "get", "pods", "-l", OPERATOR_PODS, "-o", "jsonpath={.items[0].metadata.name}"
    ).stdout
    # Through the API server's proxy to the operator pod's metrics port.
    path = f"/api/v1/namespaces/{node_env.namespace}/pods/{operator}:9090/proxy/metrics"
    metrics = node_env.kubectl("get", "--raw", path).stdout
    assert 'alpineagents_pod_restarts_total{reason="PodTerminating"}' in metrics


def test_a_pod_evicted_through_the_eviction_api_saves_and_resumes(
    node_env: Environment, gate: ToolGate
) -> None:
    name = run_name()
    apply_run(node_env, name, gated(gate, name))
    gate.wait_started(name)
    pod = f"{name}-1"
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": pod, "namespace": node_env.namespace},
    }
    node_env.kubectl(
        "create",
        "--raw",
        f"/api/v1/namespaces/{node_env.namespace}/pods/{pod}/eviction",
        "-f",
        "-",
        input=json.dumps(eviction),
    )
    # An API eviction is a graceful delete: SIGTERM first, so the runner saves.
    assert_resumed_once(node_env, gate, name, CLOSED_ON_STOP)


def test_a_pod_deleted_every_second_is_slowed_down_and_the_status_says_why(
    node_env: Environment, gate: ToolGate
) -> None:
    from tests.bench.node_network import TEST_SERVERS_ADDRESS

    name = run_name()
    finishing = threading.Event()

    def respond(request: Mapping[str, Any]) -> Turn:
        # The held call again after each aborted one, until the test lets the run finish.
        last = request["messages"][-1]["content"]
        answered = isinstance(last, list) and any(b.get("type") == "tool_result" for b in last)
        if finishing.is_set() and answered:
            return reply(f"{name}: done.")
        return reply("Working.", tool_use("shell", {"command": gate.command(name)}))

    stop = threading.Event()

    def delete_every_second() -> None:
        # What a broken controller or a script gone wrong does: every pod of the run, at once.
        while not stop.wait(1.0):
            node_env.kubectl(
                "delete", "pod", "-l", f"alpineagents.dev/run={name}", "--wait=false", check=False
            )

    with ModelServer(respond=respond, host=TEST_SERVERS_ADDRESS) as model:
        apply_run(
            node_env,
            name,
            "Do the job.",
            env=[{"name": "ANTHROPIC_BASE_URL", "value": model.url}],
            maxTurns=100,
        )
        deleter = threading.Thread(target=delete_every_second, daemon=True)
        deleter.start()
        try:
            slowed = status(
                wait_for_run(
                    node_env,
                    name,
                    lambda run: "the next pod waits" in str(status(run).get("message")),
                    "slowed down (DisruptionBackoff)",
                )
            )
        finally:
            stop.set()
            deleter.join()
        # Past ten quick disruptions in a row the waits begin; none is a restart.
        assert slowed["phase"] == "Interrupted" and slowed["disruptions"] > 10, slowed
        assert "disruptions in a row, each within 60 s" in slowed["message"], slowed
        assert not slowed.get("restarts"), slowed
        # The step's Events are posted after its status: awaited, not looked up.
        wait_for_event(node_env, name, "DisruptionBackoff", "the next pod waits")
        finishing.set()
        gate.release(name)
        done = wait_phase(node_env, name, "Succeeded")
    assert done["answer"] == f"{name}: done." and not done.get("restarts"), done


def test_a_pod_oom_killed_by_its_memory_limit_resumes_and_the_call_is_closed_unknown(
    node_env: Environment, gate: ToolGate
) -> None:
    name = run_name()
    # The runner reads the command's output into memory: 4 GB of it crosses the limit in
    # the runner's own process, which the kernel then kills (no SIGTERM, nothing saved).
    flood = "head -c 4000000000 /dev/zero"
    apply_run(
        node_env,
        name,
        gated(gate, name, then=flood),
        resources={"requests": {"memory": "64Mi"}, "limits": {"memory": "256Mi"}},
    )
    assert_resumed_once(node_env, gate, name, KILLED)
    lost = next(p for p in run_pods(node_env, name) if p["metadata"]["name"] == f"{name}-1")
    [container] = lost["status"]["containerStatuses"]
    terminated = container["state"]["terminated"]
    assert terminated["reason"] == "OOMKilled" and terminated["exitCode"] == 137, terminated
    assert "OOM-killed" in event_reasons(node_env, name, "PodLost")["PodLost"]


def test_the_operators_pod_deleted_mid_run_comes_back_without_a_second_pod(
    node_env: Environment, gate: ToolGate
) -> None:
    name = run_name()
    apply_run(node_env, name, gated(gate, name))
    gate.wait_started(name)
    wait_phase(node_env, name, "Running")
    node_env.kubectl("delete", "pods", "-l", OPERATOR_PODS, "--wait=true", "--timeout=120s")
    gate.release(name)  # the run finishes while its operator is being replaced
    done = wait_phase(node_env, name, "Succeeded")
    assert done["answer"].startswith("shell returned: exit code 0")
    assert [p["metadata"]["name"] for p in run_pods(node_env, name)] == [f"{name}-1"]
    assert gate.starts(name) == 1
    node_env.kubectl(
        "wait", "--for=condition=Available", f"deployment/{node_env.operator}", "--timeout=120s"
    )


def test_a_run_whose_node_is_lost_resumes_on_another_node(
    node_env: Environment, gate: ToolGate
) -> None:
    cluster = node_env.real_node
    healthy = "node-0"
    doomed = cluster.add_node()
    try:
        cluster.kubectl("cordon", healthy)  # the run's first pod goes to the doomed node
        try:
            name = run_name()
            apply_run(node_env, name, gated(gate, name))
            gate.wait_started(name)
            [first] = run_pods(node_env, name)
            assert first["spec"]["nodeName"] == doomed.name
            # The node dies (kubelet and containers killed, nothing saved) and its Node
            # is deleted, as a cloud provider does for a machine that is gone.
            doomed.power_off()
            cluster.kubectl("delete", "node", doomed.name, "--wait=false")
        finally:
            cluster.kubectl("uncordon", healthy)
        # The pod garbage collector gives the lost pod up about 40 s after its Node is
        # gone; the operator then resumes the run on the node that is left.
        done = status(wait_for_run(node_env, name, in_phase("Succeeded"), "Succeeded", 300))
        assert done["attempt"] == 2 and gate.starts(name) == 1
        assert done["answer"].startswith("shell failed: (unknown"), done["answer"]
        [second] = [p for p in run_pods(node_env, name) if p["metadata"]["name"] == f"{name}-2"]
        assert second["spec"]["nodeName"] == healthy
    finally:
        cluster.remove_node(doomed.name)


def test_suspend_stops_the_pod_gracefully_and_resume_continues(
    node_env: Environment, gate: ToolGate
) -> None:
    name = run_name()
    apply_run(node_env, name, gated(gate, name))
    gate.wait_started(name)
    node_env.kubectl("patch", "agentrun", name, "--type=merge", "-p", '{"spec":{"suspend":true}}')
    wait_phase(node_env, name, "Suspended")
    node_env.kubectl("wait", "--for=delete", f"pod/{name}-1", "--timeout=120s")
    node_env.kubectl("patch", "agentrun", name, "--type=merge", "-p", '{"spec":{"suspend":false}}')
    done = wait_phase(node_env, name, "Succeeded")
    assert done["attempt"] == 2 and done.get("restarts", 0) == 0  # a suspension is no loss
    assert gate.starts(name) == 1
    assert "Suspended" in event_reasons(node_env, name, "Suspended")


def test_an_approval_round_trip_through_spec_approvals(
    node_env: Environment, gate: ToolGate
) -> None:
    name = run_name()
    gate.release(name)
    apply_run(node_env, name, gated(gate, name), requireApproval=["shell"])
    waiting = wait_phase(node_env, name, "WaitingForApproval")
    [pending] = waiting["pendingApprovals"]
    assert pending["name"] == "shell" and name in pending["input"]["command"]
    assert gate.starts(name) == 0  # nothing ran without the person's answer
    approval = {"spec": {"approvals": [{"callId": pending["callId"], "allow": True}]}}
    node_env.kubectl("patch", "agentrun", name, "--type=merge", "-p", json.dumps(approval))
    done = wait_phase(node_env, name, "Succeeded")
    assert done["answer"].startswith("shell returned: exit code 0")
    assert gate.starts(name) == 1 and "pendingApprovals" not in done


def test_deleting_a_running_agentrun_stops_its_pod_and_keeps_its_state(
    node_env: Environment, gate: ToolGate
) -> None:
    name = run_name()
    apply_run(node_env, name, gated(gate, name))
    gate.wait_started(name)
    state_id = wait_phase(node_env, name, "Running")["stateId"]
    node_env.kubectl("delete", "agentrun", name, "--timeout=120s")
    node_env.kubectl("wait", "--for=delete", f"pod/{name}-1", "--timeout=120s")
    kept = results(node_env, state_id)  # onDelete: Keep (the default)
    assert [r["outcome"] for r in kept] == ["aborted"]
