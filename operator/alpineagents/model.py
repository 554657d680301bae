"""Asking the model: one request through the official anthropic client, paced and retried.

A refusal for lack of capacity (429 rate limit, 529 overloaded) is a wait, never a failure:
the request goes back to its pacer (:mod:`alpineagents.pacing`), which says when to send it
again, for as long as it takes (or ``Retry.max_wait``). Other transient errors (a dropped
connection, a 500) are retried ``Retry.attempts`` times."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

# The SDK is imported on first use, not with this module: importing it takes about a
# second, which `alpineagents list` should not pay, nor a resumed run before its first save.
if TYPE_CHECKING:
    import anthropic

from .pacing import HeaderPacer, Pacer, RateSignals, Report, Ticket, key_fingerprint, request_cost
from .pacing.signals import Limit
from .provider_credentials import credentials_of, learn_credentials
from .redaction import Redactor

_STREAM_ABOVE = 4096  # max_tokens from which replies are streamed (long replies time out otherwise)


@dataclass(frozen=True)
class Retry:
    """How transient model errors are retried before they count as a failed ``think``.

    ``attempts`` bounds the tries of a request that fails for a transient error (a dropped
    connection, a 5xx). A refusal for lack of capacity (429, 529) is not counted: the
    request waits as its pacer says, up to ``max_wait`` seconds in all (None: as long as it
    takes, so a run ends only by its budget or a person), and then raises the refusal."""

    attempts: int = 5
    first_delay: float = 0.5
    max_delay: float = 30.0
    max_wait: float | None = None

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
        anthropic.InternalServerError,  # 5xx
        http.TransportError,  # a streamed reply dropped mid-way is raised unwrapped
    )


def _capacity_refusal(error: BaseException) -> Limit | None:
    """What a refusal for lack of capacity waits for: the key's limit the headers say is
    spent (429), ``overloaded`` (529, the provider's own capacity), else None."""
    status = getattr(error, "status_code", None)
    # A streamed reply's error event arrives after a 200: its body says what it is.
    body = getattr(error, "body", None)
    detail = body.get("error") if isinstance(body, dict) else None
    kind = detail.get("type") if isinstance(detail, dict) else None
    # Bedrock says it in its own words: a 503 ServiceUnavailableException (a
    # serviceUnavailableException frame mid-stream) is its 529, ThrottlingException its 429.
    response = getattr(error, "response", None)
    headers = getattr(response, "headers", None)
    aws_kind = str(headers.get("x-amzn-errortype", "")) if headers is not None else ""
    if (
        status == 529
        or kind in ("overloaded_error", "serviceUnavailableException")
        or aws_kind.startswith("ServiceUnavailableException")
        or sdk_error(error, "OverloadedError")
    ):
        return "overloaded"
    if status != 429 and kind not in ("rate_limit_error", "throttlingException"):
        return None
    signals = _signals(error)
    spent = [name for name, bucket in signals.buckets.items() if bucket.remaining <= 0]
    order: tuple[Limit, ...] = ("input_tokens", "output_tokens", "tokens", "requests")
    return next((limit for limit in order if limit in spent), None) or _quota_named(error)


# Bedrock sends no rate-limit headers: its ThrottlingException names the quota that ran out
# only in its message ("Too many tokens, please wait before trying again.").
_QUOTAS_IN_WORDS: tuple[tuple[str, Limit], ...] = (
    ("too many tokens", "tokens"),
    ("too many requests", "requests"),
)


def _quota_named(error: BaseException) -> Limit:
    """The limit a refusal's words name (a request limit when they name none)."""
    text = str(error).lower()
    return next((limit for words, limit in _QUOTAS_IN_WORDS if words in text), "requests")


def _signals(error: BaseException) -> RateSignals:
    """The rate-limit signals of an error's answer (none for a connection that broke)."""
    response = getattr(error, "response", None)
    headers = getattr(response, "headers", None)
    return RateSignals.from_headers(headers) if headers is not None else RateSignals()


_process_pacers: dict[tuple[str, str], HeaderPacer] = {}


def process_pacer(client: Any) -> HeaderPacer:
    """The pacer every agent of this process shares for ``client``'s endpoint and key."""
    key = (str(getattr(client, "base_url", "")), key_fingerprint(_key_of(client)))
    pacer = _process_pacers.get(key)
    if pacer is None:
        pacer = _process_pacers[key] = HeaderPacer()
    return pacer


def _key_of(client: Any) -> str:
    for name in ("api_key", "auth_token"):
        value = getattr(client, name, None)
        if isinstance(value, str) and value:
            return value
    return ""


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


async def ask(
    client: Any,
    request: dict[str, Any],
    retry: Retry,
    pacer: Pacer | None = None,
    report: Report | None = None,
    secrets: Sequence[str] = (),
    *,
    prompt_chars: int | None = None,
) -> dict[str, Any]:
    """Send one Messages API request when ``pacer`` gives it its turn (by default, the
    process's pacer for the client's key), and return the reply as a plain dict.

    ``client`` is an ``anthropic.AsyncAnthropic`` or ``anthropic.Anthropic`` (run on a
    worker thread). ``report`` is told of each wait for capacity. ``secrets`` (a gateway's
    headers, say) are masked in the error raised, with the client's own credentials.
    ``prompt_chars``, the messages' size the caller already knows, spares measuring it
    again for the pacer (which would cost a pass over the whole history each request).
    """
    pacer = pacer if pacer is not None else process_pacer(client)
    ticket = Ticket(request_cost(request, prompt_chars))
    failures = 0
    try:
        while True:
            await pacer.turn(ticket, report or _unreported)
            try:
                message, headers = await _send(client, request)
            except Exception as error:
                # Credentials the client obtained for this request (a cloud's temporary keys
                # or token) are masked before its error can be written anywhere.
                learn_credentials(client, *secrets)
                limit = _capacity_refusal(error)
                if limit is not None:
                    if retry.max_wait is not None and ticket.waited >= retry.max_wait:
                        raise
                    await pacer.refused(ticket, _signals(error), limit)
                    continue
                if not isinstance(error, _transient()):
                    raise
                await pacer.answered(ticket, _signals(error), {})
                failures += 1
                if failures >= retry.attempts:
                    raise
                await asyncio.sleep(retry.delay(failures - 1, error))
                continue
            learn_credentials(client, *secrets)
            await pacer.answered(ticket, RateSignals.from_headers(headers), _used(message))
            return message
    except Exception as error:
        if sdk_error(error, "APIError"):
            # Some gateways echo the request's headers in their error bodies: the error is
            # saved in the history, reported and traced, so no credential may be in it: the
            # client's own, nor any this process learned (an Entra token its provider got).
            redactor = Redactor.from_environment()
            for value in [*credentials_of(client), *secrets]:
                redactor.add(value)
            redactor.exception(error)
        raise


def _unreported(throttle: object) -> None:
    return None


def _used(message: dict[str, Any]) -> dict[Limit, int]:
    """What an answer took from the key's limits, as the API counts them (cache reads are
    free of the input limit)."""
    usage = message.get("usage") or {}
    uncached = int(usage.get("input_tokens") or 0) + int(
        usage.get("cache_creation_input_tokens") or 0
    )
    return {"input_tokens": uncached, "output_tokens": int(usage.get("output_tokens") or 0)}


async def _send(client: Any, request: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """The reply as a plain dict, and the answer's headers (the key's rate-limit signals)."""
    import anthropic

    stream = request.get("max_tokens", 0) > _STREAM_ABOVE
    # Bedrock's and Vertex AI's async clients are no AsyncAnthropic: their messages are.
    if isinstance(client.messages, anthropic.resources.AsyncMessages):
        if stream:
            async with client.messages.stream(**request) as replies:
                message = await replies.get_final_message()
                headers = replies.response.headers
        else:
            raw = await client.messages.with_raw_response.create(**request)
            message, headers = await raw.parse(), raw.headers
    else:
        message, headers = await asyncio.to_thread(_send_sync, client, request, stream)
    dumped: dict[str, Any] = message.model_dump(mode="json", exclude_none=True)
    return dumped, headers


def _send_sync(client: Any, request: dict[str, Any], stream: bool) -> tuple[Any, Any]:
    if stream:
        with client.messages.stream(**request) as replies:
            return replies.get_final_message(), replies.response.headers
    raw = client.messages.with_raw_response.create(**request)
    return raw.parse(), raw.headers
