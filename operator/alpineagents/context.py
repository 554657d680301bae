"""The context a request carries: the model's window, prompt caching, compaction, and the
conversation in the API's shape (:class:`ApiMessages`, built step by step for a run).

A long run stays inside its model's window in two large steps (:class:`Compaction`):
first the results of older tool calls are cleared from the request (the history keeps
every byte; the request carries a short placeholder naming the entry), then, if that is
not enough, older turns are replaced by a model-written summary. Both are saved as
entries before a request uses them, so a resumed run sends what the lost one would have.

Prompt caching (:func:`with_cache_breakpoints`) marks at most four places of a request:
the tools, the system prompt, the end of the previous request (so its cache is read
however many blocks the last turn added) and the end of this one (written for the next).
The request is a pure function of the saved history, so a resumed pod's first request
reads what the lost pod wrote.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .messages import Message
from .model_ids import anthropic_model_id
from .usage import CacheTTL

if TYPE_CHECKING:
    from .state import State

__all__ = [
    "DEFAULT_WINDOW",
    "WINDOWS",
    "ApiMessages",
    "Compaction",
    "UnknownModelWarning",
    "compaction_cut",
    "merged_messages",
    "oversized_results",
    "window_for",
    "with_cache_breakpoints",
]

WINDOWS: tuple[tuple[str, int], ...] = (("claude-", 200_000),)
"""Known models' context windows in tokens, by model id prefix (the longest prefix that
matches wins; Bedrock's and Vertex AI's ids are looked up as the Anthropic id they name).
A larger window (a beta's 1M) is given with ``Agent(context_window=...)``
or ``spec.contextWindow``."""
DEFAULT_WINDOW = 100_000
"""The window assumed for a model no table knows: small on purpose, so such a run
compacts early rather than being refused."""
TOKENS_PER_CHAR = 1 / 3
"""Tokens per character of a request's JSON before a reply has measured it: more than
the usual 1/4, so a first estimate errs on the side of compacting."""


class UnknownModelWarning(UserWarning):
    """A model with no known context window: the run assumes :data:`DEFAULT_WINDOW`."""


def window_for(model: str, given: int | None = None) -> int:
    """The context window of ``model`` in tokens: ``given`` if set, else the table's.

    A model the table does not know gets a warning and :data:`DEFAULT_WINDOW`."""
    if given is not None:
        if isinstance(given, bool) or given < 1024:
            raise ValueError(f"context_window must be at least 1024 tokens, not {given!r}")
        return given
    # A provider's spelling (Bedrock's, Vertex AI's) is looked up as the Anthropic id.
    known = anthropic_model_id(model)
    matches = [(prefix, size) for prefix, size in WINDOWS if known.startswith(prefix)]
    if matches:
        return max(matches, key=lambda match: len(match[0]))[1]
    warnings.warn(
        f"model {model!r} has no known context window: assuming {DEFAULT_WINDOW} tokens; "
        f"give the real one with context_window= (spec.contextWindow)",
        UnknownModelWarning,
        stacklevel=3,
    )
    return DEFAULT_WINDOW


@dataclass(frozen=True)
class Compaction:
    """When and how a run keeps its requests inside the model's window.

    Before a request whose estimated size passes ``trigger`` (a fraction of the window),
    the run clears the results of older tool calls, keeping the newest ``keep_results``;
    a result that alone takes more than half the window is cut in the requests to a fifth
    of it, with a line saying which entry of the history holds all of it; if the
    request is then still above ``target``, it replaces older turns by a summary the model
    writes, keeping the last ``keep_turns`` turns as they are. A request the API refuses
    as too long compacts the same way and is sent again, at most three times in a row and
    only while each refused request is smaller than the one before; then the run fails
    with the API's error. ``clear_results=False`` or ``summarize=False`` leaves a step out.
    """

    trigger: float = 0.75
    target: float = 0.5
    keep_results: int = 3
    keep_turns: int = 3
    clear_results: bool = True
    summarize: bool = True

    def __post_init__(self) -> None:
        if not 0 < self.target <= self.trigger < 1:
            raise ValueError(
                f"Compaction needs 0 < target <= trigger < 1 (fractions of the window), "
                f"not target={self.target!r}, trigger={self.trigger!r}"
            )
        if self.keep_results < 0 or self.keep_turns < 1:
            raise ValueError("Compaction.keep_results must be >= 0 and keep_turns >= 1")


def check_cache_ttl(ttl: object) -> CacheTTL | None:
    """``"5m"``, ``"1h"`` or ``None`` (caching off), checked."""
    if ttl is None or ttl in ("5m", "1h"):
        return ttl
    raise ValueError(f"prompt_cache must be '5m', '1h' or None (off), not {ttl!r}")


def with_cache_breakpoints(request: dict[str, Any], ttl: CacheTTL) -> dict[str, Any]:
    """``request`` with ``cache_control`` on its tools, system prompt, the end of the
    previous request and its own end; what it shares with the caller is left unchanged."""
    control: dict[str, Any] = (
        {"type": "ephemeral"} if ttl == "5m" else {"type": "ephemeral", "ttl": ttl}
    )
    marked = dict(request)
    if tools := request.get("tools"):
        marked["tools"] = [*tools[:-1], {**tools[-1], "cache_control": control}]
    if system := request.get("system"):
        blocks = [{"type": "text", "text": system}] if isinstance(system, str) else list(system)
        blocks[-1] = {**blocks[-1], "cache_control": control}
        marked["system"] = blocks
    messages = list(request["messages"])
    # The previous request ended with the user message before the last reply.
    ends = [len(messages) - 1]
    if len(messages) >= 3 and messages[-2]["role"] == "assistant":
        ends.insert(0, len(messages) - 3)
    for index in ends:
        message = messages[index]
        content = message["content"]
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
        if not blocks:
            continue
        blocks[-1] = {**blocks[-1], "cache_control": control}
        messages[index] = {**message, "content": blocks}
    marked["messages"] = messages
    return marked


class ApiMessages:
    """The messages of the requests of one run, in the API's shape, built step by step.

    Each request appends what the conversation gained since the last one instead of
    converting the whole conversation again, so a step costs the same at any length and
    leaves no garbage that grows with it; the JSON length of the list is kept the same
    way. A compaction or a clearing (which change messages in place) builds it anew.
    """

    def __init__(self) -> None:
        self._merged: list[dict[str, Any]] = []
        self._sizes: list[int] = []
        self._chars = 2  # "[]"
        self._seen = 0
        self._edits = -1
        self._first: Message | None = None
        self._last: Message | None = None

    def __call__(self, state: State) -> tuple[list[dict[str, Any]], int]:
        messages, seen = state.messages, self._seen
        if state.context_edits != self._edits or (
            seen
            and (
                len(messages) < seen
                or messages[0] is not self._first
                or messages[seen - 1] is not self._last
            )
        ):
            self._merged, self._sizes, self._chars, seen = [], [], 2, 0
            self._edits = state.context_edits
        for message in messages[seen:]:
            merged = len(self._merged)
            _append_merged(self._merged, message)
            if len(self._merged) == merged:  # joined the last one
                self._chars -= self._sizes.pop()
            size = len(json.dumps(self._merged[-1])) + (2 if self._sizes else 0)  # ", "
            self._sizes.append(size)
            self._chars += size
        self._seen = len(messages)
        self._first = messages[0] if messages else None
        self._last = messages[-1] if messages else None
        return self._merged, self._chars


def _append_merged(merged: list[dict[str, Any]], message: Message) -> None:
    """Add a message: consecutive messages of one role become one (the API wants that)."""
    if merged and merged[-1]["role"] == message.role:
        # A new dict: the one before may belong to a request already sent.
        merged[-1] = {"role": message.role, "content": [*merged[-1]["content"], *message.blocks]}
    else:
        merged.append({"role": message.role, "content": message.blocks})


def merged_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """Messages for the API: consecutive messages of one role become one."""
    merged: list[dict[str, Any]] = []
    for message in messages:
        _append_merged(merged, message)
    return merged


def compaction_cut(messages: list[Message], keep_turns: int) -> int:
    """Where a summary's replacement ends: the latest place that keeps ``keep_turns``
    replies after it (or, in a shorter run, the latest place at all) where the kept tail
    can begin, an assistant message or a user message that answers no tool call."""
    replies = 0
    latest = 0
    for index in range(len(messages) - 1, 0, -1):
        message = messages[index]
        if message.role == "assistant":
            replies += 1
        can_begin = message.role == "assistant" or not any(
            b.get("type") == "tool_result" for b in message.blocks
        )
        if can_begin:
            latest = latest or index
            if replies >= keep_turns:
                return index
    return latest


# A result that alone takes more than this part of the window is cut in the requests to the
# smaller part (the history keeps all of it): room for the rest of the run and the reply.
# Below it, clearing older results and summarizing older turns keep more of the run.
HUGE_RESULT = 0.5
CUT_RESULT_TO = 0.2


def oversized_results(results: list[tuple[int, int]], window: int, ratio: float) -> list[list[int]]:
    """``[seq, characters kept]`` of each result (``(seq, characters)``) that alone takes
    more than :data:`HUGE_RESULT` of the window: cut to :data:`CUT_RESULT_TO` of it."""
    keep = int(window * CUT_RESULT_TO / ratio)
    return [
        [seq, keep] for seq, size in results if size * ratio > window * HUGE_RESULT and keep < size
    ]
