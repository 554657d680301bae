"""Asking the model: one request through the official anthropic client, with retries."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

# The SDK is imported on first use, not with this module: importing it takes about a
# second, which `alpineagents list` should not pay, nor a resumed run before its first save.
if TYPE_CHECKING:
    import anthropic

from .redaction import Redactor

_STREAM_ABOVE = 4096  # max_tokens from which replies are streamed (long replies time out otherwise)


@dataclass(frozen=True)
class Retry:
    """How transient model errors are retried before they count as a failed ``think``."""

    attempts: int = 5
    first_delay: float = 0.5
    max_delay: float = 30.0

    def delay(self, attempt: int, error: BaseException) -> float:
        response = getattr(error, "response", None)
        header = response.headers.get("retry-after") if response is not None else None
        if header is not None:
            try:
                return min(float(header), self.max_delay)
            except ValueError:
                pass
        backoff: float = min(self.first_delay * 2**attempt, self.max_delay)
        return backoff * (0.5 + random.random() / 2)


def default_client() -> anthropic.AsyncAnthropic:
    import anthropic

    # Retries are ours (below) so that streamed replies dropped mid-way are retried too.
    return anthropic.AsyncAnthropic(max_retries=0)


@functools.cache
def _transient() -> tuple[type[BaseException], ...]:
    """Errors of requests that can be sent again unchanged: the provider may answer the next."""
    import anthropic

    try:  # the HTTP library the SDK is built on: its name changed with anthropic 2.x
        import httpx2 as http
    except ImportError:  # pragma: no cover - older SDKs
        import httpx as http  # type: ignore[no-redef, import-not-found, unused-ignore]
    return (
        anthropic.APIConnectionError,  # also APITimeoutError
        anthropic.RateLimitError,
        anthropic.InternalServerError,  # 5xx, 529 overloaded among them
        http.TransportError,  # a streamed reply dropped mid-way is raised unwrapped
    )


def sdk_error(error: BaseException, name: str) -> bool:
    """Whether ``error`` is an ``anthropic.<name>`` (without importing the SDK for it: an
    error of the SDK means the SDK is already imported)."""
    sdk = sys.modules.get("anthropic")
    kind = getattr(sdk, name, None) if sdk is not None else None
    return kind is not None and isinstance(error, kind)


async def close(client: Any) -> None:
    """Close a client this package made (its connections belong to the run's event loop)."""
    with contextlib.suppress(Exception):
        await client.close()


async def ask(client: Any, request: dict[str, Any], retry: Retry) -> dict[str, Any]:
    """Send one Messages API request and return the reply as a plain dict.

    ``client`` is an ``anthropic.AsyncAnthropic`` or ``anthropic.Anthropic`` (run on a
    worker thread).
    """
    try:
        for attempt in range(retry.attempts):
            try:
                return await _send(client, request)
            except _transient() as error:
                if attempt + 1 >= retry.attempts:
                    raise
                await asyncio.sleep(retry.delay(attempt, error))
    except Exception as error:
        if sdk_error(error, "APIError"):
            # Some gateways echo the request's headers in their error bodies: the error is
            # saved in the history and reported, so the client's own key must not be in it.
            keys = [getattr(client, "api_key", None), getattr(client, "auth_token", None)]
            Redactor([key for key in keys if isinstance(key, str)]).exception(error)
        raise
    raise AssertionError("unreachable")


async def _send(client: Any, request: dict[str, Any]) -> dict[str, Any]:
    import anthropic

    stream = request.get("max_tokens", 0) > _STREAM_ABOVE
    if isinstance(client, anthropic.AsyncAnthropic):
        if stream:
            async with client.messages.stream(**request) as replies:
                message = await replies.get_final_message()
        else:
            message = await client.messages.create(**request)
    else:
        message = await asyncio.to_thread(_send_sync, client, request, stream)
    dumped: dict[str, Any] = message.model_dump(mode="json", exclude_none=True)
    return dumped


def _send_sync(client: Any, request: dict[str, Any], stream: bool) -> Any:
    if stream:
        with client.messages.stream(**request) as replies:
            return replies.get_final_message()
    return client.messages.create(**request)
