"""A run's side of the shared limiter (:mod:`.service`): ask for a turn before each model
request, tell how it went after. A limiter that cannot be reached costs politeness, never
the run: the run paces itself by the headers (:class:`~.pacer.HeaderPacer`) meanwhile."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from .pacer import HeaderPacer, Report, Throttle, Ticket
from .signals import Limit, RateSignals
from .wire import head, read_message

__all__ = ["SharedPacer"]

_log = logging.getLogger("alpineagents.pacing")
_CONNECT_SECONDS = 5.0
_TRY_AGAIN_SECONDS = 30.0  # after the limiter could not be reached, ask it again this late
_FIRST_POLL_SECONDS = 2.0


class SharedPacer:
    """Asks the limiter at ``url`` (``http://host:port``) for each request's turn.

    ``key`` names the shared limit (a fingerprint of the API key, never the key), ``run``
    the run (its place in line survives a replaced pod), ``namespace`` its fair share and
    ``priority`` its order within the namespace."""

    def __init__(
        self,
        url: str,
        *,
        key: str,
        run: str,
        namespace: str = "default",
        priority: int = 0,
        poll_seconds: float = 20.0,
        fallback: HeaderPacer | None = None,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"the pacer's URL must be http://host:port, got {url!r}")
        self.url = url
        self._address = (parts.hostname, parts.port or 80)
        self.key, self.run, self.namespace, self.priority = key, run, namespace, priority
        self.poll_seconds = poll_seconds
        self.fallback = fallback or HeaderPacer()
        self._unreachable_until = 0.0

    async def turn(self, ticket: Ticket, report: Report) -> None:
        # A ticket refused by the provider goes back in line: the limiter holds the key
        # back for the refusal's retry-after, so the wait is its, not a sleep of ours.
        ticket.id = None
        # The first ask is short, so a run that waits says so soon; later ones are long.
        wait = min(_FIRST_POLL_SECONDS, self.poll_seconds)
        while time.monotonic() >= self._unreachable_until:
            body = {
                "key": self.key,
                "run": self.run,
                "namespace": self.namespace,
                "priority": self.priority,
                "need": dict(ticket.need),
                "wait": wait,
            }
            answer = await self._post("/v1/turns", body, timeout=wait + _CONNECT_SECONDS)
            if answer is None:
                break
            if answer.get("ticket"):
                ticket.id = str(answer["ticket"])
                return
            wait = self.poll_seconds
            report(
                Throttle(
                    _limit(answer.get("limit")),
                    wait,
                    float(answer.get("waited") or 0.0),
                    position=answer.get("position"),
                    refused=ticket.refusals > 0,
                )
            )
        await self.fallback.turn(ticket, report)

    async def answered(
        self, ticket: Ticket, signals: RateSignals, used: Mapping[Limit, int]
    ) -> None:
        await self.fallback.answered(ticket, signals, used)
        await self._done(ticket, {"used": dict(used), "signals": signals.to_json()})

    async def refused(self, ticket: Ticket, signals: RateSignals, limit: Limit) -> None:
        if ticket.id is None:  # sent without a turn (the limiter was away): pace alone
            await self.fallback.refused(ticket, signals, limit)
            return
        ticket.refusals += 1
        await self._done(ticket, {"refused": limit, "signals": signals.to_json()})

    async def aclose(self) -> None:
        await self.fallback.aclose()

    async def _done(self, ticket: Ticket, body: dict[str, Any]) -> None:
        if ticket.id is not None:
            await self._post("/v1/done", {"ticket": ticket.id, **body}, timeout=_CONNECT_SECONDS)

    async def _post(
        self, path: str, body: Mapping[str, Any], *, timeout: float
    ) -> dict[str, Any] | None:
        """The limiter's JSON answer, or None (logged) when it cannot be had."""
        try:
            answer = await asyncio.wait_for(self._exchange(path, body), timeout)
        except (OSError, TimeoutError, ValueError, asyncio.IncompleteReadError) as error:
            _log.warning(
                "the pacer at %s cannot be reached (%s): pacing by the model's headers alone "
                "for %.0f s",
                self.url,
                type(error).__name__,
                _TRY_AGAIN_SECONDS,
            )
            self._unreachable_until = time.monotonic() + _TRY_AGAIN_SECONDS
            return None
        return answer

    async def _exchange(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        host, port = self._address
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port), _CONNECT_SECONDS
        )
        try:
            data = json.dumps(body).encode()
            writer.write(head(f"POST {path} HTTP/1.1", "application/json", len(data)) + data)
            await writer.drain()
            status_line, payload = await read_message(reader)
        finally:
            writer.close()
        if len(status_line) < 2 or status_line[1] != "200":
            raise ValueError(
                f"the pacer answered {' '.join(status_line[1:]) or 'nothing'}: {payload[:200]!r}"
            )
        answer = json.loads(payload)
        if not isinstance(answer, dict):
            raise ValueError("the pacer's answer is not a JSON object")
        return answer


def _limit(raw: object) -> Limit:
    names: tuple[Limit, ...] = ("requests", "input_tokens", "output_tokens", "tokens", "overloaded")
    return next((name for name in names if name == raw), "requests")
