"""How a fixture reports a missing real component.

On a user's machine a missing server skips the tests that need it. In CI
(``ALPINEAGENTS_REQUIRE_INFRA=1``, set by ``.ci/run``) it fails them instead, so a
green run always means the real servers were there.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import NoReturn

import pytest


def infra_required() -> bool:
    return os.environ.get("ALPINEAGENTS_REQUIRE_INFRA", "") not in ("", "0", "false")


def missing(what: str, how_to_fix: str) -> NoReturn:
    """Skip (laptop) or fail (CI) a test whose real component is not available."""
    message = f"{what} is not available: {how_to_fix}"
    if infra_required():
        pytest.fail(message + " (ALPINEAGENTS_REQUIRE_INFRA=1: failing instead of skipping)")
    pytest.skip(message)


def provisioning_failed(error: Exception, tests: str) -> int:
    """The exit code of a provisioning command that ``error`` stopped: 1 in CI, where
    the ``tests`` would fail; else 0, saying they will skip."""
    if infra_required():
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"the {tests} tests will skip: {error}", file=sys.stderr)
    return 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
