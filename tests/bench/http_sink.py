"""A real HTTP endpoint on loopback that keeps every request it is sent (a webhook's
receiver, for the operator's notifications): it refuses with 503 until :meth:`HttpSink.open`
is called (or always answers ``status`` when made open), and a test waits for requests
instead of sleeping. ``host`` is where it listens: loopback for an operator process on this
machine, :data:`~tests.bench.node_network.TEST_SERVERS_ADDRESS` for one in a pod of the
real node."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.bench.operator_process import WAIT_LIMIT


@dataclass(frozen=True)
class Received:
    """One request: its path, headers (lower-cased names), body, and the status it got."""

    path: str
    headers: dict[str, str]
    body: bytes
    answered: int


class HttpSink:
    """``with HttpSink() as sink``: listening on ``sink.url`` until the block ends."""

    def __init__(self, *, open: bool = True, host: str = "127.0.0.1") -> None:
        self._open = open
        self.received: list[Received] = []
        self._changed = threading.Condition()
        sink = self

        class _Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                with sink._changed:
                    status = 200 if sink._open else 503
                    sink.received.append(
                        Received(
                            self.path,
                            {k.lower(): v for k, v in self.headers.items()},
                            body,
                            status,
                        )
                    )
                    sink._changed.notify_all()
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_: Any) -> None:
                return None

        self._server = ThreadingHTTPServer((host, 0), _Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/hooks/runs"

    def __enter__(self) -> HttpSink:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def open(self) -> None:
        """Answer 200 from now on."""
        with self._changed:
            self._open = True

    def wait_for(self, count: int) -> list[Received]:
        """The first ``count`` requests, once they have come."""
        with self._changed:
            if not self._changed.wait_for(lambda: len(self.received) >= count, WAIT_LIMIT):
                raise TimeoutError(f"{count} request(s) did not come within {WAIT_LIMIT} s")
            return list(self.received)
