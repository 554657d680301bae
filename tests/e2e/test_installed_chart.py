"""AgentRuns through the installed chart, as a cluster user sees them.

The chart is installed with ``helm install`` and its operator runs with the chart's
configuration and the chart's own ServiceAccount (see ``tests/e2e/environment.py`` for
where it runs). The model is the echo model: a prompt line ``use shell {...}`` becomes
that tool call, and its answer to a tool result is ``"shell returned: ..."`` or
``"shell failed: ..."``, so an answer tells whether the command ran to its end.
"""

from __future__ import annotations

import base64
import json
import uuid

import pytest
import yaml

from tests.e2e.environment import (
    JSON,
    SLOW_STEP,
    Environment,
    apply_run,
    in_phase,
    status,
    wait_for_run,
    wait_until_tool_runs,
)
from tests.paths import REPO

pytestmark = pytest.mark.e2e


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


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
    # A real kubelet reports the pod's phase once it has torn the pod down, a moment
    # after the container's exit (which the operator acts on).
    e2e.kubectl("wait", "--for=jsonpath={.status.phase}=Succeeded", f"pod/{name}-1")
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


@pytest.mark.parametrize("example", ["hello.yaml", "agentrun.yaml"])
def test_the_examples_run_to_succeeded_as_a_user_applies_them(
    e2e: Environment, example: str
) -> None:
    manifest = REPO / "examples" / example
    name = yaml.safe_load(manifest.read_text())["metadata"]["name"]
    e2e.kubectl("apply", "-f", str(manifest))
    try:
        got = status(wait_for_run(e2e, name, in_phase("Succeeded"), "Succeeded"))
        assert got["attempt"] == 1
        # The echo model's answer says which tool ran and whether it worked.
        tool = {"hello.yaml": "read_file", "agentrun.yaml": "shell"}[example]
        assert got["answer"].startswith(f"{tool} "), got["answer"]
        if example == "agentrun.yaml":
            assert got["answer"].startswith("shell returned: exit code 0"), got["answer"]
    finally:
        e2e.kubectl("delete", "-f", str(manifest), "--wait=false", check=False)


_SELF_REPORT = """
import json, os
try:
    open("/written-by-the-pod", "w")
    root = "writable"
except OSError as error:
    root = error.strerror
status = dict(line.split(":\\t", 1) for line in open("/proc/self/status").read().splitlines())
token = "/var/run/secrets/kubernetes.io/serviceaccount/token"
print(json.dumps({
    "uid": os.getuid(), "gid": os.getgid(), "root": root,
    "capabilities": status["CapEff"].strip(), "no_new_privs": status["NoNewPrivs"].strip(),
    "seccomp": status["Seccomp"].strip(),
    "token": open(token).read() if os.path.exists(token) else None,
}))
"""


def self_report(env: Environment, pod: str, container: str) -> JSON:
    """What a process in the container finds about itself (read by ``kubectl exec``)."""
    out = env.kubectl("exec", pod, "-c", container, "--", "python", "-c", _SELF_REPORT).stdout
    report: JSON = json.loads(out.strip().splitlines()[-1])
    return report


def _locked_down(report: JSON) -> None:
    assert (report["uid"], report["gid"]) == (65532, 65532), report
    assert report["root"] == "Read-only file system", report
    assert int(report["capabilities"], 16) == 0, report
    assert report["no_new_privs"] == "1" and report["seccomp"] == "2", report  # filter mode


def test_an_agent_pod_runs_non_root_read_only_without_capabilities_or_token(
    e2e: Environment,
) -> None:
    name = _name("locked")
    apply_run(e2e, name, f"Run the slow step.\n{SLOW_STEP}")
    pod = status(wait_until_tool_runs(e2e, name))["pod"]
    try:
        report = self_report(e2e, pod, "agent")
        _locked_down(report)
        assert report["token"] is None  # no way into the API server from an agent's pod
    finally:
        e2e.kubectl("delete", "agentrun", name, "--wait=false")


def test_the_operator_runs_locked_down_as_the_charts_service_account(e2e: Environment) -> None:
    deployment = json.loads(e2e.kubectl("get", "deployment", e2e.operator, "-o", "json").stdout)
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    report = self_report(e2e, f"deployment/{e2e.operator}", "operator")
    _locked_down(report)
    payload = report["token"].split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    assert claims["sub"] == f"system:serviceaccount:{e2e.namespace}:{account}"
    # What that identity may do is the chart's namespaced RBAC, nothing more.
    identity = f"--as={claims['sub']}"
    can = e2e.kubectl("auth", "can-i", "create", "pods", identity, check=False).stdout.strip()
    assert can == "yes"
    for beyond in (["list", "secrets", "--all-namespaces"], ["create", "clusterroles"]):
        answer = e2e.kubectl("auth", "can-i", *beyond, identity, check=False).stdout.strip()
        assert answer == "no", beyond
