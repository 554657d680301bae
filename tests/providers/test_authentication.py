"""The scripted Vertex AI and Foundry check credentials as the providers do: a request
without a token or key they issued is refused before the model is asked."""

from __future__ import annotations

import asyncio
import urllib.error
from collections.abc import Iterator
from pathlib import Path

import anthropic
import pytest

from alpineagents.entra import EntraToken
from alpineagents.testing import ModelServer, reply
from alpineagents.testing.foundry_wire import EntraServer, FoundryServer
from alpineagents.testing.vertex_wire import MetadataServer, VertexServer

ASK = {"max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def model() -> Iterator[ModelServer]:
    with ModelServer([reply("never sent")]) as server:
        yield server


def test_vertex_refuses_a_token_its_metadata_server_did_not_issue(
    model: ModelServer, metadata_server: MetadataServer
) -> None:
    with VertexServer(model, metadata_server, "us-east5") as vertex:
        forged = anthropic.AnthropicVertex(
            region="us-east5",
            project_id=metadata_server.project_id,
            access_token="ya29.forged-token",
            base_url=vertex.base_url,
            max_retries=0,
        )
        with pytest.raises(anthropic.AuthenticationError):
            forged.messages.create(model="claude-sonnet-4-5@20250929", **ASK)  # type: ignore[call-overload]
        assert vertex.refused == ["vertex: no valid access token"]
    assert model.requests == []


def test_foundry_refuses_a_wrong_key(model: ModelServer) -> None:
    with FoundryServer(model, api_key="the-right-key-0123456789") as foundry:
        wrong = anthropic.AnthropicFoundry(
            api_key="a-wrong-key-0123456789", base_url=foundry.base_url, max_retries=0
        )
        with pytest.raises(anthropic.AuthenticationError):
            wrong.messages.create(model="claude-sonnet-4-5", **ASK)  # type: ignore[call-overload]
        assert foundry.refused == ["foundry: no valid key or token"]
    assert model.requests == []


def test_entra_gives_no_token_for_a_wrong_federated_token(tmp_path: Path) -> None:
    token_file = tmp_path / "azure-token"
    token_file.write_text("not-the-projected-token")
    with EntraServer("tenant-1", "client-1", "the-projected-token") as entra:
        exchange = EntraToken.from_environment(entra.env(str(token_file)))
        with pytest.raises(urllib.error.HTTPError):
            asyncio.run(exchange())
        assert entra.refused == ["entra: wrong client or federated token"]


def test_foundry_without_a_key_or_workload_identity_says_what_to_set() -> None:
    with pytest.raises(ValueError, match="AZURE_FEDERATED_TOKEN_FILE, AZURE_CLIENT_ID"):
        EntraToken.from_environment({})
