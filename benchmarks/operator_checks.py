"""The operator's ``alpineagents_run_checks`` metric, read from its metrics page: how many
runs it looked at since it started (the operator benchmarks' sign that a start is done)."""

from __future__ import annotations

import re
import socket
import urllib.request


def free_port() -> int:
    """A TCP port free on loopback now (for the operator's metrics page)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_checks(port: int) -> dict[tuple[str, str], float]:
    """The operator's ``alpineagents_run_checks_total`` by (source, stepped); {} while
    it does not serve yet."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            text = answer.read().decode()
    except OSError:
        return {}
    found: dict[tuple[str, str], float] = {}
    pattern = r'^alpineagents_run_checks_total\{source="(\w+)",stepped="(\w+)"\} (\S+)$'
    for match in re.finditer(pattern, text, re.MULTILINE):
        found[(match[1], match[2])] = float(match[3])
    return found


def resumed(port: int) -> float:
    """Runs the operator looked at on its resume after starting."""
    checks = run_checks(port)
    return checks.get(("resume", "false"), 0) + checks.get(("resume", "true"), 0)
