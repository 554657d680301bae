"""The run viewer in cluster mode, in a real chromium, against the bench's kube-apiserver.

The viewer reads AgentRuns and writes a person's answer into ``spec.approvals`` with the
user's own kubeconfig; the operator's part (starting pods, writing status) is the
operator's and is tested with it. Here the AgentRun lives on a real kube-apiserver, its
State is made by the real runner (``alpineagents run``, as the operator's pod runs it),
and its status is what the operator writes from the runner's termination message. A
click on Allow must put the answer into the AgentRun, and a runner started with the
AgentRun's spec as the API then holds it (the next pod) goes on with the call, which
the open page follows to the answer.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from alpineagents import ExitCode
from alpineagents.pod_contract import state_id_for
from alpineagents.testing import ModelServer, reply, tool_use
from tests.bench.browser import Screenshots, Viewers
from tests.bench.control_plane import ControlPlane
from tests.bench.runner_process import Workspace

expect: Any
try:
    from playwright.sync_api import expect
except ImportError:  # the browser fixture skips (or fails in CI) with the reason
    expect = None

DEPLOY = {"command": "echo deployed >> deployed"}
SPEC: dict[str, Any] = {
    "model": "claude-sonnet-5",
    "prompt": "Deploy release 2.4.",
    "tools": ["shell"],
    "requireApproval": ["shell"],
}


@pytest.fixture
def namespace(control_plane: ControlPlane) -> Iterator[str]:
    """A fresh namespace on the bench's kube-apiserver, with the AgentRun CRD installed."""
    control_plane.apply_crds()
    name = f"viewer-{uuid.uuid4().hex[:6]}"
    control_plane.kubectl("create", "namespace", name)
    yield name
    control_plane.kubectl("delete", "namespace", name, "--wait=false", check=False)


def agent_run(plane: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    result = plane.kubectl("get", "agentrun", name, "-n", namespace, "-o", "json")
    body: dict[str, Any] = json.loads(result.stdout)
    return body


def write_status(plane: ControlPlane, namespace: str, name: str, **status: Any) -> None:
    """Write the AgentRun's status as its operator does (the status subresource)."""
    patch = json.dumps({"status": status})
    plane.kubectl(
        "patch", "agentrun", name, "-n", namespace,
        "--subresource=status", "--type=merge", "-p", patch,
    )  # fmt: skip


def test_an_approval_clicked_in_the_viewer_goes_into_the_agentrun_and_the_run_goes_on(
    control_plane: ControlPlane,
    namespace: str,
    workspace: Workspace,
    model_server: ModelServer,
    viewers: Viewers,
    page: Any,
    screenshots: Screenshots,
) -> None:
    name = "release-2-4"
    manifest = {"apiVersion": "alpineagents.dev/v1", "kind": "AgentRun"}
    created = control_plane.kubectl(
        "create", "-n", namespace, "-f", "-", "-o", "json",
        input=yaml.safe_dump({**manifest, "metadata": {"name": name}, "spec": SPEC}),
    )  # fmt: skip
    state_id = state_id_for(namespace, name, json.loads(created.stdout)["metadata"]["uid"])

    # Attempt 1, as the operator's first pod runs it: the model asks for the shell, which
    # needs a person's answer; the runner saves the State and says so.
    model_server.add(reply("Deploying.", tool_use("shell", DEPLOY, id="toolu_deploy")))
    first = workspace.run(workspace.manifest(name, **SPEC), "--id", state_id)
    assert first.process.returncode == ExitCode.WAITING_FOR_APPROVAL, first.stderr
    write_status(
        control_plane, namespace, name,
        phase="WaitingForApproval", attempt=1, restarts=0, stateId=state_id,
        pendingApprovals=first.message["pendingApprovals"],
        usage={"inputTokens": 120, "outputTokens": 18},
    )  # fmt: skip

    viewer = viewers.start(
        "--store",
        str(workspace.runs),
        "--kubeconfig",
        str(control_plane.kubeconfig),
        "--allow-approvals",
    )
    page.goto(viewer.address)  # as printed, with the approval token
    row = page.locator(f'#runs tr[data-id="{state_id}"]')
    expect(row).to_contain_text(f"{namespace}/{name}")
    expect(row).to_contain_text("WaitingForApproval")
    expect(page.locator("#runs thead")).to_contain_text("Restarts")
    screenshots.take(page, "ui-runs-cluster")

    row.locator("a").click()
    box = page.locator("#approvals")
    expect(box).to_contain_text("echo deployed")
    expect(page.locator("#facts")).to_contain_text(f"AgentRun {namespace}/{name}")
    screenshots.take(page, "ui-approval")

    box.locator("button.allow").click()
    expect(page.locator("#approval-result")).to_contain_text(
        f"AgentRun {namespace}/{name} spec.approvals"
    )
    run = agent_run(control_plane, namespace, name)
    assert run["spec"]["approvals"] == [{"callId": "toolu_deploy", "allow": True}]
    saved = workspace.store.read(state_id)
    assert saved is not None and saved.entries[-1]["kind"] == "stop"  # the State is the pod's
    assert not (workspace.work / "deployed").exists()

    # Attempt 2, as the operator's next pod runs it: the AgentRun's spec as the API holds
    # it now, approvals included. The open page follows it to the answer.
    model_server.add(reply("Deployed release 2.4."))
    second = workspace.run(workspace.manifest(name, **run["spec"]), "--id", state_id)
    assert second.process.returncode == ExitCode.ANSWERED, second.stderr
    write_status(
        control_plane, namespace, name,
        phase="Succeeded", attempt=2, restarts=0, stateId=state_id, pendingApprovals=[],
        answer=second.message["answer"], usage={"inputTokens": 260, "outputTokens": 27},
    )  # fmt: skip
    expect(page.locator("#answer")).to_contain_text("Deployed release 2.4.")
    expect(page.locator(".tl-row.call", has_text="shell")).to_contain_text("ok")
    expect(page.locator(".tl-row.attempt")).to_contain_text("attempt 2")
    expect(page.locator("#facts")).to_contain_text("Succeeded")
    expect(box).to_be_hidden()
    assert (workspace.work / "deployed").read_text() == "deployed\n"  # ran once, approved
    screenshots.take(page, "ui-approved")

    # "Fork from here" on a cluster run shows the AgentRun to apply.
    page.locator(".tl-row.call", has_text="shell").click()
    fork = page.locator("#detail-body details.fork").first
    fork.locator("summary").click()
    manifest = yaml.safe_load(fork.locator(".fork-manifest").inner_text())
    assert manifest["metadata"]["namespace"] == namespace
    assert manifest["spec"]["forkFrom"]["run"] == name
    assert isinstance(manifest["spec"]["forkFrom"]["entry"], int)
