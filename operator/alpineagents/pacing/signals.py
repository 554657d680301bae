"""What the provider says about a key's rate limits: the ``anthropic-ratelimit-*`` headers
and ``retry-after``, read into plain numbers a pacer can act on."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

__all__ = ["LIMITS", "Bucket", "Limit", "RateSignals", "request_cost"]

Limit = Literal["requests", "input_tokens", "output_tokens", "tokens", "overloaded"]
"""What a run waits for: one of the key's limits, or (``overloaded``, a 529) the provider."""

LIMITS: tuple[Limit, ...] = ("requests", "input_tokens", "output_tokens", "tokens")
"""The limits the API reports, by the names its headers use (``-`` for ``_``)."""


@dataclass(frozen=True)
class Bucket:
    """One limit as an answer reported it: the per-minute ``limit``, what is ``remaining``
    now, and ``full_in``, the seconds until the bucket is full again (``-reset``)."""

    limit: int
    remaining: int
    full_in: float

    @property
    def per_second(self) -> float:
        return self.limit / 60.0


@dataclass(frozen=True)
class RateSignals:
    """The rate-limit headers of one answer (any status), read at ``now``."""

    buckets: Mapping[Limit, Bucket] = field(default_factory=dict)
    retry_after: float | None = None

    @classmethod
    def from_headers(cls, headers: Mapping[str, str], now: datetime | None = None) -> RateSignals:
        """Read the API's headers; a header that is missing or malformed is left out (a
        gateway may send some, all or none of them)."""
        lower = {name.lower(): value for name, value in headers.items()}
        now = now or datetime.now(UTC)
        buckets: dict[Limit, Bucket] = {}
        for limit in LIMITS:
            prefix = f"anthropic-ratelimit-{limit.replace('_', '-')}"
            total = _int(lower.get(f"{prefix}-limit"))
            remaining = _int(lower.get(f"{prefix}-remaining"))
            if total is None or remaining is None or total <= 0:
                continue
            reset = _time(lower.get(f"{prefix}-reset"))
            full_in = max(0.0, (reset - now).total_seconds()) if reset is not None else 0.0
            buckets[limit] = Bucket(total, max(0, remaining), full_in)
        return cls(buckets, _retry_after(lower))

    def to_json(self) -> dict[str, Any]:
        """The signals as JSON (the shared limiter learns from what each run saw)."""
        return {
            "buckets": {
                name: {"limit": b.limit, "remaining": b.remaining, "full_in": b.full_in}
                for name, b in self.buckets.items()
            },
            "retry_after": self.retry_after,
        }

    @classmethod
    def from_json(cls, raw: object) -> RateSignals:
        """The inverse of :meth:`to_json`; what does not fit is left out."""
        if not isinstance(raw, dict):
            return cls()
        buckets: dict[Limit, Bucket] = {}
        given = raw.get("buckets")
        for limit in LIMITS:
            item = given.get(limit) if isinstance(given, dict) else None
            if not isinstance(item, dict):
                continue
            try:
                bucket = Bucket(int(item["limit"]), int(item["remaining"]), float(item["full_in"]))
            except (KeyError, TypeError, ValueError):
                continue
            if bucket.limit > 0:
                buckets[limit] = bucket
        retry = raw.get("retry_after")
        if isinstance(retry, bool) or not isinstance(retry, int | float) or retry < 0:
            return cls(buckets)
        return cls(buckets, float(retry))

    def short_of(self, need: Mapping[Limit, int]) -> tuple[Limit, float] | None:
        """The limit that has no room for ``need`` now, and the seconds until it has
        (at its steady rate); None when every reported bucket has room."""
        worst: tuple[Limit, float] | None = None
        for limit, bucket in self.buckets.items():
            wanted = need.get(limit, 0)
            if limit == "tokens":
                wanted = need.get("input_tokens", 0) + need.get("output_tokens", 0)
            if wanted <= bucket.remaining:
                continue
            wait = (wanted - bucket.remaining) / bucket.per_second
            if worst is None or wait > worst[1]:
                worst = (limit, wait)
        return worst


def request_cost(request: Mapping[str, Any], messages_chars: int | None = None) -> dict[Limit, int]:
    """What a Messages API request takes from a key's limits, as it is sent: one request,
    its prompt's tokens (an upper bound: the API does not count cache reads) and its
    ``max_tokens`` (the API reserves them when the request starts).

    ``messages_chars``: the size of ``request["messages"]`` when the caller knows it (the
    Agent does, incrementally); measuring it here is a pass over the whole history."""
    parts = ("system", "tools") if messages_chars is not None else ("system", "messages", "tools")
    prompt = sum(len(str(request.get(part) or "")) for part in parts) + (messages_chars or 0)
    return {
        "requests": 1,
        "input_tokens": math.ceil(prompt / 4),
        "output_tokens": int(request.get("max_tokens") or 0),
    }


def _int(raw: str | None) -> int | None:
    if raw is None:
        return None
    try:
        return int(raw.strip())
    except ValueError:
        return None


def _time(raw: str | None) -> datetime | None:
    if not raw:
        return None
    try:
        parsed = datetime.fromisoformat(raw.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _retry_after(headers: Mapping[str, str]) -> float | None:
    # retry-after-ms is the SDKs' finer hint; retry-after is whole seconds (or an HTTP date,
    # which no Anthropic endpoint sends: it is ignored, the pacer's backoff applies).
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        raw = headers.get(name)
        if raw is None:
            continue
        try:
            value = float(raw) / scale
        except ValueError:
            continue
        if value >= 0 and math.isfinite(value):
            return value
    return None
