"""The script of the scripted model: its turns, how to build them, and script files.

Each model request consumes the next turn. A turn is a :class:`Reply` (text and
tool_use blocks), a :class:`Failure` (an API error), a :class:`Drop` (the connection
closes mid-answer) or a :class:`Hold` (the answer waits until
:meth:`~alpineagents.testing.ModelServer.release`). Build them with :func:`reply`,
:func:`tool_use`, :func:`error`, :func:`drop` and :func:`hold`; a bare ``str`` or
:class:`ToolUse` is a turn too. :func:`load_script` reads turns from a JSON or YAML file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeAlias

__all__ = [
    "Drop",
    "Failure",
    "Hold",
    "Reply",
    "StopReason",
    "ToolUse",
    "Turn",
    "as_answer",
    "drop",
    "error",
    "hold",
    "load_script",
    "parse_script",
    "reply",
    "tool_use",
]

StopReason: TypeAlias = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]

_ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
_DEFAULT_ERROR_MESSAGES: dict[int, str] = {
    429: "Number of request tokens has exceeded your rate limit (scripted).",
    500: "Internal server error (scripted).",
    529: "Overloaded (scripted).",
}


@dataclass(frozen=True)
class ToolUse:
    """A ``tool_use`` content block the scripted model emits.

    ``id`` is generated (``toolu_...``, unique) when not given.
    """

    name: str
    input: Mapping[str, Any] = field(default_factory=dict)
    id: str | None = None


@dataclass(frozen=True)
class Reply:
    """A successful answer: text and tool_use blocks, in order.

    ``stop_reason`` defaults to ``"tool_use"`` when the content has a tool_use block,
    else ``"end_turn"``. ``delay`` seconds pass before the first response byte.
    ``model`` is the model the answer names (default: the one the request asked for).
    """

    content: tuple[str | ToolUse, ...] = ()
    stop_reason: StopReason | None = None
    delay: float = 0.0
    model: str | None = None

    @property
    def resolved_stop_reason(self) -> StopReason:
        if self.stop_reason is not None:
            return self.stop_reason
        return "tool_use" if any(isinstance(b, ToolUse) for b in self.content) else "end_turn"


@dataclass(frozen=True)
class Failure:
    """An API error answer in the API's JSON shape, with HTTP ``status``.

    ``retry_after`` (seconds) is sent as ``retry-after`` / ``retry-after-ms``. With
    ``in_stream=True`` a streaming request gets ``200``, ``message_start`` and then an
    ``error`` event, as the real API does when it overloads mid-answer (the SDK raises
    a plain ``APIStatusError`` then); non-streaming requests always get the status.
    """

    status: int
    message: str
    retry_after: float | None = None
    in_stream: bool = False
    delay: float = 0.0

    @property
    def error_type(self) -> str:
        known = _ERROR_TYPES.get(self.status)
        if known is not None:
            return known
        return "api_error" if self.status >= 500 else "invalid_request_error"


@dataclass(frozen=True)
class Drop:
    """The connection closes: before any byte (non-streaming), or after
    ``message_start`` (streaming), so the client sees a broken response."""

    delay: float = 0.0


@dataclass(frozen=True)
class Hold:
    """The answer waits until :meth:`ModelServer.release` and then is ``then``.

    If the client goes away or the server stops first, the connection just closes.
    The held request is recorded (and counts for :meth:`ModelServer.wait_for_requests`)
    as soon as it arrives, so a test can act "while the model is being asked".
    """

    then: Reply | Failure | Drop


Turn: TypeAlias = Reply | ToolUse | str | Failure | Drop | Hold
"""One scripted answer. A ``str`` is a text reply, a :class:`ToolUse` a one-call reply."""


def reply(
    *content: str | ToolUse, stop_reason: StopReason | None = None, delay: float = 0.0
) -> Reply:
    """A reply with the given text and tool_use blocks, in order.

    ``reply("Hi")``; ``reply("I'll check", tool_use("ls", {"path": "."}), tool_use("pwd"))``.
    """
    return Reply(content=tuple(content), stop_reason=stop_reason, delay=delay)


def tool_use(
    name: str, input: Mapping[str, Any] | None = None, *, id: str | None = None
) -> ToolUse:
    """A tool_use block; alone it is a turn, or pass several to :func:`reply`."""
    return ToolUse(name=name, input=dict(input or {}), id=id)


def error(
    status: int,
    message: str | None = None,
    *,
    retry_after: float | None = None,
    in_stream: bool = False,
    delay: float = 0.0,
) -> Failure:
    """An API error: ``error(529)`` overloaded, ``error(429)`` rate limit, ``error(500)``.

    A 429 without ``retry_after`` says "retry at once". See :class:`Failure`.
    """
    if retry_after is None and status == 429:
        retry_after = 0.0
    text = message or _DEFAULT_ERROR_MESSAGES.get(status, f"Scripted error {status}.")
    return Failure(
        status=status, message=text, retry_after=retry_after, in_stream=in_stream, delay=delay
    )


def drop(*, delay: float = 0.0) -> Drop:
    """Close the connection mid-answer (see :class:`Drop`)."""
    return Drop(delay=delay)


def hold(then: Turn | None = None) -> Hold:
    """Block the answer until :meth:`ModelServer.release`; then answer ``then``
    (default: the text reply ``"Released."``)."""
    resolved = as_answer(then if then is not None else "Released.")
    if isinstance(resolved, Hold):
        raise ValueError("hold(then=...) cannot itself be a hold")
    return Hold(then=resolved)


def as_answer(turn: Turn) -> Reply | Failure | Drop | Hold:
    """A turn as the answer it stands for (a ``str`` or :class:`ToolUse` is a reply)."""
    if isinstance(turn, str):
        return Reply(content=(turn,))
    if isinstance(turn, ToolUse):
        return Reply(content=(turn,))
    if isinstance(turn, Reply | Failure | Drop | Hold):
        return turn
    raise TypeError(f"not a script turn: {turn!r}")


def parse_script(data: object) -> tuple[list[Turn], bool]:
    """Turns (and the echo flag) from decoded JSON/YAML.

    ``data`` is a list of turns, or ``{"echo": bool, "turns": [...]}``. A turn is one of::

        "plain text"                                  a text reply
        {"reply": "text"}                             a text reply
        {"text": "I'll check", "tool_uses": [{"name": "ls", "input": {}, "id": "t1"}],
         "stop_reason": "tool_use", "delay": 0.5}     text and/or tool calls
        {"tool_use": {"name": "ls", "input": {}}}     one tool call
        {"error": 529, "message": "...", "retry_after": 0, "in_stream": false}
        {"drop": true}
        {"hold": true, "then": <turn>}                held until SIGUSR1 / release()

    Raises ``ValueError`` on anything else.
    """
    echo = False
    raw_turns: object = data
    if isinstance(data, dict):
        unknown = set(data) - {"echo", "turns"}
        if unknown:
            raise ValueError(f"unknown script keys: {sorted(unknown)}")
        echo = bool(data.get("echo", False))
        raw_turns = data.get("turns", [])
    if not isinstance(raw_turns, list):
        raise ValueError("a script is a list of turns or {'echo': ..., 'turns': [...]}")
    return [_parse_turn(item, index) for index, item in enumerate(raw_turns)], echo


def load_script(path: str | Path) -> tuple[list[Turn], bool]:
    """Read a script file (JSON; YAML when it ends in .yaml/.yml). See :func:`parse_script`."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError as exc:  # pyyaml is a dependency, but stay usable without it
            raise ValueError(f"{path}: reading YAML scripts needs pyyaml") from exc
        return parse_script(yaml.safe_load(text))
    return parse_script(json.loads(text))


