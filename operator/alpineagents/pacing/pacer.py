"""Waiting for a key's capacity in one process: the :class:`Pacer` interface, and
:class:`HeaderPacer`, which paces by the provider's own signals alone."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from .signals import Bucket, Limit, RateSignals

__all__ = ["HeaderPacer", "Pacer", "Report", "Throttle", "Ticket"]


@dataclass(frozen=True)
class Throttle:
    """One wait of a request for capacity, as a run reports it (log line, span event,
    status): which ``limit`` it waits for, for how many ``seconds`` this time, how long
    the request has waited in all (``total``), its place in the shared line if it has one,
    and whether the provider ``refused`` it (a 429 or 529) or the run held it back first."""

    limit: Limit
    seconds: float
    total: float
    position: int | None = None
    refused: bool = False


Report = Callable[[Throttle], None]
"""Told of each wait before it starts."""


@dataclass
class Ticket:
    """One request's turn: what it may take from the key's limits (``need``), and the id
    the shared limiter gave it."""

    need: Mapping[Limit, int]
    id: str | None = None
    waited: float = 0.0
    refusals: int = field(default=0)


class Pacer(Protocol):
    """Decides when a run may send its next model request.

    ``turn`` waits (telling ``report`` of each wait) and returns the request's ticket; the
    caller then sends it and tells the pacer how it went: ``answered`` with the answer's
    signals and usage, or ``refused`` (429, 529), after which it asks for a ``turn`` again
    with the same ticket. A pacer never fails a request: a refusal is a wait."""

    async def turn(self, ticket: Ticket, report: Report) -> None: ...

    async def answered(
        self, ticket: Ticket, signals: RateSignals, used: Mapping[Limit, int]
    ) -> None: ...

    async def refused(self, ticket: Ticket, signals: RateSignals, limit: Limit) -> None: ...

    async def aclose(self) -> None: ...


class HeaderPacer:
    """Paces one process by what the answers say: a request waits while the last reported
    bucket (projected forward at its rate) has no room for it. Refusals widen a *spread*
    (the time the bucket takes to fill, doubled with each refusal); each request waits a
    random share of it before it goes, so a fleet refused together does not come back
    together. Answers that find the bucket with room narrow it again (halved); answers
    that find it empty keep it, so a process keeps its estimate of how contended the key
    is between refusals instead of forgetting it at each success.

    It knows nothing of other processes on the key except through the headers; the shared
    limiter (:class:`~alpineagents.pacing.shared.SharedPacer`) does better for a fleet
    (``benchmarks/results/fleet.md``)."""

    def __init__(
        self,
        *,
        first_delay: float = 0.5,
        max_delay: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.first_delay = first_delay
        self.max_delay = max_delay
        self._clock = clock
        self._sleep = sleep
        self._rng = rng
        self._signals = RateSignals()
        self._seen_at = clock()
        self._not_before = 0.0
        self._not_before_limit: Limit = "requests"
        self._refusals_in_a_row = 0
        self._spread = 0.0
        self._spread_limit: Limit = "requests"  # what the refusals that widened it named
        self._last_uncached_input: int | None = None

    async def turn(self, ticket: Ticket, report: Report) -> None:
        spread = self._rng() * self._spread
        while True:
            now = self._clock()
            limit, wait = self._not_before_limit, self._not_before - now
            short = self._projected().short_of(self._need(ticket))
            if short is not None and short[1] > wait:
                limit, wait = short
            if spread > wait:
                limit, wait = self._spread_limit, spread
            spread = 0.0
            if wait <= 0:
                self._take(ticket)
                return
            ticket.waited += wait
            report(Throttle(limit, wait, ticket.waited, refused=ticket.refusals > 0))
            await self._sleep(wait)

    async def answered(
        self, ticket: Ticket, signals: RateSignals, used: Mapping[Limit, int]
    ) -> None:
        self._refusals_in_a_row = 0
        if "input_tokens" in used:
            self._last_uncached_input = used["input_tokens"]
        if not any(bucket.remaining <= 0 for bucket in signals.buckets.values()):
            self._spread = self._spread / 2 if self._spread > self.first_delay / 8 else 0.0
        self._learn(signals)

    async def refused(self, ticket: Ticket, signals: RateSignals, limit: Limit) -> None:
        ticket.refusals += 1
        self._refusals_in_a_row += 1
        self._learn(signals)
        doubling = 2 ** min(self._refusals_in_a_row - 1, 10)
        if limit == "overloaded":
            backoff = min(self.first_delay * doubling, self.max_delay)
            wait = backoff * (0.5 + self._rng() / 2)
        else:
            bucket = signals.buckets.get(limit)
            fills = bucket.full_in if bucket is not None else self.first_delay
            self._spread = min(max(self._spread * 2, fills, self.first_delay), self.max_delay)
            self._spread_limit = limit
            wait = signals.retry_after if signals.retry_after is not None else 0.0
        until = self._clock() + wait
        if until > self._not_before:
            self._not_before, self._not_before_limit = until, limit

    async def aclose(self) -> None:
        return None

    def _need(self, ticket: Ticket) -> dict[Limit, int]:
        need = dict(ticket.need)
        # The prompt's size overstates what the API counts (cache reads are free of the
        # input limit); the last answer's uncached input is the better guess once known.
        if self._last_uncached_input is not None:
            need["input_tokens"] = min(need.get("input_tokens", 0), self._last_uncached_input)
        return need

    def _projected(self) -> RateSignals:
        """The last signals, refilled at each bucket's rate for the time since."""
        elapsed = self._clock() - self._seen_at
        buckets = {
            name: Bucket(
                b.limit,
                min(b.limit, int(b.remaining + b.per_second * elapsed)),
                max(0.0, b.full_in - elapsed),
            )
            for name, b in self._signals.buckets.items()
        }
        return RateSignals(buckets)

    def _take(self, ticket: Ticket) -> None:
        """Count the request against the projection, so requests of one process sent
        together do not all count on the same room."""
        projected = self._projected()
        need = self._need(ticket)
        taken: dict[Limit, Bucket] = {}
        for name, bucket in projected.buckets.items():
            amount = need.get(name, 0)
            if name == "tokens":
                amount = need.get("input_tokens", 0) + need.get("output_tokens", 0)
            taken[name] = Bucket(bucket.limit, bucket.remaining - amount, bucket.full_in)
        self._signals, self._seen_at = RateSignals(taken), self._clock()

    def _learn(self, signals: RateSignals) -> None:
        if signals.buckets:
            self._signals, self._seen_at = signals, self._clock()
