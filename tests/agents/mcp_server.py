"""A real MCP server for the tests, built with the SDK's own server API (MCPServer).

Usage: python -m tests.agents.mcp_server (http|stdio) CALLS_FILE [--variant 2] [--host ADDRESS]

Every tool call appends one line ``<tool> <arguments as JSON>`` to CALLS_FILE (fsynced
before the tool answers), so a test can count what the server really ran. Over HTTP it
listens on a free port of ``--host`` (default loopback; the real node's bridge address
for pods to reach it) and prints ``listening <url>``; ``slow`` prints
``slow started`` and then waits until the server is stopped. ``--variant 2`` serves a
changed list (no ``add``, a new ``multiply``), as a server that was upgraded would.
"""

from __future__ import annotations

import argparse
import hashlib
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
parser.add_argument("--host", default="127.0.0.1")
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
    """Says which Authorization header the request carried, as its SHA-256 (so the
    history a test reads proves the header arrived without holding the secret)."""
    record("whoami")
    headers = getattr(ctx.request_context.request, "headers", None)
    if headers is None:
        return "(stdio)"
    return digest(headers.get("authorization", "(none)"))


def digest(value: str) -> str:
    return "sha256:" + hashlib.sha256(value.encode()).hexdigest()


async def serve_http() -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((options.host, 0))
    listener.listen(128)  # connections wait in the backlog until uvicorn serves them
    port = listener.getsockname()[1]
    # The SDK turns its DNS-rebinding guard on for a loopback host only: told the bridge
    # address, it accepts the Host header pods send.
    app = server.streamable_http_app(host=options.host)
    config = uvicorn.Config(app, log_level="warning")
    print(f"listening http://{options.host}:{port}/mcp", flush=True)
    await uvicorn.Server(config).serve(sockets=[listener])


if options.transport == "http":
    anyio.run(serve_http)
else:
    server.run("stdio")
