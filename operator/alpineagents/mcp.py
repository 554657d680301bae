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
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

try:
    import httpx2
    import mcp_types
    from mcp import Client, StdioServerParameters
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.exceptions import MCPError
except ImportError as missing:  # pragma: no cover - depends on the install
    raise ImportError(
        f"alpineagents.mcp needs the MCP SDK ({missing.name} is missing): "
        f"pip install 'alpineagents[mcp]'"
    ) from missing

from .tools import ToolOutput
from .toolsets import OpenToolset, Toolset, ToolsetUnavailable

DEFAULT_TIMEOUT = 60.0
"""Seconds a server may take to connect and list its tools, and each tool call."""
_LIST_PAGES = 100  # a server whose tool list never ends cannot hang the run's start


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

    def open(self) -> _Connection:
        return _Connection(self)


class _Connection:
    """One run's session with a server, kept by a task of its own.

    The SDK's client runs task groups that must be entered and left in one task, and
    cancel that task when the connection breaks; a keeper task holds them, so a server
    that goes away fails the calls still waiting (error results) instead of the run.
    """

    def __init__(self, server: MCPServer) -> None:
        self.server = server
        self.listed: list[dict[str, Any]] = []
        self.unlisted: list[str] = []
        self._client: Client | None = None
        self._closing = asyncio.Event()
        self._keeper: asyncio.Task[None] | None = None
        self._lost: BaseException | None = None

    async def __aenter__(self) -> OpenToolset:
        server = self.server
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._keeper = asyncio.create_task(self._keep(ready), name=f"mcp-{server.name}")
        try:
            async with asyncio.timeout(server.timeout):
                await asyncio.shield(ready)
        except TimeoutError:
            await self._stop()
            raise MCPServerUnavailable(
                f"{server.title} at {server.address} did not list its tools within "
                f"{server.timeout:g}s"
            ) from None
        except BaseException as error:
            await self._stop()
            if isinstance(error, Exception):
                raise MCPServerUnavailable(
                    f"{server.title} at {server.address} cannot be reached: {_reason(error)}"
                ) from None
            raise
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self._stop()

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolOutput:
        """Call tool ``name``; an error the server returns raises :class:`MCPToolError`."""
        server, client = self.server, self._client
        if client is None or self._lost is not None:
            lost = _reason(self._lost) if self._lost is not None else "closed"
            raise MCPToolError(f"the connection to {server.title} was lost: {lost}")
        try:
            result = await client.call_tool(name, arguments, read_timeout_seconds=server.timeout)
        except MCPError as error:
            raise MCPToolError(
                f"{server.title}: {error.message} (MCP error {error.code})"
            ) from None
        except TimeoutError:
            raise MCPToolError(
                f"{server.title} did not answer within {server.timeout:g}s"
            ) from None
        output = _output(result)
        if result.is_error:
            raise MCPToolError(output if isinstance(output, str) else json.dumps(output))
        return output

    async def _keep(self, ready: asyncio.Future[None]) -> None:
        server = self.server
        try:
            async with Client(
                self._transport(),
                read_timeout_seconds=server.timeout,
                client_info=mcp_types.Implementation(name="alpineagents", version="0.1.0"),
            ) as client:
                listed = await _all_tools(client)
                allowed = None if server.allow is None else set(server.allow)
                self.listed = [_schema(t) for t in listed if allowed is None or t.name in allowed]
                names = {t.name for t in listed}
                self.unlisted = [n for n in (server.allow or ()) if n not in names]
                self._client = client
                ready.set_result(None)
                await self._closing.wait()
        except BaseException as error:
            if not ready.done():
                ready.set_exception(error)
            elif not self._closing.is_set():
                self._lost = error
            if isinstance(error, asyncio.CancelledError):
                raise
        finally:
            self._client = None

    def _transport(self) -> Any:
        server = self.server
        if server.url is not None:
            http = httpx2.AsyncClient(
                headers=dict(server.headers),
                timeout=httpx2.Timeout(server.timeout, read=max(server.timeout, 300.0)),
            )
            return _OwningTransport(http, streamable_http_client(server.url, http_client=http))
        return StdioServerParameters(
            command=str(server.command), args=list(server.args), env=dict(server.env) or None
        )

    async def _stop(self) -> None:
        self._closing.set()
        keeper = self._keeper
        if keeper is None or keeper.done():
            return
        try:
            await asyncio.wait_for(asyncio.shield(keeper), self.server.timeout)
        except (TimeoutError, Exception):
            keeper.cancel()
            with contextlib.suppress(BaseException):  # it is failing already
                await keeper


class _OwningTransport:
    """A Streamable HTTP transport that also closes the HTTP client it was given."""

    def __init__(self, http: Any, transport: Any) -> None:
        self.http = http
        self.transport = transport

    async def __aenter__(self) -> Any:
        await self.http.__aenter__()
        try:
            return await self.transport.__aenter__()
        except BaseException:
            await self.http.__aexit__(None, None, None)
            raise

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await self.transport.__aexit__(*exc)
        finally:
            await self.http.__aexit__(None, None, None)


async def _all_tools(client: Client) -> list[mcp_types.Tool]:
    tools: list[mcp_types.Tool] = []
    cursor: str | None = None
    for _ in range(_LIST_PAGES):
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            break
    return tools


def _schema(tool: mcp_types.Tool) -> dict[str, Any]:
    return {
        "name": tool.name,
        "description": tool.description or tool.title or tool.name,
        "input_schema": dict(tool.input_schema),
    }


def _output(result: mcp_types.CallToolResult) -> ToolOutput:
    """The result's content as a tool result: text when it is all text, else content blocks."""
    blocks: list[dict[str, Any]] = []
    for item in result.content:
        if isinstance(item, mcp_types.TextContent):
            blocks.append({"type": "text", "text": item.text})
        elif isinstance(item, mcp_types.ImageContent):
            blocks.append(
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": item.mime_type, "data": item.data},
                }
            )
        elif isinstance(item, mcp_types.EmbeddedResource):
            resource = item.resource
            if isinstance(resource, mcp_types.TextResourceContents):
                blocks.append({"type": "text", "text": resource.text})
            else:
                blocks.append({"type": "text", "text": f"[binary resource {resource.uri}]"})
        elif isinstance(item, mcp_types.ResourceLink):
            blocks.append({"type": "text", "text": f"[resource {item.uri}: {item.name}]"})
        else:
            blocks.append({"type": "text", "text": f"[{item.type} content: {item.mime_type}]"})
    if not blocks and result.structured_content is not None:
        return json.dumps(result.structured_content)
    if all(block["type"] == "text" for block in blocks):
        return "\n".join(block["text"] for block in blocks)
    return blocks


def _reason(error: BaseException) -> str:
    """The first real error inside the SDK's exception groups, as ``Type: message``."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    if isinstance(error, MCPError):
        return f"MCP error {error.code}: {error.message}"
    return f"{type(error).__name__}: {error}"


__all__ = ["DEFAULT_TIMEOUT", "MCPServer", "MCPServerUnavailable", "MCPToolError"]
