"""Messages of a conversation, in the Messages API's shape."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["user", "assistant"]
Content = str | list[dict[str, Any]]


@dataclass(frozen=True)
class Message:
    """One message of the conversation: a role and its content (text or content blocks)."""

    role: Role
    content: Content = field(default="")

    @classmethod
    def user(cls, content: Content) -> Message:
        return cls("user", content)

    @classmethod
    def assistant(cls, content: Content) -> Message:
        return cls("assistant", content)

    @property
    def blocks(self) -> list[dict[str, Any]]:
        """The content as a list of content blocks."""
        if isinstance(self.content, str):
            return [{"type": "text", "text": self.content}] if self.content else []
        return list(self.content)

    @property
    def text(self) -> str:
        """The text blocks joined, without tool calls, results or images."""
        if isinstance(self.content, str):
            return self.content
        return "".join(b.get("text", "") for b in self.content if b.get("type") == "text")

    @property
    def tool_uses(self) -> list[dict[str, Any]]:
        return [b for b in self.blocks if b.get("type") == "tool_use"]

    def to_dict(self) -> dict[str, Any]:
        return {"role": self.role, "content": self.content}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Message:
        role = data.get("role")
        if role not in ("user", "assistant"):
            raise ValueError(f"a message's role must be 'user' or 'assistant', not {role!r}")
        return cls(role, data.get("content", ""))


def excerpt(text: str, limit: int = 200) -> str:
    """A one-line excerpt for an entry's human-readable text."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"
