"""Real MCP servers (``tests/agents/mcp_server.py``, the SDK's MCPServer) as fixtures.

``mcp_servers(variant=1, host="127.0.0.1")`` starts one over Streamable HTTP on a free
port of ``host`` (the real node's bridge address for a server pods must reach) and
returns a :class:`MCPTestServer` (its URL, the lines it printed, the calls it ran);
``stdio_server_command(calls)`` is the command line of the same server over stdio, for
an ``MCPServer(command=...)`` that the run starts itself. Servers still running at
teardown are stopped.
"""

from __future__ import annotations

import hashlib
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.paths import REPO

DEADLINE = 120.0  # seconds a server may take to start or to print a line; a safety net


class MCPTestServer:
    """One HTTP MCP server process and the file its tools append their calls to."""

    def __init__(self, calls: Path, variant: int = 1, host: str = "127.0.0.1") -> None:
        self.calls_file = calls
        self.process = subprocess.Popen(
            [*_command("http", calls, variant), "--host", host],
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        listening = self.wait_for("listening ")
        self.url = listening.split(" ", 1)[1]

    def wait_for(self, prefix: str) -> str:
        """The next line the server prints that starts with ``prefix``."""
        while True:
            try:
                line = self._lines.get(timeout=DEADLINE)
            except queue.Empty:
                raise AssertionError(f"the MCP server printed no {prefix!r} line") from None
            if line is None:
                raise AssertionError(
                    f"the MCP server exited ({self.process.wait()}) before {prefix!r}"
                )
            if line.startswith(prefix):
                return line

    def calls(self) -> list[str]:
        """The tools it ran, one name per call, in order."""
        if not self.calls_file.exists():
            return []
        return [line.split(" ", 1)[0] for line in self.calls_file.read_text().splitlines()]

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)


def header_digest(value: str) -> str:
    """What the test server's ``whoami`` answers for an Authorization header ``value``."""
    return "sha256:" + hashlib.sha256(value.encode()).hexdigest()


def stdio_server_command(calls: Path, variant: int = 1) -> list[str]:
    """``[command, *args]`` of the test server over stdio (run from the repository root)."""
    return _command("stdio", calls, variant)


def _command(transport: str, calls: Path, variant: int) -> list[str]:
    module = "tests.agents.mcp_server"
    return [sys.executable, "-m", module, transport, str(calls), "--variant", str(variant)]


@pytest.fixture
def mcp_servers(tmp_path: Path) -> Iterator[Callable[..., MCPTestServer]]:
    """Starts HTTP MCP test servers on demand: ``mcp_servers(variant=1, host=...)``."""
    started: list[MCPTestServer] = []

    def start(
        variant: int = 1, calls: Path | None = None, host: str = "127.0.0.1"
    ) -> MCPTestServer:
        server = MCPTestServer(calls or tmp_path / f"mcp-calls-{len(started)}.txt", variant, host)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
