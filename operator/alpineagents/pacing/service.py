"""The shared limiter as a small HTTP service: every run on a key asks it for a turn
before each model request (``alpineagents pacer``, and the chart's ``pacing``).

JSON over HTTP/1.1, one request per connection:

- ``POST /v1/turns`` ``{"key", "run", "namespace", "priority", "need", "wait"}``: waits
  up to ``wait`` seconds (at most ``poll_seconds``) for the turn. ``{"ticket", "waited", "limit"}`` when it is the run's
  turn; else ``{"ticket": null, "position", "waited", "limit"}`` and the run asks again,
  keeping its place.
- ``POST /v1/done`` ``{"ticket", "used", "signals", "refused"}``: how the request went.
- ``GET /v1/waiting``: who waits, for what, since when (the operator's ``Throttled``).
- ``GET /metrics``: Prometheus text. ``GET /healthz``.

It holds nothing that must survive it: a restarted limiter starts with empty buckets and
an empty line, and runs that cannot reach it pace themselves by the headers meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import Counter, defaultdict
from collections.abc import Mapping
from typing import Any

from .limiter import Grant, Limiter
from .signals import LIMITS, Limit, RateSignals
from .wire import head, read_message

__all__ = ["PacingService"]

_log = logging.getLogger("alpineagents.pacing")
_LIMITS_AND_OVERLOAD: tuple[Limit, ...] = (*LIMITS, "overloaded")


class PacingService:
    """The :class:`~.limiter.Limiter` served over HTTP (see the module docstring)."""

    def __init__(self, limiter: Limiter, *, poll_seconds: float = 20.0) -> None:
        self.limiter = limiter
        self.poll_seconds = poll_seconds
        self._polls: dict[str, asyncio.Future[Grant | None]] = {}
        self._wake = asyncio.Event()
        self._granted: Counter[str] = Counter()
        self._waited: defaultdict[str, float] = defaultdict(float)
        self._refused: Counter[str] = Counter()
        self._dispatcher: asyncio.Task[None] | None = None

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> asyncio.Server:
        """Listen on ``host:port`` (0: any free port) and start handing out turns."""
        self._dispatcher = asyncio.create_task(self._dispatch())
        return await asyncio.start_server(self._connection, host, port)

    async def aclose(self) -> None:
        if self._dispatcher is not None:
            self._dispatcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._dispatcher

    # ------------------------------------------------------------------ routes
    async def turn(self, body: Mapping[str, Any]) -> dict[str, Any]:
        key, run = _text(body, "key"), _text(body, "run")
        namespace = str(body.get("namespace") or "default")
        priority = body.get("priority") or 0
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise ValueError(f"priority must be a whole number, got {priority!r}")
        need = _need(body.get("need"))
        wait = body.get("wait", self.poll_seconds)
        if isinstance(wait, bool) or not isinstance(wait, int | float) or wait < 0:
            raise ValueError(f"wait must be a number of seconds, got {wait!r}")
        self.limiter.ask(key, run, namespace, priority, need)
        earlier = self._polls.pop(run, None)
        if earlier is not None and not earlier.done():
            earlier.set_result(None)  # the same run asks again (its pod was replaced)
        poll: asyncio.Future[Grant | None] = asyncio.get_running_loop().create_future()
        self._polls[run] = poll
        self._wake.set()
        await asyncio.wait({poll}, timeout=min(float(wait), self.poll_seconds))
        grant = poll.result() if poll.done() else None
        if self._polls.get(run) is poll:
            del self._polls[run]
        if grant is not None:
            self._granted[namespace] += 1
            self._waited[namespace] += grant.waited
            return {"ticket": grant.ticket, "waited": grant.waited, "limit": grant.limit}
        if not poll.done():
            self.limiter.away(run)
        place = next((w for w in self.limiter.waiting() if w.run == run), None)
        return {
            "ticket": None,
            "position": place.position if place else None,
            "waited": place.waited if place else 0.0,
            "limit": place.limit if place else "requests",
        }

    def done(self, body: Mapping[str, Any]) -> dict[str, Any]:
        ticket = _text(body, "ticket")
        refused = body.get("refused")
        if refused is not None and refused not in _LIMITS_AND_OVERLOAD:
            raise ValueError(f"refused must be one of {', '.join(_LIMITS_AND_OVERLOAD)} or null")
        used = _need(body.get("used")) if body.get("used") is not None else None
        self.limiter.done(ticket, used, RateSignals.from_json(body.get("signals")), refused)
        if refused is not None:
            self._refused[str(refused)] += 1
        self._wake.set()
        return {}

    def waiting(self) -> list[dict[str, Any]]:
        return [
            {
                "key": w.key,
                "run": w.run,
                "namespace": w.namespace,
                "priority": w.priority,
                "waited": round(w.waited, 3),
                "position": w.position,
                "limit": w.limit,
            }
            for w in self.limiter.waiting()
        ]

    def metrics(self) -> str:
        waiting = Counter(w.namespace for w in self.limiter.waiting())
        lines = [
            "# HELP alpineagents_pacing_waiting Model requests waiting for their turn.",
            "# TYPE alpineagents_pacing_waiting gauge",
            *(
                f'alpineagents_pacing_waiting{{namespace="{ns}"}} {n}'
                for ns, n in sorted(waiting.items())
            ),
            "# HELP alpineagents_pacing_granted_total Turns given to model requests.",
            "# TYPE alpineagents_pacing_granted_total counter",
            *(
                f'alpineagents_pacing_granted_total{{namespace="{ns}"}} {n}'
                for ns, n in sorted(self._granted.items())
            ),
            "# HELP alpineagents_pacing_wait_seconds_total Time model requests waited for their turn.",
            "# TYPE alpineagents_pacing_wait_seconds_total counter",
            *(
                f'alpineagents_pacing_wait_seconds_total{{namespace="{ns}"}} {s:.3f}'
                for ns, s in sorted(self._waited.items())
            ),
            "# HELP alpineagents_pacing_refused_total Requests the provider refused (429, 529) after their turn.",
            "# TYPE alpineagents_pacing_refused_total counter",
            *(
                f'alpineagents_pacing_refused_total{{limit="{lim}"}} {n}'
                for lim, n in sorted(self._refused.items())
            ),
        ]
        return "\n".join(lines) + "\n"

    # ------------------------------------------------------------------ inside
    async def _dispatch(self) -> None:
        while True:
            self._wake.clear()  # before the grants: a wake during them is not lost
            for grant in self.limiter.grants():
                poll = self._polls.get(grant.run)
                if poll is not None and not poll.done():
                    poll.set_result(grant)
            wait = self.limiter.seconds_to_next()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._wake.wait(), timeout=wait if wait is None else max(wait, 0.001)
                )

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            status, payload, content_type = await self._route(reader)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            writer.close()
            return
        data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
        reason = "OK" if status == 200 else "Error"
        with contextlib.suppress(ConnectionError):
            writer.write(head(f"HTTP/1.1 {status} {reason}", content_type, len(data)) + data)
            await writer.drain()
        writer.close()

    async def _route(self, reader: asyncio.StreamReader) -> tuple[int, Any, str]:
        try:
            request_line, raw = await read_message(reader)
        except ValueError as error:
            return 400, {"error": str(error)}, "application/json"
        if len(request_line) < 2:
            return 400, {"error": "no request line"}, "application/json"
        method, path = request_line[0], request_line[1].split("?")[0]
        try:
            body = json.loads(raw) if raw else {}
            if method == "POST" and not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
            if (method, path) == ("POST", "/v1/turns"):
                return 200, await self.turn(body), "application/json"
            if (method, path) == ("POST", "/v1/done"):
                return 200, self.done(body), "application/json"
            if (method, path) == ("GET", "/v1/waiting"):
                return 200, self.waiting(), "application/json"
            if (method, path) == ("GET", "/metrics"):
                return 200, self.metrics(), "text/plain; version=0.0.4"
            if (method, path) == ("GET", "/healthz"):
                return 200, {"ok": True}, "application/json"
        except ValueError as error:  # json's errors are ValueErrors too
            return 400, {"error": str(error)}, "application/json"
        return 404, {"error": f"{method} {path} is not served"}, "application/json"


def _text(body: Mapping[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be non-empty text")
    return value


def _need(raw: object) -> dict[Limit, int]:
    if raw is None:
        return {"requests": 1}
    if not isinstance(raw, dict):
        raise ValueError("need and used must be objects of limits to whole numbers")
    need: dict[Limit, int] = {}
    for limit in LIMITS:
        value = raw.get(limit)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{limit} must be a whole number of at least 0, got {value!r}")
        need[limit] = value
    return need
