"""alpineagents: LLM agents whose every step is saved, and that resume after any crash."""

from .agent import Agent
from .file_store import FileStore
from .messages import Message
from .permissions import Permissions
from .state import Entry, State, ToolCall
from .store import Record, StateInfo, Store
from .tools import Tool, tool

__all__ = [
    "Agent",
    "Entry",
    "FileStore",
    "Message",
    "Permissions",
    "Record",
    "State",
    "StateInfo",
    "Store",
    "Tool",
    "ToolCall",
    "tool",
]
