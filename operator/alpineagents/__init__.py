"""alpineagents: LLM agents whose every step is saved, and that resume after any crash.

Everything a program needs is importable from here: the :class:`Agent` and its
:class:`State`, tools and permissions, the stores (:class:`FileStore`, :func:`open_store`
for a URL; ``MinioStore`` is in ``alpineagents.store.s3``, as it needs the ``minio``
extra), MCP servers as tools (:class:`MCPServer`; connecting needs the ``mcp`` extra),
the store errors (one family under :class:`StoreError`), the model's :class:`Retry`
policy, and the runner's :class:`ExitCode`.
"""

from .agent import Agent
from .errors import (
    MissingBucketError,
    StateExistsError,
    StateFencedError,
    StateFormatError,
    StateNotFoundError,
    StoreError,
    StoreUnavailableError,
)
from .mcp import MCPServer, MCPServerUnavailable, MCPToolError
from .messages import Message
from .model import Retry
from .permissions import Permissions
from .pod_contract import ExitCode
from .state import Entry, EntryKind, Outcome, State, StopReason, ToolCall
from .store import FileStore, Record, StateInfo, Store, open_store
from .tools import Tool, tool
from .toolsets import Toolset, ToolsetUnavailable

__all__ = [
    "Agent",
    "Entry",
    "EntryKind",
    "ExitCode",
    "FileStore",
    "MCPServer",
    "MCPServerUnavailable",
    "MCPToolError",
    "Message",
    "MissingBucketError",
    "Outcome",
    "Permissions",
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
    "open_store",
    "tool",
]
