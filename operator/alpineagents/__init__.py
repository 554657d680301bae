"""alpineagents: LLM agents whose every step is saved, and that resume after any crash."""

from .file_store import FileStore
from .messages import Message
from .state import Entry, State, ToolCall
from .store import Record, StateInfo, Store

__all__ = ["Entry", "FileStore", "Message", "Record", "State", "StateInfo", "Store", "ToolCall"]
