"""``spec.mcpServers`` through the runner (``alpineagents run`` as a real process), against
real MCP servers: secrets by variable, exit codes and termination messages, a SIGKILL
mid-call, and the examples/ manifests."""

from __future__ import annotations

import signal
import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from alpineagents.pod_contract import ExitCode
from alpineagents.state import UNKNOWN_RESULT
from alpineagents.testing import ModelServer, reply, tool_use
from tests.bench.infra import free_port
from tests.bench.mcp_server import MCPTestServer, header_digest
from tests.bench.runner_process import Workspace, tool_results
from tests.bench.server_process import ServerProcess
from tests.paths import REPO

StartServer = Callable[..., MCPTestServer]
HEADER_VARIABLE = "ALPINEAGENTS_MCP_CALC_HEADER_AUTHORIZATION"


def calc(url: str, **more: Any) -> dict[str, Any]:
    return {
        "name": "calc",
        "url": url,
        "headers": [{"name": "Authorization", "secretKeyRef": {"name": "calc", "key": "token"}}],
        **more,
    }


def test_the_runner_gives_the_run_its_mcp_servers_with_headers_from_variables(
    workspace: Workspace, model_server: ModelServer, mcp_servers: StartServer
) -> None:
    server = mcp_servers()
    model_server.add(reply(tool_use("whoami"), tool_use("add", {"a": 2, "b": 2})), reply("4."))
    manifest = workspace.manifest(prompt="Who am I?", mcpServers=[calc(server.url)])
    runner = workspace.run(manifest, **{HEADER_VARIABLE: "Bearer from-a-secret"})
    assert runner.process.returncode == ExitCode.ANSWERED, runner.stderr
    assert runner.message["answer"] == "4."
    state = workspace.store.load("job")
    # The two calls run at once: their results are saved in the order they finish.
    assert {r.data["name"]: r.text for r in tool_results(state)} == {
        "whoami": header_digest("Bearer from-a-secret"),
        "add": "4",
    }
    assert "tools of MCP server 'calc'" in runner.stderr  # the progress log shows the list


def test_an_unreachable_server_exits_retryable_with_a_clear_reason(
    workspace: Workspace, model_server: ModelServer
) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}/mcp"
    manifest = workspace.manifest(prompt="Add", mcpServers=[calc(url, timeoutSeconds=20)])
    runner = workspace.run(manifest, **{HEADER_VARIABLE: "Bearer x"})
    assert runner.process.returncode == ExitCode.RETRYABLE, runner.stderr
    assert runner.message["outcome"] == "retryable"
    assert runner.message["error"].startswith(
        f"tools unavailable: MCP server 'calc' at {url} cannot be reached: "
    )
    assert "Traceback" not in runner.stderr
    assert model_server.requests == []


def test_a_missing_secret_variable_is_not_retryable_and_names_it(
    workspace: Workspace, mcp_servers: StartServer
) -> None:
    manifest = workspace.manifest(prompt="Add", mcpServers=[calc("http://127.0.0.1:9/mcp")])
    runner = workspace.run(manifest)
    assert runner.process.returncode == ExitCode.NOT_RETRYABLE
    assert runner.message["error"] == (
        f"spec.mcpServers[0].headers[0]: {HEADER_VARIABLE} is not set: in a pod the operator "
        "sets it from Secret 'calc' key 'token'; to run elsewhere, export it with that value"
    )


def test_require_approval_names_must_be_in_the_allow_lists(workspace: Workspace) -> None:
    server = calc("http://127.0.0.1:9/mcp", tools=["add"])
    manifest = workspace.manifest(prompt="Add", mcpServers=[server], requireApproval=["divide"])
    runner = workspace.run(manifest, **{HEADER_VARIABLE: "Bearer x"})
    assert runner.process.returncode == ExitCode.NOT_RETRYABLE
    assert "spec.requireApproval: 'divide' is not a tool of this agent" in runner.message["error"]


