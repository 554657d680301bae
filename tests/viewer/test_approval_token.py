"""Only the person who started ``alpineagents ui --allow-approvals`` can answer calls:
the approval endpoint takes the token the viewer printed in its address; serving on a
host other machines reach with approvals on needs an explicit flag and warns; no page
of the viewer can be framed. The real server as a child process, spoken to over HTTP."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import anthropic
import pytest

from alpineagents import Agent, FileStore, Message, Permissions, State, tool
from alpineagents.testing import ModelServer, reply, tool_use
from tests.bench.browser import ViewerProcess, Viewers
from tests.bench.runner_process import DEADLINE, REPO


def a_run_waiting_for_approval(
    store: FileStore, model: ModelServer, client: anthropic.Anthropic
) -> None:
    @tool
    def deploy(env: str) -> str:
        """Deploys.

        Args:
            env: where
        """
        return f"deployed to {env}"

    agent = Agent(
        "claude-sonnet-5",
        store,
        tools=[deploy],
        permissions=Permissions(ask=["deploy"]),
        client=client,
    )
    model.add(reply("Deploying.", tool_use("deploy", {"env": "production"}, id="toolu_deploy")))
    agent.run(State("release", [Message.user("Ship it")]))
    assert store.load("release").awaiting_approval


def post_approval(viewer: ViewerProcess, headers: dict[str, str]) -> tuple[int, str]:
    request = urllib.request.Request(
        f"{viewer.url}api/runs/release/approvals",
        data=json.dumps({"answers": [{"call_id": "toolu_deploy", "allow": True}]}).encode(),
        headers={"Content-Type": "application/json", **headers},
    )
    try:
        with urllib.request.urlopen(request, timeout=DEADLINE) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()


def test_an_approval_without_the_printed_token_is_refused(
    tmp_path: Path, model_server: ModelServer, model_client: anthropic.Anthropic, viewers: Viewers
) -> None:
    store = FileStore(tmp_path / "runs")
    a_run_waiting_for_approval(store, model_server, model_client)
    viewer = viewers.start("--store", str(store.folder), "--no-cluster", "--allow-approvals")
    assert viewer.address.startswith(viewer.url + "?token=")
    assert len(viewer.token) >= 32

    # Any local program could send these: no Origin, or this viewer's own, without the token.
    for headers in ({}, {"Origin": viewer.url.rstrip("/")}, {"X-Approval-Token": "guessed"}):
        status, body = post_approval(viewer, headers)
        assert status == 403, body
        assert "?token=" in json.loads(body)["error"]
        assert store.load("release").awaiting_approval  # nothing was recorded

    status, body = post_approval(viewer, {"X-Approval-Token": viewer.token})
    assert status == 200, body
    assert json.loads(body)["recorded_in"].startswith("State release in FileStore(")
    assert not store.load("release").awaiting_approval


def test_a_read_only_viewer_prints_no_token(tmp_path: Path, viewers: Viewers) -> None:
    viewer = viewers.start("--store", str(tmp_path), "--no-cluster")
    assert viewer.address == viewer.url and viewer.token == ""


def test_every_response_forbids_framing(tmp_path: Path, viewers: Viewers) -> None:
    viewer = viewers.start("--store", str(tmp_path), "--no-cluster", "--allow-approvals")
    for path in ("", "runs/x", "static/viewer.js", "api/runs", "static/missing"):
        try:
            with urllib.request.urlopen(viewer.url + path, timeout=DEADLINE) as response:
                headers = response.headers
        except urllib.error.HTTPError as refused:
            headers = refused.headers
        policy = headers["Content-Security-Policy"]
        assert "frame-ancestors 'none'" in policy, path
        assert "default-src 'none'" in policy and "script-src 'self'" in policy
        assert headers["X-Frame-Options"] == "DENY"
    # Also the refusal of a Host that is not this server's (DNS rebinding).
    foreign = urllib.request.Request(viewer.url, headers={"Host": "evil.example"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(foreign, timeout=DEADLINE)
    assert "frame-ancestors 'none'" in refused.value.headers["Content-Security-Policy"]


def ui(*args: str, tmp_path: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "alpineagents", "ui", "--port", "0", "--store", str(tmp_path),
         "--no-cluster", *args],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip


def test_approvals_on_a_host_others_reach_need_a_flag_and_warn(tmp_path: Path) -> None:
    refused = ui("--host", "0.0.0.0", "--allow-approvals", tmp_path=tmp_path)
    out, err = refused.communicate(timeout=DEADLINE)
    assert refused.returncode == 65
    assert out == ""
    (line,) = err.splitlines()
    assert line.startswith("alpineagents: --allow-approvals with --host 0.0.0.0 lets other")
    assert "--allow-remote-approvals" in line

    allowed = ui(
        "--host", "0.0.0.0", "--allow-approvals", "--allow-remote-approvals", tmp_path=tmp_path
    )
    try:
        assert allowed.stdout is not None and allowed.stderr is not None
        assert "?token=" in allowed.stdout.readline()
        assert allowed.stderr.readline().startswith("alpineagents ui: ")
        warning = allowed.stderr.readline()
        assert warning.startswith("alpineagents ui: warning: anyone who can reach 0.0.0.0:")
        assert "can read every run's history" in warning and "answer tool calls" in warning
    finally:
        allowed.terminate()
        allowed.communicate(timeout=DEADLINE)

    # Read-only is not private either: said at the start.
    reader = ui("--host", "0.0.0.0", tmp_path=tmp_path)
    try:
        assert reader.stdout is not None and reader.stderr is not None
        reader.stdout.readline()
        reader.stderr.readline()
        warning = reader.stderr.readline()
        assert "can read every run's history" in warning and "answer" not in warning
    finally:
        reader.terminate()
        reader.communicate(timeout=DEADLINE)