def _parse_turn(item: object, index: int) -> Turn:
    where = f"script turn {index}"
    if isinstance(item, str):
        return item
    if not isinstance(item, dict):
        raise ValueError(f"{where}: expected a string or an object, got {item!r}")
    delay = float(item.get("delay", 0.0))
    if "hold" in item:
        then = item.get("then")
        return hold(None if then is None else _parse_turn(then, index))
    if "drop" in item:
        return Drop(delay=delay)
    if "error" in item:
        retry_after = item.get("retry_after")
        return error(
            int(item["error"]),
            item.get("message"),
            retry_after=None if retry_after is None else float(retry_after),
            in_stream=bool(item.get("in_stream", False)),
            delay=delay,
        )
    blocks: list[str | ToolUse] = []
    text = item.get("reply", item.get("text"))
    if text is not None:
        blocks.append(str(text))
    calls = item.get("tool_uses", [])
    if "tool_use" in item:
        calls = [item["tool_use"], *calls]
    if not isinstance(calls, list):
        raise ValueError(f"{where}: tool_uses must be a list")
    for call in calls:
        if not isinstance(call, dict) or "name" not in call:
            raise ValueError(f"{where}: a tool use needs a name, got {call!r}")
        call_input = call.get("input", {})
        if not isinstance(call_input, dict):
            raise ValueError(f"{where}: tool input must be an object, got {call_input!r}")
        blocks.append(tool_use(str(call["name"]), call_input, id=call.get("id")))
    if not blocks:
        raise ValueError(f"{where}: no reply, text, tool_use, error, drop or hold in {item!r}")
    stop_reason = item.get("stop_reason")
    if stop_reason not in (None, "end_turn", "max_tokens", "stop_sequence", "tool_use"):
        raise ValueError(f"{where}: unknown stop_reason {stop_reason!r}")
    return Reply(content=tuple(blocks), stop_reason=stop_reason, delay=delay)
