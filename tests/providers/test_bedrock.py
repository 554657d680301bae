"""What is Bedrock's own: the model id in the request's path, the keys the SDK got from a
local STS for the pod's web-identity token (as IRSA gives them), and a SigV4 signature the
scripted Bedrock recomputes and refuses when it does not match. What every provider does
is in test_every_provider.py."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import anthropic
import pytest

from alpineagents import Agent, FileStore, Message, Provider, State, tool
from alpineagents.redaction import MASK, Redactor
from alpineagents.testing import ModelServer, error, reply, tool_use
from alpineagents.testing.bedrock_wire import BedrockServer, LocalSTS
from tests.providers.conftest import next_region

ROLE = "arn:aws:iam::123456789012:role/alpineagents-runs"
TOKEN = "projected-service-account-token-for-sts"
MODEL = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"


@pytest.fixture
def model() -> Iterator[ModelServer]:
    with ModelServer() as server:
        yield server


@pytest.fixture
def bedrock(
    model: ModelServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[BedrockServer]:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with LocalSTS(ROLE, TOKEN) as sts, BedrockServer(model, sts, next_region()) as server:
        for name, value in sts.env(str(token_file)).items():
            monkeypatch.setenv(name, value)
        yield server


def provider(server: BedrockServer) -> Provider:
    return Provider(type="bedrock", region=server.region, base_url=server.url)


@tool
def lookup(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def test_a_run_answers_through_bedrock_with_keys_from_the_web_identity_exchange(
    model: ModelServer, bedrock: BedrockServer, tmp_path: Path
) -> None:
    model.add(reply("Let me look.", tool_use("lookup", {"city": "Lyon"})), reply("Sunny."))
    store = FileStore(tmp_path / "states")
    agent = Agent(MODEL, store, tools=[lookup], provider=provider(bedrock))
    state = State("weather", [Message.user("What is the weather in Lyon?")])

    assert agent.run(state) == "Sunny."

    assert bedrock.model_ids == [MODEL, MODEL]  # the Bedrock id, in the path
    assert bedrock.refused == []
    # One exchange: learning the keys for masking found the SDK's session, made none.
    assert bedrock.sts.exchanges == 1
    assert [e.outcome for e in state.history if e.kind == "tool_result"] == ["ok"]
    saved = _all_text(tmp_path / "states")
    for secret, token in bedrock.sts.issued.values():
        assert secret not in saved and token not in saved
    assert TOKEN not in saved
    # The temporary keys are masked in whatever the process writes from now on.
    (key, (secret, token)), masks = _issued_keys(bedrock), Redactor.from_environment()
    assert masks.text(f"{key} {secret} {token}") == f"{MASK} {MASK} {MASK}"


def test_a_throttling_exception_is_a_wait_for_the_quota_its_message_names(
    model: ModelServer, bedrock: BedrockServer
) -> None:
    model.add(
        error(429, "Too many tokens, please wait before trying again."),
        error(429, "Too many requests, please wait before trying again."),
        reply("Done."),
    )
    waits: list[str] = []
    agent = Agent(MODEL, provider=provider(bedrock), on_throttle=lambda _, t: waits.append(t.limit))

    assert agent.run(State("throttled", [Message.user("go")])) == "Done."
    # Bedrock sends no rate-limit headers: its words are what says which quota ran out.
    assert waits == ["tokens", "requests"]


def test_a_request_signed_with_the_wrong_secret_is_refused(
    model: ModelServer, bedrock: BedrockServer
) -> None:
    model.add(reply("never sent"))
    key, (secret, token) = _issued_keys(bedrock)
    asked = len(model.requests)
    forged = anthropic.AnthropicBedrock(
        aws_access_key=key,
        aws_secret_key=secret[:-2] + "xx",
        aws_session_token=token,
        aws_region=bedrock.region,
        base_url=bedrock.url,
        max_retries=0,
    )
    with pytest.raises(anthropic.PermissionDeniedError):
        forged.messages.create(
            model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        )
    assert any("signature" in why for why in bedrock.refused)
    assert len(model.requests) == asked  # refused before the model was asked


def test_a_request_cut_off_mid_body_is_neither_answered_nor_refused(
    model: ModelServer, bedrock: BedrockServer
) -> None:
    # A run killed while it sends: the cloud never sees the request whole, so its signature
    # (over the whole body) cannot be judged, and the kill-fuzzing tests count refusals.
    host, port = bedrock.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as connection:
        connection.sendall(
            f"POST /model/{MODEL}/invoke HTTP/1.1\r\nhost: {host}:{port}\r\n"
            "authorization: AWS4-HMAC-SHA256 Credential=x, SignedHeaders=host, Signature=y\r\n"
            "content-type: application/json\r\ncontent-length: 200\r\n\r\n"
            '{"anthropic_version": "bedrock-2023-05-31", "max_'.encode()
        )
        connection.shutdown(socket.SHUT_WR)
        answered = b"".join(iter(lambda: connection.recv(4096), b""))  # until the server closes
    assert answered == b""
    assert bedrock.refused == []
    assert model.requests == []


def _issued_keys(bedrock: BedrockServer) -> tuple[str, tuple[str, str]]:
    """Keys the STS issued (one run through the SDK makes it issue some)."""
    assert bedrock.model is not None
    bedrock.model.add(reply("warm"))
    Agent(MODEL, provider=provider(bedrock)).run(State("warm", [Message.user("hi")]))
    return next(iter(bedrock.sts.issued.items()))


def _all_text(folder: Path) -> str:
    return "\n".join(p.read_text() for p in folder.rglob("*") if p.is_file())
