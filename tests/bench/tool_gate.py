"""A gate that shell tool calls in pods pass through, so a test can hold a run in the
middle of a tool call and count how often the call really ran.

:class:`ToolGate` is an HTTP server on the real node's bridge (pods reach it, nothing
outside the machine does). :meth:`ToolGate.command` is a shell command for the agent's
``shell`` tool: it tells the gate it started, then waits until the test calls
:meth:`ToolGate.release` (a call released before it starts passes straight through),
then prints ``<name> done``. Counting is by the gate, so it counts every start in every
pod, including ones a lost pod never reported back to the store.

Fixture: ``tool_gate`` (session), on the ``real_node`` fixture's bridge.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

_WAIT_SECONDS = 1800.0


class ToolGate:
    """The gate's server and its record of starts (see the module docstring)."""

    def __init__(self, address: str) -> None:
        self._lock = threading.Condition()
        self._starts: Counter[str] = Counter()
        self._released: set[str] = set()
        gate = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                _, action, name = [*self.path.split("/"), "", ""][:3]
                if action == "start":
                    gate._started(name)
                elif action == "wait":
                    gate._wait(name)
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer((address, 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://{address}:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._lock:
            self._released.add("*")
            self._lock.notify_all()
        self._server.shutdown()
        self._server.server_close()

    def _started(self, name: str) -> None:
        with self._lock:
            self._starts[name] += 1
            self._lock.notify_all()

    def _wait(self, name: str) -> None:
        with self._lock:
            self._lock.wait_for(
                lambda: name in self._released or "*" in self._released, timeout=_WAIT_SECONDS
            )

    def command(self, name: str, then: str = "") -> str:
        """The shell command of a gated call ``name`` (``then``: a command to run after
        reporting the start, instead of waiting for the release)."""
        report = f"u.urlopen('{self.url}/start/{name}', timeout=60)"
        wait = f"u.urlopen('{self.url}/wait/{name}', timeout={int(_WAIT_SECONDS)})"
        if then:
            return f'python -c "import urllib.request as u; {report}" && {then}'
        return f"python -c \"import urllib.request as u; {report}; {wait}; print('{name} done')\""

    def starts(self, name: str) -> int:
        """How many times the call ``name`` started, in any pod."""
        with self._lock:
            return self._starts[name]

    def wait_started(self, name: str, times: int = 1, timeout: float = 120.0) -> None:
        """Wait until the call ``name`` started ``times`` times."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._starts[name] < times:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(
                        f"tool call {name!r} started {self._starts[name]} times, "
                        f"not {times}, within {timeout:.0f}s"
                    )
                self._lock.wait(remaining)

    def release(self, name: str) -> None:
        """Let the call ``name`` finish (now, or as soon as it starts)."""
        with self._lock:
            self._released.add(name)
            self._lock.notify_all()


@pytest.fixture(scope="session")
def tool_gate(real_node: Any) -> Iterator[ToolGate]:
    """A :class:`ToolGate` on the real node's bridge."""
    from tests.bench.node_network import TEST_SERVERS_ADDRESS

    gate = ToolGate(TEST_SERVERS_ADDRESS)
    gate.start()
    try:
        yield gate
    finally:
        gate.stop()
