"""Permission checks: allow, refuse, or ask a person before a tool call runs."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from .state import ToolCall

Decision = Literal["allow", "refuse", "ask"]
Policy = Callable[[ToolCall], Decision]
AskPerson = Callable[[ToolCall], bool | Awaitable[bool]]


@dataclass(frozen=True)
class Permissions:
    """A policy by tool name: names in ``allow``, ``refuse`` or ``ask``, else ``default``."""

    allow: Iterable[str] = ()
    refuse: Iterable[str] = ()
    ask: Iterable[str] = ()
    default: Decision = "allow"

    def __call__(self, call: ToolCall) -> Decision:
        if call.name in set(self.refuse):
            return "refuse"
        if call.name in set(self.ask):
            return "ask"
        if call.name in set(self.allow):
            return "allow"
        return self.default


def allow_all(call: ToolCall) -> Decision:
    return "allow"