def test_require_approval_asks_before_an_mcp_call(
    workspace: Workspace, model_server: ModelServer, mcp_servers: StartServer
) -> None:
    server = mcp_servers()
    model_server.add(reply(tool_use("add", {"a": 1, "b": 1}, id="toolu_add")), reply("2."))
    spec: dict[str, Any] = {"prompt": "Add", "mcpServers": [calc(server.url, tools=["add"])]}
    manifest = workspace.manifest(requireApproval=["add"], **spec)
    first = workspace.run(manifest, **{HEADER_VARIABLE: "Bearer x"})
    assert first.process.returncode == ExitCode.WAITING_FOR_APPROVAL, first.stderr
    assert server.calls() == []

    manifest = workspace.manifest(
        requireApproval=["add"], approvals=[{"callId": "toolu_add", "allow": True}], **spec
    )
    second = workspace.run(manifest, **{HEADER_VARIABLE: "Bearer x"})
    assert second.process.returncode == ExitCode.ANSWERED, second.stderr
    assert server.calls() == ["add"]


def test_a_runner_killed_mid_call_resumes_with_it_aborted_and_called_once(
    workspace: Workspace, model_server: ModelServer, mcp_servers: StartServer
) -> None:
    server = mcp_servers()
    model_server.add(reply(tool_use("slow", {"label": "report"}, id="toolu_slow")))
    manifest = workspace.manifest(prompt="Count", mcpServers=[calc(server.url)])
    runner = workspace.start(manifest, **{HEADER_VARIABLE: "Bearer x"})
    server.wait_for("slow started")
    runner.signal(signal.SIGKILL)
    assert runner.wait() == -signal.SIGKILL

    model_server.add(reply("The count may not have happened; I will not repeat it."))
    again = workspace.run(manifest, **{HEADER_VARIABLE: "Bearer x"})
    assert again.process.returncode == ExitCode.ANSWERED, again.stderr
    assert again.message["aborted"] == ["toolu_slow"]
    (result,) = tool_results(workspace.store.load("job"))
    assert (result.outcome, result.text) == ("aborted", UNKNOWN_RESULT)
    assert server.calls() == ["slow"]


# ------------------------------------------------------------------------- the examples
EXAMPLES = REPO / "examples"


@pytest.fixture
def runbooks_server(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """examples/mcp-server.yaml's server (its ConfigMap's script) as a local process:
    yields its URL and the Authorization value of its Secret."""
    objects = {o["kind"]: o for o in yaml.safe_load_all((EXAMPLES / "mcp-server.yaml").read_text())}
    script = tmp_path / "server.py"
    script.write_text(objects["ConfigMap"]["data"]["server.py"])
    authorization = objects["Secret"]["stringData"]["authorization"]
    port = free_port()
    process = ServerProcess(
        "runbooks-mcp",
        [sys.executable, str(script)],
        tmp_path / "runbooks.log",
        env={"AUTHORIZATION": authorization, "PORT": str(port), "PATH": "/usr/bin:/bin"},
    )
    process.start()
    try:
        process.wait_until(lambda: _accepts(port), "listening")
        yield f"http://127.0.0.1:{port}/mcp", authorization
    finally:
        process.stop()


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def example_manifest(workspace: Workspace, url: str) -> str:
    manifest = yaml.safe_load((EXAMPLES / "mcp-agentrun.yaml").read_text())
    manifest["spec"]["mcpServers"][0]["url"] = url  # the Service's address, here
    path = workspace.root / "mcp-agentrun.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return str(path)


def test_the_example_runs_against_the_example_server(
    workspace: Workspace, runbooks_server: tuple[str, str]
) -> None:
    url, authorization = runbooks_server
    variable = "ALPINEAGENTS_MCP_RUNBOOKS_HEADER_AUTHORIZATION"
    manifest = example_manifest(workspace, url)
    runner = workspace.run(manifest, "--offline", **{variable: authorization})
    assert runner.process.returncode == ExitCode.ANSWERED, runner.stderr
    assert "read_runbook returned: 1. Find the biggest folders" in runner.message["answer"]

    refused = workspace.run(manifest, "--offline", "--id", "wrong", **{variable: "Bearer no"})
    assert refused.process.returncode == ExitCode.RETRYABLE, refused.stderr
    assert refused.message["error"] == (
        f"tools unavailable: MCP server 'runbooks' at {url} cannot be reached: it refused the "
        "request (HTTP 401): check its headers (the Secret's value)"
    )
