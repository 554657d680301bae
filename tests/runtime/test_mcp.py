"""MCP servers as an Agent's tools, against real MCP servers (the SDK's MCPServer) over
Streamable HTTP on loopback and over stdio, with the real anthropic client and the
scripted model server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from alpineagents import Agent, FileStore, Message, Permissions, State
from alpineagents.mcp import MCPServer, MCPServerUnavailable
from alpineagents.state import UNKNOWN_RESULT
from alpineagents.testing import ModelServer, reply, tool_use
from tests.bench.mcp_server import MCPTestServer, header_digest, stdio_server_command
from tests.paths import REPO

MODEL = "claude-sonnet-5"
ALL_TOOLS = ["add", "delete_everything", "divide", "slow", "whoami"]
StartServer = Callable[..., MCPTestServer]


# Every test's Agent (and child process) reaches the scripted model.
pytestmark = pytest.mark.usefixtures("model_endpoint")


def agent_for(folder: Path, *tools: Any, **options: Any) -> Agent:
    return Agent(MODEL, FileStore(folder), tools=tools, max_tokens=1024, **options)


def offered(model_server: ModelServer, request: int = 0) -> list[str]:
    return [t["name"] for t in model_server.requests[request].body.get("tools", [])]


def results(state: State) -> list[tuple[str, str | None, Any]]:
    return [
        (e.data["name"], e.outcome, e.data["content"])
        for e in state.history
        if e.kind == "tool_result"
    ]


def test_tools_are_listed_called_and_their_list_saved(
    tmp_path: Path, model_server: ModelServer, mcp_servers: StartServer
) -> None:
    server = mcp_servers()
    model_server.add(
        reply(tool_use("add", {"a": 2, "b": 3}), tool_use("divide", {"a": 9, "b": 3})),
        reply("5 and 3.0"),
    )
    state = State("sums", [Message.user("Add 2 and 3, divide 9 by 3")])
    agent = agent_for(tmp_path, MCPServer("calc", url=server.url))
    assert agent.run(state) == "5 and 3.0"

    assert offered(model_server) == ALL_TOOLS
    add = next(t for t in model_server.requests[0].body["tools"] if t["name"] == "add")
    assert add["description"] == "Adds two whole numbers."
    assert add["input_schema"]["required"] == ["a", "b"]
    # The two calls run concurrently: each result is saved as it arrives, in either order.
    assert sorted(results(state)) == [("add", "ok", "5"), ("divide", "ok", "3.0")]
    assert sorted(server.calls()) == ["add", "divide"]
    loaded = FileStore(tmp_path).load("sums")
    listed = [e for e in loaded.history if e.kind == "tools"]
    assert len(listed) == 1 and listed[0].data["source"] == "calc"
    assert [t["name"] for t in listed[0].data["tools"]] == ALL_TOOLS
    assert loaded.tool_lists["calc"].started == listed[0].data["tools"]


def test_a_state_with_tool_lists_stays_format_5_and_replays_the_same_without_them(
    tmp_path: Path, model_server: ModelServer, mcp_servers: StartServer
) -> None:
    server = mcp_servers()
    model_server.add(reply(tool_use("add", {"a": 1, "b": 1})), reply("2"))
    agent_for(tmp_path, MCPServer("calc", url=server.url)).run(State("v5", [Message.user("Add")]))
    record = FileStore(tmp_path).read("v5")
    assert record is not None and record.info["v"] == 5
    # What a format 5 reader that predates the tools entry derives: it skips the entry.
    kept = [e for e in record.entries if e["kind"] != "tools"]
    without = FileStore(tmp_path / "without")
    without.write("v5", [{**e, "seq": i} for i, e in enumerate(kept)], record.info, create=True)
    skipped = without.load("v5")
    loaded = FileStore(tmp_path).load("v5")
    assert (skipped.messages, skipped.answer, skipped.turns) == (
        loaded.messages,
        loaded.answer,
        loaded.turns,
    )
    assert skipped.tool_lists == {} and list(loaded.tool_lists) == ["calc"]


def test_a_stdio_server_is_started_by_the_run(tmp_path: Path, model_server: ModelServer) -> None:
    calls = tmp_path / "stdio-calls.txt"
    command, *args = stdio_server_command(calls)
    model_server.add(reply(tool_use("add", {"a": 20, "b": 22})), reply("42"))
    state = State("stdio", [Message.user("Add 20 and 22")])
    agent = agent_for(tmp_path / "runs", MCPServer("calc", command=command, args=args))
    assert agent.run(state) == "42"
    assert offered(model_server) == ALL_TOOLS
    assert results(state) == [("add", "ok", "42")]
    assert calls.read_text().splitlines() == ['add {"a": 20, "b": 22}']


def test_only_the_allowed_tools_are_offered_or_run(
    tmp_path: Path, model_server: ModelServer, mcp_servers: StartServer
) -> None:
    server = mcp_servers()
    model_server.add(
        reply(tool_use("delete_everything"), tool_use("add", {"a": 1, "b": 1})), reply("Done.")
    )
    state = State("allowed", [Message.user("Clean up")])
    calc = MCPServer("calc", url=server.url, allow=["add", "divide"])
    agent_for(tmp_path, calc).run(state)

    assert offered(model_server) == ["add", "divide"]
    (name, outcome, content), added = results(state)
    assert (name, outcome) == ("delete_everything", "error")
    assert "unknown tool 'delete_everything'" in content
    assert added == ("add", "ok", "2")
    assert server.calls() == ["add"]


def test_an_allow_list_naming_a_tool_the_server_lacks_fails_the_run_before_the_model(
    tmp_path: Path, model_server: ModelServer, mcp_servers: StartServer
) -> None:
    server = mcp_servers()
    calc = MCPServer("calc", url=server.url, allow=["add", "substract"])
    with pytest.raises(ValueError, match=r"MCP server 'calc' has no tool 'substract'.*add"):
        agent_for(tmp_path, calc).run(State("typo", [Message.user("Go")]))
    assert model_server.requests == []


def test_an_error_the_server_returns_is_an_error_result_the_model_sees(
    tmp_path: Path, model_server: ModelServer, mcp_servers: StartServer
) -> None:
    server = mcp_servers()
    model_server.add(
        reply(tool_use("divide", {"a": 1, "b": 0}, id="toolu_div")),
        reply(tool_use("add", {"a": "two", "b": 3}, id="toolu_add")),
        reply("Neither worked."),
    )
    state = State("errors", [Message.user("Divide 1 by 0")])
    assert agent_for(tmp_path, MCPServer("calc", url=server.url)).run(state) == "Neither worked."

    (_, divided, said), (_, added, invalid) = results(state)
    assert divided == "error" and "cannot divide by zero" in said
    assert added == "error" and "a" in invalid
    seen = model_server.requests[1].body["messages"][-1]["content"][0]
    assert seen["tool_use_id"] == "toolu_div" and seen["is_error"] is True
    assert "cannot divide by zero" in seen["content"]


def test_permissions_apply_to_mcp_tools(
    tmp_path: Path, model_server: ModelServer, mcp_servers: StartServer
) -> None:
    server = mcp_servers()
    model_server.add(
        reply(tool_use("delete_everything", id="toolu_del"), tool_use("add", {"a": 1, "b": 2})),
        reply("Asked."),
    )
    policy = Permissions(ask=["add"], refuse=["delete_everything"])
    agent = agent_for(tmp_path, MCPServer("calc", url=server.url), permissions=policy)
    state = State("asked", [Message.user("Go")])
    assert agent.run(state) is None and state.stopped == "waiting_for_approval"
    assert server.calls() == []
    assert [(name, outcome) for name, outcome, _ in results(state)] == [
        ("delete_everything", "refused")
    ]

    state.approve(state.awaiting_approval[0].id, True)
    assert agent.run(state) == "Asked."
    assert server.calls() == ["add"]


def test_an_unreachable_server_fails_the_run_with_a_clear_retryable_reason(
    tmp_path: Path, model_server: ModelServer
) -> None:
    import socket

    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}/mcp"
    state = State("down", [Message.user("Go")])
    with pytest.raises(
        MCPServerUnavailable, match=rf"MCP server 'calc' at {url} cannot be reached"
    ):
        agent_for(tmp_path, MCPServer("calc", url=url, timeout=30)).run(state)
    assert model_server.requests == []
    stop = FileStore(tmp_path).load("down").history[-1]
    assert stop.kind == "stop" and "MCPServerUnavailable" in stop.data["error"]


def test_a_call_past_the_timeout_is_an_error_result(
    tmp_path: Path, model_server: ModelServer, mcp_servers: StartServer
) -> None:
    server = mcp_servers()
    model_server.add(reply(tool_use("slow", {"label": "late"})), reply("It timed out."))
    state = State("late", [Message.user("Count slowly")])
    agent = agent_for(tmp_path, MCPServer("calc", url=server.url, timeout=2))
    assert agent.run(state) == "It timed out."
    assert results(state) == [
        ("slow", "error", "MCPToolError: MCP server 'calc' did not answer within 2s")
    ]
    assert server.calls() == ["slow"]


def test_a_stdio_command_missing_from_the_image_is_not_retryable(
    tmp_path: Path, model_server: ModelServer
) -> None:
    files = MCPServer("files", command="no-such-mcp-server-binary")
    with pytest.raises(ValueError, match="cannot start 'no-such-mcp-server-binary'"):
        agent_for(tmp_path, files).run(State("missing", [Message.user("Go")]))
    assert model_server.requests == []


def test_a_resumed_run_keeps_the_tools_it_started_with_and_says_the_server_changed(
    tmp_path: Path, model_server: ModelServer, mcp_servers: StartServer
) -> None:
    first = mcp_servers(variant=1)
    model_server.add(reply(tool_use("add", {"a": 1, "b": 2})))
    state = State("upgrade", [Message.user("Add")])
    agent_for(tmp_path, MCPServer("calc", url=first.url), max_turns=1).run(state)
    assert state.stopped == "max_turns"
    first.stop()

    upgraded = mcp_servers(variant=2)  # no add, a new multiply
    model_server.add(reply(tool_use("add", {"a": 3, "b": 4})), reply("The server lost add."))
    state = FileStore(tmp_path).load("upgrade")
    answer = agent_for(tmp_path, MCPServer("calc", url=upgraded.url)).run(state)
    assert answer == "The server lost add."

    assert offered(model_server, 1) == ALL_TOOLS  # as the run started, not multiply
    notes = [e.text for e in state.history if e.kind == "tools"]
    assert len(notes) == 2
    assert notes[1] == (
        "MCP server 'calc' changed its tools since the run started (added multiply; "
        "removed add); the run keeps the tools it started with"
    )
    name, outcome, content = results(state)[-1]
    assert (name, outcome) == ("add", "error") and "add" in content
    assert upgraded.calls() == []

    # A third run against the same upgraded server says nothing new.
    state.send("Thanks")
    model_server.add(reply("You're welcome."))
    agent_for(tmp_path, MCPServer("calc", url=upgraded.url)).run(state)
    assert len([e for e in state.history if e.kind == "tools"]) == 2


def test_sigkill_during_a_slow_call_resumes_with_it_aborted_and_never_called_again(
    tmp_path: Path, model_server: ModelServer, mcp_servers: StartServer
) -> None:
    server = mcp_servers()
    model_server.add(
        reply(
            tool_use("slow", {"label": "report"}, id="toolu_slow"),
            tool_use("add", {"a": 2, "b": 3}, id="toolu_add"),
        )
    )
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.agents.mcp_child", str(tmp_path), "counted", server.url],
        cwd=REPO,
        env={**os.environ, **model_server.env},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    server.wait_for("slow started")
    for line in child.stdout:  # add's result is saved while slow still runs
        if line.startswith("saved") and "tool_result" in line:
            break
    child.send_signal(signal.SIGKILL)
    assert child.wait(60) == -signal.SIGKILL

    state = FileStore(tmp_path).load("counted")
    assert results(state) == [
        ("add", "ok", "5"),
        ("slow", "aborted", UNKNOWN_RESULT),
    ]
    model_server.add(reply("The slow count may or may not have happened."))
    resumed = agent_for(tmp_path, MCPServer("calc", url=server.url)).run(state)
    assert resumed == "The slow count may or may not have happened."
    assert server.calls().count("slow") == 1
    sent = model_server.requests[-1].body["messages"][-1]["content"]
    assert {b["tool_use_id"]: b.get("is_error", False) for b in sent} == {
        "toolu_slow": True,
        "toolu_add": False,
    }


def test_the_headers_reach_the_server_and_stay_out_of_repr(
    tmp_path: Path, model_server: ModelServer, mcp_servers: StartServer
) -> None:
    server = mcp_servers()
    calc = MCPServer("calc", url=server.url, headers={"Authorization": "Bearer s3cret"})
    model_server.add(reply(tool_use("whoami")), reply("Checked."))
    state = State("headers", [Message.user("Who am I?")])
    agent_for(tmp_path, calc).run(state)
    assert results(state) == [("whoami", "ok", header_digest("Bearer s3cret"))]
    assert "s3cret" not in repr(calc)


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({}, "give either url"),
        ({"url": "http://x/mcp", "command": "x"}, "give either url"),
        ({"url": "ftp://x/mcp"}, "must be http:// or https://"),
        ({"command": "x", "args": "--stdio"}, "args must be a list"),
        ({"url": "http://x/mcp", "allow": "add"}, "allow must be a list"),
        ({"url": "http://x/mcp", "timeout": 0}, "timeout must be"),
    ],
)
def test_a_bad_server_config_is_refused_at_once(options: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        MCPServer("calc", **options)


def test_a_step_called_outside_a_run_says_the_servers_open_only_in_run(tmp_path: Path) -> None:
    import asyncio

    agent = agent_for(tmp_path, MCPServer("calc", url="http://127.0.0.1:9/mcp"))
    with pytest.raises(RuntimeError, match="open only while it runs"):
        asyncio.run(agent.think(State("alone", [Message.user("Go")])))
