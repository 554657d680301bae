"""The connection to one MCP server for one run, through the official ``mcp`` SDK.

Only :meth:`alpineagents.mcp.MCPServer.open` imports this module, so the SDK (the
``mcp`` extra) is needed only by a run that connects to a server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from types import TracebackType
from typing import Any

import httpx2
import mcp_types
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from .mcp_config import MCPServerConfig, MCPServerUnavailable, MCPToolError
from .tools import ToolOutput
from .toolsets import OpenToolset

_LIST_PAGES = 100  # a server whose tool list never ends cannot hang the run's start
_CLOSE_WAIT = 10.0  # seconds a session may take to close before its keeper is cancelled


class Connection:
    """One run's session with a server, kept by a task of its own.

    The SDK's client runs task groups that must be entered and left in one task, and
    cancel that task when the connection breaks; a keeper task holds them, so a server
    that goes away fails the calls still waiting (error results) instead of the run.
    """

    def __init__(self, server: MCPServerConfig) -> None:
        self.server = server
        self.listed: list[dict[str, Any]] = []
        self.unlisted: list[str] = []
        self._client: Client | None = None
        self._closing = asyncio.Event()
        self._keeper: asyncio.Task[None] | None = None
        self._lost: BaseException | None = None
        self._refused: int | None = None  # the last HTTP error status the server answered

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
            if server.command is not None and isinstance(_first(error), FileNotFoundError):
                raise ValueError(
                    f"{server.title}: cannot start {server.command!r}: no such command (install "
                    f"it in the image, or give its full path)"
                ) from None
            if isinstance(error, Exception):
                raise MCPServerUnavailable(
                    f"{server.title} at {server.address} cannot be reached: "
                    f"{self._refusal() or _reason(error)}"
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
            if error.code == mcp_types.REQUEST_TIMEOUT:
                raise MCPToolError(_late(server)) from None
            raise MCPToolError(
                f"{server.title}: {error.message} (MCP error {error.code})"
            ) from None
        except TimeoutError:
            raise MCPToolError(_late(server)) from None
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

    def _refusal(self) -> str | None:
        status = self._refused
        if status is None:
            return None
        if status in (401, 403):
            return f"it refused the request (HTTP {status}): check its headers (the Secret's value)"
        return f"it answered HTTP {status}"

    async def _note_status(self, response: Any) -> None:
        if response.status_code >= 400:
            self._refused = response.status_code

    def _transport(self) -> Any:
        server = self.server
        if server.url is not None:
            http = httpx2.AsyncClient(
                headers=dict(server.headers),
                event_hooks={"response": [self._note_status]},
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
            # Bounded: a stopping pod has its grace period (30 s) for everything, and the
            # State is saved before its toolsets close.
            await asyncio.wait_for(asyncio.shield(keeper), min(self.server.timeout, _CLOSE_WAIT))
        except Exception:
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


def _late(server: MCPServerConfig) -> str:
    return f"{server.title} did not answer within {server.timeout:g}s"


def _first(error: BaseException) -> BaseException:
    """The first real error inside the SDK's exception groups."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


def _reason(error: BaseException) -> str:
    """The first real error inside the SDK's exception groups, as ``Type: message``."""
    error = _first(error)
    if isinstance(error, MCPError):
        return f"MCP error {error.code}: {error.message}"
    return f"{type(error).__name__}: {error}"
