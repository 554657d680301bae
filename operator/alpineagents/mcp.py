"""MCP servers as an Agent's tools, through the official ``mcp`` SDK (``alpineagents[mcp]``).

.. code-block:: python

    from alpineagents import Agent
    from alpineagents.mcp import MCPServer

    github = MCPServer(
        "github",
        url="http://github-mcp:8080/mcp",
        headers={"Authorization": f"Bearer {token}"},
        allow=["search_issues", "get_issue"],
    )
    files = MCPServer("files", command="python", args=["-m", "files_mcp"])
    agent = Agent("claude-sonnet-5", store, tools=[github, files])

Their tools are ordinary tools to the Agent: permissions apply by tool name, calls of one
turn run concurrently, each result is saved the moment it arrives, and a call that was
running when the process died gets an ``aborted`` result and is not called again. The
tool lists are recorded in the history when a run first needs them, and a resumed run
keeps the tools it started with (see :mod:`alpineagents.toolsets`).

An error the server reports (a tool's ``isError`` result, or an MCP protocol error such
as an unknown tool or a timeout) becomes an ``error`` result the model sees. A server
that cannot be reached when the run starts raises :class:`MCPServerUnavailable`.

The connection itself is in :mod:`alpineagents.mcp_client`; this module needs no SDK.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager

from .mcp_config import DEFAULT_TIMEOUT, MCPServerConfig, MCPServerUnavailable, MCPToolError
from .toolsets import OpenToolset, Toolset


class MCPServer(MCPServerConfig, Toolset):
    """An MCP server whose tools an Agent may call.

    Its settings (``url`` and ``headers``, or ``command``, ``args`` and ``env``; ``allow``
    and ``timeout``) are checked as :class:`~alpineagents.mcp_config.MCPServerConfig`'s.
    """

    def open(self) -> AbstractAsyncContextManager[OpenToolset]:
        # Imported here: the SDK is an extra, and a config (a spec being checked) needs none.
        try:
            from .mcp_client import Connection
        except ImportError as missing:
            raise ImportError(
                f"{self.title} needs the MCP SDK ({missing.name} is not installed): "
                f"pip install 'alpineagents[mcp]'"
            ) from missing
        return Connection(self)


__all__ = ["DEFAULT_TIMEOUT", "MCPServer", "MCPServerUnavailable", "MCPToolError"]
