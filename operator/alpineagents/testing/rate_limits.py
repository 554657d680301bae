"""The Messages API's rate limits for one key, as :class:`~.server.ModelServer` enforces them.

:class:`RateLimits` says how much one key may send a minute: requests (RPM), input tokens
(ITPM) and output tokens (OTPM). :class:`RateLimiter` enforces them as the API does, with
token buckets: each bucket refills continuously at its per-minute rate and holds at most
``burst_seconds`` of it, so 60 RPM with a 3 s burst lets 3 requests through at once and
then one a second, never 60 in the minute's first second.

A model request (``POST /v1/messages``) must find room in every bucket before it is
answered (:meth:`RateLimiter.admit`):

- 1 request;
- its input tokens as the API counts them for ITPM: the uncached input, i.e. the prompt's
  size less what it reads from the prompt cache (``input_tokens`` plus
  ``cache_creation_input_tokens`` of its usage; with billing off, the whole prompt);
- its ``max_tokens`` as output, reserved up front (the API estimates OTPM from
  ``max_tokens``) and settled when the answer ends (:meth:`RateLimiter.settle`): what
  the reply did not use is given back; a failure, a drop or a broken answer gives back
  all of it.

A request larger than a bucket's capacity still passes once that bucket is full (it
leaves the bucket in debt, which then refills at the rate), so one large request waits
for a full bucket rather than for ever. A request larger than the per-minute figure
itself never passes, as with the API, whose answer asks to reduce the prompt or
``max_tokens``.

When a bucket lacks room the answer is a :class:`Refusal` (nothing is taken from any
bucket): the API's 429 ``rate_limit_error`` naming the limit, with ``retry-after`` the
time until every bucket has room. Every answer to a model request carries the API's
``anthropic-ratelimit-*`` headers (:meth:`RateLimiter.headers`).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from ..pacing.limiter import KeyLimits

__all__ = ["Admission", "Limit", "Outcome", "RateLimiter", "RateLimits", "Refusal"]

Limit = Literal["requests", "input_tokens", "output_tokens"]

# The SDK treats a zero retry hint as "no hint"; 1 ms keeps "retry now" a hint.
_MIN_RETRY_AFTER = 0.001
# Float refills (e.g. 1000/60 tokens a second) may land a hair under a whole unit.
_EPSILON = 1e-9
_UNITS: dict[Limit, str] = {
    "requests": "requests",
    "input_tokens": "input tokens",
    "output_tokens": "output tokens",
}
_HEADER_NAMES: dict[Limit, str] = {
    "requests": "requests",
    "input_tokens": "input-tokens",
    "output_tokens": "output-tokens",
}
_DOCS = "https://docs.claude.com/en/api/rate-limits"


@dataclass(frozen=True)
class RateLimits(KeyLimits):
    """The API's limits for one key, enforced as token buckets (as the real API does:
    capacity is replenished continuously, not reset each minute).

    A ``None`` limit is no limit. Each bucket holds at most ``burst_seconds`` of its rate,
    and at least one request; a single request larger than that (but within the
    per-minute figure) passes once its bucket is full."""

    burst_seconds: float = 3.0

    def __post_init__(self) -> None:
        super().__post_init__()
        burst = self.burst_seconds
        if (
            isinstance(burst, bool)
            or not isinstance(burst, int | float)
            or not math.isfinite(burst)
            or burst <= 0
        ):
            raise ValueError(f"RateLimits: burst_seconds must be > 0, got {burst!r}")


@dataclass
class Admission:
    """A request let through: what it took from the buckets. Pass it to
    :meth:`RateLimiter.settle` when its answer ends."""

    input_tokens: int
    max_tokens: int
    settled: bool = field(default=False, compare=False)


@dataclass(frozen=True)
class Refusal:
    """A request refused for the rate limit ``limit`` (the one that frees up last);
    ``retry_after`` seconds from now every bucket has room for it (if it can ever pass:
    see :attr:`too_large`)."""

    limit: Limit
    per_minute: int
    retry_after: float
    too_large: bool = False
    """The request is larger than the per-minute figure, so no wait lets it through."""

    @property
    def message(self) -> str:
        """The API's 429 message, naming the limit."""
        text = (
            f"This request would exceed your organization's rate limit of "
            f"{self.per_minute:,} {_UNITS[self.limit]} per minute (scripted). "
            f"For details, refer to: {_DOCS}. You can see the response headers for "
            "current usage."
        )
        if self.limit == "requests":
            return text + " Please try again later."
        return (
            text
            + " Please reduce the prompt length or the maximum tokens requested, or try again later."
        )


@dataclass(frozen=True)
class Outcome:
    """How the server answered one model request: when (``at``, on the server's clock,
    as the status line went out), the HTTP ``status``, and whether it was the rate
    limiter's 429 (a scripted ``error(429)`` is not)."""

    at: float
    status: int
    rate_limited: bool = False


