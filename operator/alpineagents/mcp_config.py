"""An MCP server's settings and the errors its connection raises.

Both the :class:`~alpineagents.mcp.MCPServer` toolset (:mod:`alpineagents.mcp`, no SDK
needed) and its connection through the SDK (:mod:`alpineagents.mcp_client`) import them
from here, so neither imports the other at module level.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from .toolsets import ToolsetUnavailable

DEFAULT_TIMEOUT = 60.0
"""Seconds a server may take to connect and list its tools, and each tool call."""


class MCPServerUnavailable(ToolsetUnavailable):
    """An MCP server could not be reached, or did not list its tools, when the run started."""


class MCPToolError(Exception):
    """An error an MCP server returned for a tool call; the model sees it as an error result."""


@dataclass(frozen=True)
class MCPServerConfig:
    """An MCP server's settings, checked when made; ``MCPServer`` adds the connection.

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


__all__ = ["DEFAULT_TIMEOUT", "MCPServerConfig", "MCPServerUnavailable", "MCPToolError"]
