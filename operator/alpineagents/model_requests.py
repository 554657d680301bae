"""What an Agent sends its model and what it makes of the reply: the request (a pure
function of the saved history), the run's client (made from its :class:`Provider` on first
use), a reply's usage and cost, and the refusal of a prompt past the window."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Protocol

from . import model as _model
from .context import merged_messages, with_cache_breakpoints
from .messages import Message
from .providers import Provider
from .run_hold import RunHold
from .state import State
from .tools import Tool
from .usage import USAGE_KEYS, CacheTTL, Price, cost_usd

__all__ = [
    "RequestSettings",
    "RunClient",
    "next_request",
    "reply_cost",
    "request_for",
    "too_long_error",
    "usage_of",
]

# The API's refusal of a prompt past the window: "prompt is too long: N tokens > M maximum".
_TOO_LONG = re.compile(r"prompt is too long: (\d+) tokens")


class RequestSettings(Protocol):
    """What of an Agent its requests are made from (read at each request: a runner may
    change them after the Agent is made)."""

    @property
    def model(self) -> str: ...
    @property
    def max_tokens(self) -> int: ...
    @property
    def system(self) -> str | None: ...
    @property
    def prompt_cache(self) -> CacheTTL | None: ...
    @property
    def prices(self) -> Mapping[str, Price] | None: ...


def request_for(
    settings: RequestSettings, merged: list[dict[str, Any]], tools: Mapping[str, Tool]
) -> dict[str, Any]:
    """A request for the API-shaped ``merged`` messages (no cache breakpoints)."""
    request: dict[str, Any] = {
        "model": settings.model,
        "max_tokens": settings.max_tokens,
        "messages": merged,
    }
    if settings.system:
        request["system"] = settings.system
    if tools:
        request["tools"] = [t.to_api() for t in tools.values()]
    return request


def messages_request(
    settings: RequestSettings, messages: list[Message], tools: Mapping[str, Tool]
) -> dict[str, Any]:
    """A request for ``messages`` as they are (no cache breakpoints)."""
    return request_for(settings, merged_messages(messages), tools)


def next_request(
    settings: RequestSettings, state: State, tools: Mapping[str, Tool], *, marked: bool = True
) -> tuple[dict[str, Any], int]:
    """The request the run sends next, a pure function of its saved history, and the
    length of its JSON without cache breakpoints (what its size is estimated from)."""
    hold = state.active_run
    if isinstance(hold, RunHold):
        merged, chars = hold.api_messages(state)
    else:
        merged = merged_messages(state.messages)
        chars = len(json.dumps(merged))
    request = request_for(settings, merged, tools)
    chars += len(json.dumps(request.get("tools", []))) + len(json.dumps(settings.system or ""))
    if marked and settings.prompt_cache is not None:
        request = with_cache_breakpoints(request, settings.prompt_cache)
    return request, chars


def usage_of(reply: dict[str, Any]) -> dict[str, int]:
    """The four token counts of a reply (as the API reports them; absent ones are 0)."""
    usage = reply.get("usage", {})
    return {key: v for key in USAGE_KEYS if isinstance(v := usage.get(key, 0), int)}


def reply_cost(settings: RequestSettings, model: str, reply: dict[str, Any]) -> float:
    """The estimated cost in USD of ``reply`` from ``model`` (its cache writes by TTL)."""
    usage = dict(usage_of(reply))
    detail = reply.get("usage", {}).get("cache_creation")
    if isinstance(detail, dict) and isinstance(detail.get("ephemeral_1h_input_tokens"), int):
        usage["ephemeral_1h_input_tokens"] = detail["ephemeral_1h_input_tokens"]
    cache_ttl = settings.prompt_cache or "5m"
    return round(cost_usd(model, usage, cache_ttl=cache_ttl, prices=settings.prices), 8)


def too_long_error(error: BaseException) -> int | None:
    """The prompt's size in tokens when ``error`` is the API's refusal of a prompt past the
    window, else ``None``."""
    if not _model.sdk_error(error, "BadRequestError"):
        return None
    found = _TOO_LONG.search(str(error))
    return int(found.group(1)) if found else None


class RunClient:
    """The model client of one run: the Agent's, or one made on first use from its
    provider (importing the SDK takes about a second, which a resumed run should not spend
    before its first save)."""

    def __init__(self, given: Any, provider: Provider | None = None) -> None:
        self._given = given
        self._provider = provider
        self._made: Any = None

    def get(self) -> Any:
        if self._given is not None:
            return self._given
        if self._made is None:
            self._made = made_client(self._provider)
        return self._made

    async def close(self) -> None:
        if self._made is not None:
            await _model.close(self._made)


def made_client(provider: Provider | None) -> Any:
    """A new client for ``provider`` (none: the Anthropic API as the environment says)."""
    return provider.client() if provider is not None else _model.default_client()