class _Bucket:
    """One limit's token bucket; the caller holds the limiter's lock."""

    def __init__(self, per_minute: int, burst_seconds: float, now: float) -> None:
        self.per_minute = per_minute
        self.rate = per_minute / 60.0
        self.capacity = max(1.0, self.rate * burst_seconds)
        # The largest single request: one that needs a whole minute's worth still passes.
        self.ceiling = max(float(per_minute), self.capacity)
        self.level = self.capacity
        self.updated = now

    def refill(self, now: float) -> None:
        if now > self.updated:
            self.level = min(self.capacity, self.level + self.rate * (now - self.updated))
        self.updated = max(self.updated, now)

    def wait_for(self, amount: float) -> float:
        """Seconds until ``amount`` may be taken (0 if now); ``math.inf`` if never."""
        if amount <= 0:
            return 0.0
        if amount > self.ceiling:
            return math.inf
        # More than a bucket's worth needs a full bucket, and leaves it in debt.
        needed = min(amount, self.capacity)
        missing = needed - self.level
        return 0.0 if missing <= _EPSILON else missing / self.rate

    def until_full(self) -> float:
        return max(0.0, (self.capacity - self.level) / self.rate)


class RateLimiter:
    """:class:`RateLimits` enforced for one key. Thread-safe.

    ``clock`` gives the seconds the buckets refill on (``time.monotonic`` by default;
    pass a fake one to let a test move time); ``wall`` gives the Unix time the
    ``-reset`` headers are stated in."""

    def __init__(
        self,
        limits: RateLimits,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.limits = limits
        self._clock = clock
        self._wall = wall
        self._lock = threading.Lock()
        now = clock()
        self._buckets: dict[Limit, _Bucket] = {}
        for limit in _UNITS:
            per_minute = limits.per_minute(limit)
            if per_minute is not None:
                self._buckets[limit] = _Bucket(per_minute, limits.burst_seconds, now)

    def admit(self, input_tokens: int, max_tokens: int) -> Admission | Refusal:
        """Take 1 request, ``input_tokens`` (the uncached input) and a reservation of
        ``max_tokens`` output tokens, or take nothing and say which limit refuses."""
        wanted: dict[Limit, float] = {
            "requests": 1.0,
            "input_tokens": float(input_tokens),
            "output_tokens": float(max_tokens),
        }
        with self._lock:
            now = self._clock()
            waits: dict[Limit, float] = {}
            for limit, bucket in self._buckets.items():
                bucket.refill(now)
                wait = bucket.wait_for(wanted[limit])
                if wait > 0:
                    waits[limit] = wait
            if waits:
                # Name the limit that frees up last (one that never will, first).
                limit = max(waits, key=waits.__getitem__)
                bucket = self._buckets[limit]
                too_large = math.isinf(waits[limit])
                wait = bucket.until_full() if too_large else waits[limit]
                return Refusal(
                    limit=limit,
                    per_minute=bucket.per_minute,
                    retry_after=max(_MIN_RETRY_AFTER, wait),
                    too_large=too_large,
                )
            for limit, bucket in self._buckets.items():
                bucket.level -= wanted[limit]
            return Admission(input_tokens=input_tokens, max_tokens=max_tokens)

    def settle(self, admission: Admission, output_tokens: int) -> None:
        """The answer ended having produced ``output_tokens`` (0 for a failure or a drop):
        give back the rest of the ``max_tokens`` reservation (or take the excess, for a
        scripted reply longer than ``max_tokens``). Settling twice does nothing."""
        with self._lock:
            if admission.settled:
                return
            admission.settled = True
            bucket = self._buckets.get("output_tokens")
            if bucket is None:
                return
            bucket.refill(self._clock())
            # A scripted reply may run past max_tokens (the API's cannot); the bucket counts
            # what was written either way.
            unused = admission.max_tokens - max(0, output_tokens)
            bucket.level = min(bucket.capacity, bucket.level + unused)

    def headers(self, now: float | None = None) -> dict[str, str]:
        """The API's ``anthropic-ratelimit-*`` headers at ``now`` (the limiter's clock;
        default: its current time), for the limits that are set.

        ``-limit`` is the per-minute figure, ``-remaining`` the whole units in the bucket,
        ``-reset`` the RFC 3339 UTC second by which the bucket is full again. The
        ``tokens-*`` trio repeats the token limit that is nearer to refusing (the API's
        "most restrictive limit")."""
        with self._lock:
            at = self._clock() if now is None else now
            wall = self._wall()
            headers: dict[str, str] = {}
            tightest: _Bucket | None = None
            for limit, bucket in self._buckets.items():
                bucket.refill(at)
                _add(headers, _HEADER_NAMES[limit], bucket, wall)
                if limit != "requests" and (tightest is None or bucket.level < tightest.level):
                    tightest = bucket
            if tightest is not None:
                _add(headers, "tokens", tightest, wall)
            return headers


def _add(headers: dict[str, str], name: str, bucket: _Bucket, wall: float) -> None:
    prefix = f"anthropic-ratelimit-{name}"
    headers[f"{prefix}-limit"] = str(bucket.per_minute)
    headers[f"{prefix}-remaining"] = str(max(0, math.floor(bucket.level + _EPSILON)))
    # Rounded up, so a client that waits until the stated second finds the bucket full.
    reset = math.ceil(wall + bucket.until_full())
    headers[f"{prefix}-reset"] = datetime.fromtimestamp(reset, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
