"""The Messages API's JSON as :class:`~.server.ModelServer` reads and writes it.

Request checks, messages, stream events' bodies and errors; the HTTP and the script are
the server's.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from .script import Reply

__all__ = [
    "content_blocks",
    "count_output_tokens",
    "error_body",
    "message",
    "message_id",
    "message_start",
    "pieces",
    "reply_events",
    "request_id_header",
    "request_problem",
]


def request_problem(body: object, path: str) -> str | None:
    """Why the API would refuse ``body`` sent to ``path`` as invalid, or None."""
    if not isinstance(body, dict):
        return "request body must be a JSON object"
    required: Sequence[str] = (
        ("model", "messages")
        if path.endswith("count_tokens")
        else ("model", "messages", "max_tokens")
    )
    for name in required:
        if name not in body:
            return f"{name}: Field required"
    if not isinstance(body["model"], str) or not body["model"]:
        return "model: must be a non-empty string"
    if not isinstance(body["messages"], list) or not body["messages"]:
        return "messages: must be a non-empty list"
    for index, entry in enumerate(body["messages"]):
        if not isinstance(entry, dict) or entry.get("role") not in ("user", "assistant"):
            return f"messages.{index}: must be an object with role 'user' or 'assistant'"
        if "content" not in entry:
            return f"messages.{index}.content: Field required"
    if "max_tokens" in required and (
        not isinstance(body["max_tokens"], int)
        or isinstance(body["max_tokens"], bool)
        or body["max_tokens"] < 1
    ):
        return "max_tokens: must be a positive integer"
    return None


def content_blocks(answer: Reply) -> list[dict[str, Any]]:
    """The reply's content blocks as the API sends them (tool uses get an id if unset)."""
    blocks: list[dict[str, Any]] = []
    for block in answer.content:
        if isinstance(block, str):
            blocks.append({"type": "text", "text": block})
        else:
            blocks.append(
                {
                    "type": "tool_use",
                    "id": block.id or f"toolu_{uuid.uuid4().hex[:24]}",
                    "name": block.name,
                    "input": dict(block.input),
                }
            )
    return blocks


def message(
    request: Mapping[str, Any],
    answer: Reply,
    content: Sequence[Mapping[str, Any]],
    usage: Mapping[str, Any],
) -> dict[str, Any]:
    """A whole (non-streamed) message answering ``request``; ``usage`` is the input
    half of its usage (``output_tokens`` is added from ``content``)."""
    return {
        "id": message_id(),
        "type": "message",
        "role": "assistant",
        "model": answer.model or request["model"],
        "content": list(content),
        "stop_reason": answer.resolved_stop_reason,
        "stop_sequence": None,
        "usage": {**usage, "output_tokens": count_output_tokens(content)},
    }


def message_start(
    request: Mapping[str, Any], usage: Mapping[str, Any], model: str | None = None
) -> dict[str, Any]:
    """The ``message_start`` event's body (the API reports a token or so of output there);
    ``model``: the one the answer names, if not the request's."""
    return {
        "type": "message_start",
        "message": {
            "id": message_id(),
            "type": "message",
            "role": "assistant",
            "model": model or request["model"],
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {**usage, "output_tokens": 1},
        },
    }


def reply_events(
    request: Mapping[str, Any],
    answer: Reply,
    content: Sequence[Mapping[str, Any]],
    usage: Mapping[str, Any],
    *,
    cumulative: bool,
) -> Iterator[tuple[str, dict[str, Any]]]:
    """The server-sent events of a streamed reply, in the API's order: message_start,
    ping, each block's start, deltas (text in pieces, tool input as partial JSON) and
    stop, message_delta, message_stop.

    ``cumulative``: message_delta's usage repeats the input numbers next to the output,
    as the API sends it today (else it has ``output_tokens`` only)."""
    yield "message_start", message_start(request, usage, answer.model)
    yield "ping", {"type": "ping"}
    for index, block in enumerate(content):
        if block["type"] == "text":
            start: dict[str, Any] = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": piece} for piece in pieces(block["text"])]
        else:
            start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            deltas = [
                {"type": "input_json_delta", "partial_json": piece}
                for piece in pieces(json.dumps(block["input"]))
            ]
        yield (
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": start},
        )
        for delta in deltas:
            yield (
                "content_block_delta",
                {"type": "content_block_delta", "index": index, "delta": delta},
            )
        yield "content_block_stop", {"type": "content_block_stop", "index": index}
    final_usage = {k: v for k, v in usage.items() if isinstance(v, int)} if cumulative else {}
    final_usage["output_tokens"] = count_output_tokens(content)
    yield (
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": answer.resolved_stop_reason, "stop_sequence": None},
            "usage": final_usage,
        },
    )
    yield "message_stop", {"type": "message_stop"}


def error_body(error_type: str, text: str) -> dict[str, Any]:
    """The API's error object."""
    return {"type": "error", "error": {"type": error_type, "message": text}}


def request_id_header() -> dict[str, str]:
    """A fresh ``request-id`` header, as the API sends with every answer."""
    return {"request-id": f"req_{uuid.uuid4().hex[:24]}"}


def message_id() -> str:
    """A fresh message id."""
    return f"msg_{uuid.uuid4().hex[:24]}"


def count_output_tokens(content: Sequence[Mapping[str, Any]]) -> int:
    """The reply's size in tokens (about 4 characters of its JSON a token)."""
    return max(1, len(json.dumps(list(content))) // 4)


def pieces(text: str, parts: int = 3) -> list[str]:
    """``text`` in up to ``parts`` consecutive pieces, so clients must reassemble it."""
    if not text:
        return []
    size = max(1, math.ceil(len(text) / parts))
    return [text[i : i + size] for i in range(0, len(text), size)]
