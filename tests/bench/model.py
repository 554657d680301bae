"""The scripted model server (``alpineagents.testing.ModelServer``) as fixtures.

``model_server`` yields a started server with an empty script; a test adds its turns
with ``model_server.add(...)``; ``model_endpoint`` is that server with the environment
pointing this process's clients at it. ``model_client`` is a real ``anthropic.Anthropic`` client
pointed at it, with retries off so scripted errors surface at once.
"""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import pytest

from alpineagents.testing import ModelServer


@pytest.fixture
def model_server() -> Iterator[ModelServer]:
    """A started scripted model server with no turns; stopped at teardown."""
    with ModelServer() as server:
        yield server


@pytest.fixture
def model_endpoint(model_server: ModelServer, monkeypatch: pytest.MonkeyPatch) -> ModelServer:
    """``model_server``, with this process's ``anthropic`` clients pointed at it (the
    environment variables a test's Agent and its child processes read)."""
    for name, value in model_server.env.items():
        monkeypatch.setenv(name, value)
    return model_server


@pytest.fixture
def model_client(model_server: ModelServer) -> Iterator[anthropic.Anthropic]:
    """The real anthropic client talking to ``model_server``, ``max_retries=0``."""
    with anthropic.Anthropic(
        base_url=model_server.url, api_key="scripted-model-key", max_retries=0
    ) as client:
        yield client
