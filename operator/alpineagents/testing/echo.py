"""The echo model: a small rule-based model for demos and tests without a real one.

``ModelServer(echo=True)`` answers with :func:`echo_reply` once its script runs out
(``alpineagents run --offline`` uses it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from .script import Reply, ToolUse, tool_use

__all__ = ["ECHO_MODEL_SUFFIX", "echo_reply"]

ECHO_MODEL_SUFFIX = " (echo)"
"""What the echo model's answers add to the model they name (``claude-sonnet-5 (echo)``): a
saved reply says it was not Claude's, and its cost is priced as the model asked for, a
simulation (``alpineagents show`` says so)."""

_ECHO_LIMIT = 1000
_USE_LINE = re.compile(r"^\s*use\s+(?P<name>[A-Za-z0-9_.-]+)\s*(?P<input>\{.*\})?\s*$")


def echo_reply(request: Mapping[str, Any]) -> Reply:
    """The rule-based answer of echo mode, for demos without a model.

    Rules, looking at the last user message of ``request`` (a Messages API body):

    1. If it carries ``tool_result`` blocks, the answer is text with one line per
       result: ``"<tool> returned: <result text>"`` (``"<tool> failed: ..."`` for
       ``is_error``), and the turn ends.
    2. Else, every line of its text of the form ``use TOOL`` or ``use TOOL {json object}``
       naming a tool the request offers becomes a tool_use block (input ``{}`` when no
       JSON is given), after the text ``"Using TOOL."``.
    3. Else the answer is ``"Echo: <its text>"`` (cut at 1000 characters). Summary
       requests (compaction) get this too.

    Each answer names the model asked for plus :data:`ECHO_MODEL_SUFFIX`.
    """
    model = f"{request.get('model', '')}{ECHO_MODEL_SUFFIX}"
    messages = request.get("messages") or []
    last_user: Mapping[str, Any] | None = next(
        (m for m in reversed(messages) if isinstance(m, Mapping) and m.get("role") == "user"),
        None,
    )
    blocks = _blocks(last_user.get("content") if last_user is not None else None)

    results = [b for b in blocks if b.get("type") == "tool_result"]
    if results:
        names = _tool_names_by_id(messages)
        lines = []
        for result in results:
            name = names.get(str(result.get("tool_use_id")), "tool")
            verb = "failed" if result.get("is_error") else "returned"
            lines.append(f"{name} {verb}: {_text_of(result.get('content'))}")
        return Reply(content=("\n".join(lines),), model=model)

    text = "\n".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text")
    offered = {
        str(t.get("name"))
        for t in request.get("tools") or []
        if isinstance(t, Mapping) and t.get("name")
    }
    calls: list[ToolUse] = []
    for line in text.splitlines():
        match = _USE_LINE.match(line)
        if match is None or match["name"] not in offered:
            continue
        raw_input = match["input"]
        try:
            call_input = json.loads(raw_input) if raw_input else {}
        except json.JSONDecodeError:
            continue
        if isinstance(call_input, dict):
            calls.append(tool_use(match["name"], call_input))
    if calls:
        names_text = ", ".join(dict.fromkeys(c.name for c in calls))
        return Reply(content=(f"Using {names_text}.", *calls), model=model)

    echoed = text.strip() or "(no text)"
    if len(echoed) > _ECHO_LIMIT:
        echoed = echoed[:_ECHO_LIMIT] + "…"
    return Reply(content=(f"Echo: {echoed}",), model=model)


def _blocks(content: object) -> list[Mapping[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return [b for b in content if isinstance(b, Mapping)]
    return []


def _text_of(content: object) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(str(b.get("text", "")) for b in _blocks(content) if b.get("type") == "text")


def _tool_names_by_id(messages: Iterable[Any]) -> dict[str, str]:
    names: dict[str, str] = {}
    for message in messages:
        if isinstance(message, Mapping) and message.get("role") == "assistant":
            for block in _blocks(message.get("content")):
                if block.get("type") == "tool_use":
                    names[str(block.get("id"))] = str(block.get("name"))
    return names
