"""alpineagents: LLM agents whose every step is saved, and that resume after any crash.

Everything a program needs is importable from here: the :class:`Agent` and its
:class:`State`, tools and permissions, the stores (:class:`FileStore`, :func:`open_store`
for a URL; ``MinioStore`` is in ``alpineagents.store.s3``, as it needs the ``minio``
extra), MCP servers as tools (:class:`MCPServer`; connecting needs the ``mcp`` extra),
the store errors (one family under :class:`StoreError`), the model's :class:`Retry`
policy and :class:`Provider` (Bedrock, Vertex AI, Foundry, a gateway), and the runner's
:class:`ExitCode`.

The face is lazy: a name is imported from its module the first time it is read, so
``import alpineagents.pod_contract`` (the operator's contract with the runner) loads
that one module and not the agent, the model client and their dependencies.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .agent import Agent
    from .context import Compaction
    from .errors import (
        MissingBucketError,
        StateExistsError,
        StateFencedError,
        StateFormatError,
        StateNotFoundError,
        StoreError,
        StoreUnavailableError,
    )
    from .forking import fork
    from .mcp import MCPServer, MCPServerUnavailable, MCPToolError
    from .messages import Message
    from .model import Retry
    from .permissions import Permissions
    from .pod_contract import ExitCode
    from .providers import Provider
    from .state import Entry, EntryKind, ForkPoint, Outcome, State, StopReason, ToolCall
    from .store import FileStore, Record, StateInfo, Store, open_store
    from .tools import Tool, tool
    from .toolsets import Toolset, ToolsetUnavailable
    from .usage import Budget, Price

# Each public name and the module (relative to this package) it lives in.
_HOMES: dict[str, str] = {
    "Agent": ".agent",
    "Budget": ".usage",
    "Compaction": ".context",
    "Entry": ".state",
    "EntryKind": ".state",
    "ExitCode": ".pod_contract",
    "FileStore": ".store",
    "ForkPoint": ".state",
    "MCPServer": ".mcp",
    "MCPServerUnavailable": ".mcp",
    "MCPToolError": ".mcp",
    "Message": ".messages",
    "MissingBucketError": ".errors",
    "Outcome": ".state",
    "Permissions": ".permissions",
    "Provider": ".providers",
    "Price": ".usage",
    "Record": ".store",
    "Retry": ".model",
    "State": ".state",
    "StateExistsError": ".errors",
    "StateFencedError": ".errors",
    "StateFormatError": ".errors",
    "StateInfo": ".store",
    "StateNotFoundError": ".errors",
    "StopReason": ".state",
    "Store": ".store",
    "StoreError": ".errors",
    "StoreUnavailableError": ".errors",
    "Tool": ".tools",
    "ToolCall": ".state",
    "Toolset": ".toolsets",
    "ToolsetUnavailable": ".toolsets",
    "fork": ".forking",
    "open_store": ".store",
    "tool": ".tools",
}

__all__ = [
    "Agent",
    "Budget",
    "Compaction",
    "Entry",
    "EntryKind",
    "ExitCode",
    "FileStore",
    "ForkPoint",
    "MCPServer",
    "MCPServerUnavailable",
    "MCPToolError",
    "Message",
    "MissingBucketError",
    "Outcome",
    "Permissions",
    "Price",
    "Provider",
    "Record",
    "Retry",
    "State",
    "StateExistsError",
    "StateFencedError",
    "StateFormatError",
    "StateInfo",
    "StateNotFoundError",
    "StopReason",
    "Store",
    "StoreError",
    "StoreUnavailableError",
    "Tool",
    "ToolCall",
    "Toolset",
    "ToolsetUnavailable",
    "fork",
    "open_store",
    "tool",
]


def __getattr__(name: str) -> Any:
    """Imports a public name's module on first access, then keeps the name here."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value  # later reads skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
