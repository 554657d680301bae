"""A real MCP server for the tests, built with the SDK's own server API (MCPServer).

Usage: python -m tests.agents.mcp_server (http|stdio) CALLS_FILE [--variant 2]

Every tool call appends one line ``<tool> <arguments as JSON>`` to CALLS_FILE (fsynced
before the tool answers), so a test can count what the server really ran. Over HTTP it
listens on a free loopback port and prints ``listening <url>``; ``slow`` prints
``slow started`` and then waits until the server is stopped. ``--variant 2`` serves a
changed list (no ``add``, a new ``multiply``), as a server that was upgraded would.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from typing import Any

import anyio
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

parser = argparse.ArgumentParser()
parser.add_argument("transport", choices=["http", "stdio"])
parser.add_argument("calls")
parser.add_argument("--variant", type=int, default=1)
options = parser.parse_args()

server = MCPServer("alpineagents-test")


def record(tool: str, **arguments: Any) -> None:
    with open(options.calls, "a", encoding="utf-8") as calls:
        calls.write(f"{tool} {json.dumps(arguments, sort_keys=True)}\n")
        calls.flush()
        os.fsync(calls.fileno())


if options.variant == 1:

    @server.tool()
    def add(a: int, b: int) -> str:
        """Adds two whole numbers."""
        record("add", a=a, b=b)
        return str(a + b)

else:

    @server.tool()
    def multiply(a: int, b: int) -> str:
        """Multiplies two whole numbers."""
        record("multiply", a=a, b=b)
        return str(a * b)


@server.tool()
def divide(a: float, b: float) -> str:
    """Divides a by b."""
    record("divide", a=a, b=b)
    if b == 0:
        raise ToolError("cannot divide by zero")
    return str(a / b)


@server.tool()
def delete_everything() -> str:
    """Deletes every file (an allow-list must keep the model away from it)."""
    record("delete_everything")
    return "deleted"


@server.tool()
async def slow(label: str) -> str:
    """Takes its time: answers only when the server stops."""
    record("slow", label=label)
    # stdout is the protocol's own stream under stdio
    print(
        "slow started", flush=True, file=sys.stdout if options.transport == "http" else sys.stderr
    )
    await anyio.sleep_forever()
    return "never"


@server.tool()
def whoami(ctx: Context) -> str:
    """Says which Authorization header the request carried."""
    record("whoami")
    request = ctx.request_context.request
    headers = getattr(request, "headers", None)
    return str(headers.get("authorization", "(none)")) if headers is not None else "(stdio)"


async def serve_http() -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    app = server.streamable_http_app()
    config = uvicorn.Config(app, log_level="warning")
    print(f"listening http://127.0.0.1:{port}/mcp", flush=True)
    await uvicorn.Server(config).serve(sockets=[listener])


if options.transport == "http":
    anyio.run(serve_http)
else:
    server.run("stdio")
