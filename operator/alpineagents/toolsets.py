"""Tool sources that live as long as a run, such as an MCP server (``alpineagents.mcp``).

A :class:`Toolset` is opened the first time a run needs its tools (its first ``think`` or
``use_tools``; a run with nothing left to do never reaches it) and closed when the run
ends. What it lists is recorded in the State's history as a ``tools`` entry, and the tools
the run offers the model are always the ones recorded first: a run resumed after a crash
or a restart uses the tools it started with, even if the source changed them meanwhile.
A changed list gets a ``tools`` entry of its own whose text says what changed, and a
warning in the log; the model keeps the tools it started with (a call to a tool the
source no longer has gets the source's error as its result).

The ``tools`` entry changes no derived view but ``State.tool_lists``, so a State holding
one stays in format 5: a reader that predates it skips the entry and derives the same
messages, calls and answer.
"""

from __future__ import annotations

import abc
import json
import logging
from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from typing import Any, Protocol

from .messages import excerpt
from .state import State
from .tools import Tool

_log = logging.getLogger(__name__)


class OpenToolset(Protocol):
    """A toolset while a run has it open: what it lists, and how to call one of its tools."""

    listed: list[dict[str, Any]]
    """Its tools as the Messages API takes them: ``{"name", "description", "input_schema"}``."""
    unlisted: list[str]
    """Tools it was asked to offer (an allow-list) that it does not list."""

    async def call(self, name: str, arguments: dict[str, Any]) -> Any:
        """Call one of its tools; the value becomes the result (raise for an error result)."""
        ...


class Toolset(abc.ABC):
    """A source of tools listed when a run starts; ``Agent(tools=[...])`` takes it beside tools.

    Subclasses set ``name`` (unique among an Agent's toolsets; it names the source in the
    history) and implement :meth:`open`.
    """

    name: str

    @property
    def title(self) -> str:
        """How messages name this source, e.g. ``MCP server 'github'``."""
        return f"tool source {self.name!r}"

    @abc.abstractmethod
    def open(self) -> AbstractAsyncContextManager[OpenToolset]:
        """Connect for the length of a run. Raise :class:`ToolsetUnavailable` when it cannot."""


class ToolsetUnavailable(Exception):
    """A toolset could not be opened (its server is down or did not answer); a retry may help."""


class RunToolsets:
    """The toolsets of one run: opened on first use, recorded in the State, closed at the end."""

    def __init__(self, toolsets: Sequence[Toolset]) -> None:
        self.toolsets = list(toolsets)
        self._stack = AsyncExitStack()
        self._tools: dict[str, Tool] | None = None

    async def tools(self, state: State, own: Mapping[str, Tool]) -> dict[str, Tool]:
        """``own`` tools plus the toolsets' tools the run started with (opening them once)."""
        if self._tools is None:
            names = [t.name for t in self.toolsets]
            twice = sorted({n for n in names if names.count(n) > 1})
            if twice:
                raise ValueError(f"two toolsets of this agent are named {twice[0]!r}; rename one")
            tools = dict(own)
            for toolset in self.toolsets:
                opened = await self._stack.enter_async_context(toolset.open())
                for schema in _recorded(state, toolset, opened):
                    name = str(schema["name"])
                    if name in tools:
                        raise ValueError(
                            f"{toolset.title} has a tool named {name!r}, like another tool of "
                            f"this agent; offer only one of them (an allow-list of its tools)"
                        )
                    tools[name] = _remote_tool(schema, opened)
            self._tools = tools
        return self._tools

    async def aclose(self) -> None:
        """Close every toolset opened (a failure to close is logged, never raised)."""
        try:
            await self._stack.aclose()
        except Exception as error:
            _log.warning("closing the run's toolsets failed: %s: %s", type(error).__name__, error)


def _recorded(state: State, toolset: Toolset, opened: OpenToolset) -> list[dict[str, Any]]:
    """The tools the run uses from ``toolset``, adding a ``tools`` entry for a new list."""
    listed = sorted(opened.listed, key=lambda schema: str(schema["name"]))
    known = state.tool_lists.get(toolset.name)
    if known is None:
        if opened.unlisted:
            names = ", ".join(repr(n) for n in opened.unlisted)
            offered = ", ".join(str(s["name"]) for s in listed) or "none"
            raise ValueError(
                f"{toolset.title} has no tool {names} (its tools: {offered}); fix its allow-list"
            )
        names = ", ".join(str(s["name"]) for s in listed) or "none"
        state.add("tools", f"tools of {toolset.title}: {names}", _entry(toolset, listed))
        return listed
    if _same(listed, known.latest):
        return known.started
    change = _change(known.started, listed)
    text = (
        f"{toolset.title} changed its tools since the run started ({change}); the run keeps "
        f"the tools it started with"
    )
    _log.warning("State %r: %s", state.id, text)
    state.add("tools", excerpt(text, 500), _entry(toolset, listed))
    return known.started


def _entry(toolset: Toolset, listed: list[dict[str, Any]]) -> dict[str, Any]:
    return {"source": toolset.name, "tools": listed}


def _same(one: list[dict[str, Any]], other: list[dict[str, Any]]) -> bool:
    return _canonical(one) == _canonical(other)


def _canonical(schemas: list[dict[str, Any]]) -> dict[str, str]:
    return {str(s["name"]): json.dumps(s, sort_keys=True) for s in schemas}


def _change(before: list[dict[str, Any]], now: list[dict[str, Any]]) -> str:
    old, new = _canonical(before), _canonical(now)
    parts = []
    for word, names in (
        ("added", sorted(new.keys() - old.keys())),
        ("removed", sorted(old.keys() - new.keys())),
        ("changed", sorted(n for n in old.keys() & new.keys() if old[n] != new[n])),
    ):
        if names:
            parts.append(f"{word} {', '.join(names)}")
    return "; ".join(parts)


def _remote_tool(schema: Mapping[str, Any], opened: OpenToolset) -> Tool:
    name = str(schema["name"])

    async def call_remote(**arguments: Any) -> Any:
        return await opened.call(name, arguments)

    return Tool(
        name=name,
        description=str(schema.get("description") or name),
        input_schema=dict(schema.get("input_schema") or {"type": "object"}),
        function=call_remote,
    )
