"""The run viewer in cluster mode, in a real chromium, on the operator's test bench.

The bench of tests/test_operator_e2e.py (kube-apiserver, the operator process, pods run
as local processes, MinIO as the store, the scripted model): an AgentRun waits for a
person, the viewer shows its phase and the waiting call, a click on Allow patches
``spec.approvals``, and the operator resumes the run to its answer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.bench.browser import Screenshots, Viewers
from tests.test_operator_e2e import (  # the bench's fixtures, shared with the e2e suite
    NAMESPACE,
    Bench,
    bench,
    release,
    run_name,
    starts,
    status,
    use,
)

__all__ = ["bench"]  # a fixture, used by name
pytestmark = pytest.mark.e2e

expect: Any
try:
    from playwright.sync_api import expect
except ImportError:  # the browser fixture skips (or fails in CI) with the reason
    expect = None


def test_an_approval_clicked_in_the_viewer_lets_the_agentrun_go_on(
    bench: Bench, tmp_path: Path, viewers: Viewers, page: Any, screenshots: Screenshots
) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    name = run_name()
    release(markers, "deploy")
    bench.apply(name, markers, prompt=use("deploy"), requireApproval=["step"])
    waiting = status(bench.wait_phase(name, "WaitingForApproval"))
    [pending] = waiting["pendingApprovals"]
    state_id = waiting["stateId"]

    viewer = viewers.start(
        "--store",
        bench.store_url,
        "--kubeconfig",
        str(bench.plane.kubeconfig),
        "--allow-approvals",
        env={
            "AWS_ACCESS_KEY_ID": bench.minio.access_key,
            "AWS_SECRET_ACCESS_KEY": bench.minio.secret_key,
        },
    )
    page.goto(viewer.url)
    row = page.locator(f'#runs tr[data-id="{state_id}"]')
    expect(row).to_contain_text(f"{NAMESPACE}/{name}")
    expect(row).to_contain_text("WaitingForApproval")
    expect(page.locator("#runs thead")).to_contain_text("Restarts")
    screenshots.take(page, "ui-runs-cluster")

    row.locator("a").click()
    box = page.locator("#approvals")
    expect(box).to_contain_text('"name": "deploy"')
    expect(page.locator("#facts")).to_contain_text(f"AgentRun {NAMESPACE}/{name}")
    screenshots.take(page, "ui-approval")
    assert starts(markers, "deploy") == 0  # nothing ran without the person's answer

    box.locator("button.allow").click()
    expect(page.locator("#approval-result")).to_contain_text(f"AgentRun {NAMESPACE}/{name}")
    # The operator starts a pod that resumes the run; the page follows it to the answer.
    expect(page.locator("#answer")).to_contain_text("step returned: deploy done")
    expect(page.locator(".tl-row.call", has_text="step")).to_contain_text("ok")
    expect(page.locator(".tl-row.attempt")).to_contain_text("attempt 2")
    assert bench.run(name)["spec"]["approvals"] == [{"callId": pending["callId"], "allow": True}]
    assert status(bench.wait_phase(name, "Succeeded"))["answer"] == "step returned: deploy done"
    assert starts(markers, "deploy") == 1
    screenshots.take(page, "ui-approved")
