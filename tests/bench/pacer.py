"""The shared limiter (:mod:`alpineagents.pacing.service`) as tests run it: its real HTTP
service on loopback, on an event loop of its own, and a fake clock tests move."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.request
from typing import Any

from alpineagents.pacing.limiter import Limiter
from alpineagents.pacing.service import PacingService
from tests.bench.clock import FakeClock

__all__ = ["FakeClock", "Service"]


class Service:
    """The shared limiter's HTTP service on loopback, on an event loop of its own."""

    def __init__(self, limiter: Limiter, *, poll_seconds: float = 5.0) -> None:
        self.loop = asyncio.new_event_loop()
        self.service = PacingService(limiter, poll_seconds=poll_seconds)
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        server = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        self._server = server
        host, port = server.sockets[0].getsockname()[:2]
        self.url = f"http://{host}:{port}"

    async def _start(self) -> asyncio.Server:
        return await self.service.start("127.0.0.1", 0)

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=10) as answer:
            body = answer.read().decode()
        return json.loads(body) if path.startswith("/v1/") else body

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self._server.close)
        asyncio.run_coroutine_threadsafe(self.service.aclose(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
