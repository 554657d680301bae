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

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from .toolsets import OpenToolset, Toolset, ToolsetUnavailable

DEFAULT_TIMEOUT = 60.0
"""Seconds a server may take to connect and list its tools, and each tool call."""


class MCPServerUnavailable(ToolsetUnavailable):
    """An MCP server could not be reached, or did not list its tools, when the run started."""


class MCPToolError(Exception):
    """An error an MCP server returned for a tool call; the model sees it as an error result."""


@dataclass(frozen=True)
class MCPServer(Toolset):
    """An MCP server whose tools an Agent may call.

    Give ``url`` (Streamable HTTP, with ``headers`` sent on every request) or ``command``
    and ``args`` (a stdio server the run starts and stops; it gets a minimal environment
    plus ``env``). ``allow`` lists the tools to offer (default: every tool it lists);
    ``timeout`` bounds connecting and listing, and each call, in seconds.
    """

    name: str
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    command: str | None = None
    args: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    allow: Sequence[str] | None = None
    timeout: float = DEFAULT_TIMEOUT

    def __post_init__(self) -> None:
        where = f"MCP server {self.name!r}"
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("an MCP server needs a non-empty name")
        if (self.url is None) == (self.command is None):
            raise ValueError(f"{where}: give either url (Streamable HTTP) or command (stdio)")
        if self.url is not None:
            parts = urlsplit(self.url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ValueError(f"{where}: url must be http:// or https://, not {self.url!r}")
        if self.command is not None and not self.command:
            raise ValueError(f"{where}: command must be a non-empty string")
        if isinstance(self.args, str):
            raise ValueError(f"{where}: args must be a list of strings, not one string")
        if isinstance(self.allow, str):
            raise ValueError(f"{where}: allow must be a list of tool names, not one string")
        if isinstance(self.timeout, bool) or not self.timeout > 0:
            raise ValueError(f"{where}: timeout must be a number of seconds above 0")

    @property
    def title(self) -> str:
        return f"MCP server {self.name!r}"

    @property
    def address(self) -> str:
        """Where it is: its URL, or its command line (never its headers or env)."""
        if self.url is not None:
            return self.url
        return " ".join([str(self.command), *self.args])

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
