"""The shared limiter's decisions: which waiting request of a key goes next, and when.

Plain and clocked (no I/O), so the order is testable on its own; the service
(:mod:`.service`) puts it on HTTP. For each key it keeps token buckets (requests, input
and output tokens per minute, filled at ``headroom`` of the limit and holding
``burst_seconds`` of it) and one line of waiting requests. A request is granted when every
bucket has room for it, in this order: namespaces by their weighted share served so far
(one cannot take the key from another), then within a namespace higher ``priority``
first, then whoever has waited longest.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from .signals import Limit, RateSignals

__all__ = ["Grant", "KeyLimits", "Limiter", "Waiting"]

_DIMENSIONS: tuple[Limit, ...] = ("requests", "input_tokens", "output_tokens")
_PROBE_SECONDS = 30.0
_FORGET_GRANTS_AFTER = 900.0  # seconds; longer than any request's answer takes


@dataclass(frozen=True)
class KeyLimits:
    """A key's per-minute limits; None: not known yet (learned from the first answer's
    headers) or none."""

    requests_per_minute: int | None = None
    input_tokens_per_minute: int | None = None
    output_tokens_per_minute: int | None = None

    def __post_init__(self) -> None:
        for name in ("requests_per_minute", "input_tokens_per_minute", "output_tokens_per_minute"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ValueError(
                    f"{type(self).__name__}: {name} must be a whole number of at least 1 or "
                    f"None, got {value!r}"
                )

    def per_minute(self, limit: Limit) -> int | None:
        """The per-minute figure of one limit (None: unknown, or no limit)."""
        return {
            "requests": self.requests_per_minute,
            "input_tokens": self.input_tokens_per_minute,
            "output_tokens": self.output_tokens_per_minute,
        }.get(limit)


@dataclass(frozen=True)
class Grant:
    """A request's turn: its ``ticket``, how long it waited and for which limit (None: it
    did not wait)."""

    ticket: str
    run: str
    waited: float
    limit: Limit | None


@dataclass(frozen=True)
class Waiting:
    """A request in line, for the status of its run and the metrics."""

    key: str
    run: str
    namespace: str
    priority: int
    waited: float
    position: int
    limit: Limit


@dataclass
class _Bucket:
    per_second: float
    capacity: float
    level: float
    at: float

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + self.per_second * (now - self.at))
        self.at = now

    def room_for(self, amount: float) -> bool:
        # A request larger than the whole bucket goes when it is full, else it never would.
        return self.level >= min(amount, self.capacity)

    def seconds_until(self, amount: float) -> float:
        missing = min(amount, self.capacity) - self.level
        return max(0.0, missing / self.per_second)


@dataclass
class _Request:
    key: str
    run: str
    namespace: str
    priority: int
    need: dict[Limit, int]
    since: float
    order: int
    present: bool = True
    left_at: float = 0.0
    blocked_by: Limit = "requests"


@dataclass
class _Key:
    limits: KeyLimits
    buckets: dict[Limit, _Bucket] = field(default_factory=dict)
    paused_until: float = 0.0
    paused_for: Limit = "requests"
    served: dict[str, float] = field(default_factory=dict)  # namespace: weighted share
    answered: bool = False
    """An answer was reported: what its headers did not limit (a gateway that sends none)
    has no limit, rather than one request at a time for ever."""


class Limiter:
    """The line of every key's waiting requests (see the module docstring).

    ``ask`` puts a run's request in line (or finds it there: a run whose pod was replaced
    keeps its place for ``keep_place`` seconds); ``grants`` hands out the turns due now;
    ``done`` tells how a granted request went; ``seconds_to_next`` says when to look again.
    """

    def __init__(
        self,
        limits: KeyLimits = KeyLimits(),
        *,
        weights: Mapping[str, float] | None = None,
        headroom: float = 0.95,
        burst_seconds: float = 1.0,
        keep_place: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < headroom <= 1:
            raise ValueError(f"Limiter: headroom must be in (0, 1], got {headroom!r}")
        if burst_seconds <= 0:
            raise ValueError(f"Limiter: burst_seconds must be positive, got {burst_seconds!r}")
        for namespace, weight in (weights or {}).items():
            if not weight > 0:
                raise ValueError(
                    f"Limiter: the weight of {namespace!r} must be positive, got {weight!r}"
                )
        self.default_limits = limits
        self.weights = dict(weights or {})
        self.headroom = headroom
        self.burst_seconds = burst_seconds
        self.keep_place = keep_place
        self._clock = clock
        self._keys: dict[str, _Key] = {}
        self._line: dict[str, _Request] = {}  # by run: one request at a time per run
        self._granted: dict[str, tuple[_Request, float]] = {}  # ticket: request, when
        self._order = itertools.count()
        self._tickets = itertools.count(1)

    # ------------------------------------------------------------------ the line
    def ask(
        self, key: str, run: str, namespace: str, priority: int, need: Mapping[Limit, int]
    ) -> None:
        """Put ``run``'s next request in line, or mark it present again if it is there."""
        now = self._clock()
        waiting = self._line.get(run)
        if waiting is not None and waiting.key == key:
            waiting.present, waiting.need, waiting.priority = True, dict(need), priority
            return
        state = self._key(key, now)
        if not any(r.key == key and r.namespace == namespace for r in self._line.values()):
            # A namespace that comes back starts level with those in line, not with the
            # credit of the time it was away.
            active = [state.served[r.namespace] for r in self._line.values() if r.key == key]
            floor = min(active) if active else max(state.served.values(), default=0.0)
            state.served[namespace] = max(state.served.get(namespace, 0.0), floor)
        self._line[run] = _Request(
            key, run, namespace, priority, dict(need), now, next(self._order)
        )

    def away(self, run: str) -> None:
        """``run`` stopped asking (its poll ended, its pod went): it keeps its place for a while."""
        waiting = self._line.get(run)
        if waiting is not None:
            waiting.present, waiting.left_at = False, self._clock()

    def grants(self) -> list[Grant]:
        """The turns due now, in order; each takes its share of its key's buckets."""
        now = self._clock()
        self._forget_absent(now)
        granted: list[Grant] = []
        for key in {r.key for r in self._line.values()}:
            state = self._key(key, now)
            while (head := self._head(key, state)) is not None:
                if self._learning(key, state, now):
                    # Limits not known yet: one request at a time until an answer's headers
                    # tell them, rather than a fleet's burst the provider refuses.
                    break
                blocked = self._blocked(state, head.need, now)
                if blocked is not None:
                    head.blocked_by = blocked
                    break
                granted.append(self._grant(state, head, now))
        return granted

    def seconds_to_next(self) -> float | None:
        """When a bucket will have room for a key's next request (None: nobody waits)."""
        now = self._clock()
        waits = []
        for key in {r.key for r in self._line.values() if r.present}:
            state = self._key(key, now)
            head = self._head(key, state)
            if head is not None and not self._learning(key, state, now):  # done() wakes those
                waits.append(self._wait(state, head.need, now))
        return min(waits) if waits else None

    def done(
        self,
        ticket: str,
        used: Mapping[Limit, int] | None,
        signals: RateSignals,
        refused: Limit | None = None,
    ) -> None:
        """How a granted request went: ``used`` (the answer's uncached input and output
        tokens) settles what its grant reserved; ``refused`` (the provider's 429 for that
        limit, or a 529) holds the key back for its ``retry-after``."""
        now = self._clock()
        granted = self._granted.pop(ticket, None)
        if granted is None:
            return
        request = granted[0]
        key, need = request.key, request.need
        state = self._key(key, now)
        state.answered = True
        self._learn(state, signals, now, answered=bool(used) and refused is None)
        for limit, amount in (used or {}).items():
            bucket = state.buckets.get(limit)
            if bucket is not None and limit != "requests":
                bucket.refill(now)
                bucket.level = min(bucket.capacity, bucket.level + need.get(limit, 0) - amount)
        if refused is not None:
            bucket = state.buckets.get(refused)
            if bucket is not None:
                bucket.refill(now)
                bucket.level = min(bucket.level, 0.0)
            hold = signals.retry_after if signals.retry_after is not None else 1.0
            if now + hold > state.paused_until:
                state.paused_until, state.paused_for = now + hold, refused
            if request.run not in self._line:
                # Refused through no fault of its own: back in line where it was, until
                # its run asks again (it keeps its place as a replaced pod's does).
                request.present, request.left_at, request.blocked_by = False, now, refused
                self._line[request.run] = request

    def waiting(self) -> list[Waiting]:
        """Every request in line, with its place (1 is next)."""
        now = self._clock()
        result = []
        for key in sorted({r.key for r in self._line.values()}):
            state = self._key(key, now)
            for position, request in enumerate(self._in_order(key, state), start=1):
                result.append(
                    Waiting(
                        key,
                        request.run,
                        request.namespace,
                        request.priority,
                        now - request.since,
                        position,
                        request.blocked_by,
                    )
                )
        return result

    # ------------------------------------------------------------------ inside
    def _key(self, key: str, now: float) -> _Key:
        state = self._keys.get(key)
        if state is None:
            state = self._keys[key] = _Key(self.default_limits)
            for limit in _DIMENSIONS:
                self._set_rate(state, limit, state.limits.per_minute(limit), now, start_empty=True)
        return state

    def _set_rate(
        self, state: _Key, limit: Limit, per_minute: int | None, now: float, *, start_empty: bool
    ) -> None:
        if per_minute is None:
            return
        per_second = per_minute / 60.0 * self.headroom
        capacity = max(per_second * self.burst_seconds, 1.0)
        # A limiter that restarts knows nothing of what was just sent: it starts with an
        # empty bucket rather than a burst the provider may refuse.
        state.buckets[limit] = _Bucket(per_second, capacity, 0.0 if start_empty else capacity, now)

    def _learn(self, state: _Key, signals: RateSignals, now: float, *, answered: bool) -> None:
        """Follow what the answers say of the limits the chart does not set: a new or
        changed ``-limit`` sets its bucket's rate (keeping its level); a reply that reports
        no limits at all (the key's limits were lifted, or a gateway stands in front of it)
        drops them."""
        for limit in _DIMENSIONS:
            if state.limits.per_minute(limit) is not None:
                continue
            reported = signals.buckets.get(limit)
            bucket = state.buckets.get(limit)
            if reported is not None and bucket is None:
                self._set_rate(state, limit, reported.limit, now, start_empty=False)
            elif reported is not None and bucket is not None:
                bucket.refill(now)
                level = bucket.level
                self._set_rate(state, limit, reported.limit, now, start_empty=False)
                state.buckets[limit].level = min(level, state.buckets[limit].capacity)
            elif answered and not signals.buckets and bucket is not None:
                del state.buckets[limit]

    def _learning(self, key: str, state: _Key, now: float) -> bool:
        """Whether the key's first request (its probe) is still out: its limits are known
        from neither the chart nor an answer. A probe whose run never reports (its pod
        gone) is given up after :data:`_PROBE_SECONDS`, and another goes."""
        if state.buckets or state.answered:
            return False
        return any(
            r.key == key and now - when < _PROBE_SECONDS for r, when in self._granted.values()
        )

    def _in_order(self, key: str, state: _Key) -> list[_Request]:
        mine = [r for r in self._line.values() if r.key == key]
        by_namespace: dict[str, list[_Request]] = {}
        for request in sorted(mine, key=lambda r: (-r.priority, r.since, r.order)):
            by_namespace.setdefault(request.namespace, []).append(request)
        # Weighted fair order: replay the shares as grants would move them.
        served = {ns: state.served.get(ns, 0.0) for ns in by_namespace}
        ordered = []
        while by_namespace:
            namespace = min(by_namespace, key=lambda ns: (served[ns], ns))
            ordered.append(by_namespace[namespace].pop(0))
            served[namespace] += 1.0 / self.weights.get(namespace, 1.0)
            if not by_namespace[namespace]:
                del by_namespace[namespace]
        return ordered

    def _head(self, key: str, state: _Key) -> _Request | None:
        return next((r for r in self._in_order(key, state) if r.present), None)

    def _blocked(self, state: _Key, need: Mapping[Limit, int], now: float) -> Limit | None:
        if now < state.paused_until:
            return state.paused_for
        for limit, bucket in state.buckets.items():
            bucket.refill(now)
            if not bucket.room_for(need.get(limit, 0)):
                return limit
        return None

    def _wait(self, state: _Key, need: Mapping[Limit, int], now: float) -> float:
        wait = max(0.0, state.paused_until - now)
        for limit, bucket in state.buckets.items():
            bucket.refill(now)
            wait = max(wait, bucket.seconds_until(need.get(limit, 0)))
        return wait

    def _grant(self, state: _Key, request: _Request, now: float) -> Grant:
        del self._line[request.run]
        for limit, bucket in state.buckets.items():
            bucket.level -= request.need.get(limit, 0)
        state.served[request.namespace] = state.served.get(
            request.namespace, 0.0
        ) + 1.0 / self.weights.get(request.namespace, 1.0)
        ticket = f"t{next(self._tickets)}"
        self._granted[ticket] = (request, now)
        waited = now - request.since
        return Grant(ticket, request.run, waited, request.blocked_by if waited > 0 else None)

    def _forget_absent(self, now: float) -> None:
        for run, request in list(self._line.items()):
            if not request.present and now - request.left_at > self.keep_place:
                del self._line[run]
        # A run whose pod died between its grant and its answer never reports: its
        # reservation has long been refilled by then, the ticket only takes memory.
        for ticket, (_, when) in list(self._granted.items()):
            if now - when > _FORGET_GRANTS_AFTER:
                del self._granted[ticket]
