"""Each model provider as a test meets it: the scripted model behind the provider's wire,
the ``spec.provider`` a manifest gives, the variables a pod gets, and the secrets that must
never be written anywhere (:class:`Cloud`)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from alpineagents.providers import Provider
from alpineagents.testing import ModelServer
from alpineagents.testing.bedrock_wire import BedrockServer, LocalSTS
from alpineagents.testing.foundry_wire import EntraServer, FoundryServer
from alpineagents.testing.gateway_wire import GatewayServer
from alpineagents.testing.provider_wire import ProviderServer
from alpineagents.testing.vertex_wire import MetadataServer, OAuthServer, VertexServer

CLOUDS = ("gateway", "bedrock", "vertex", "vertex-key", "foundry-key", "foundry-entra")
GATEWAY_SECRET = "gw-secret-header-value-0123456789"
FOUNDRY_KEY = "foundry-key-0123456789abcdef"
WEB_IDENTITY_TOKEN = "projected-service-account-token-0123456789"
FEDERATED_TOKEN = "aks-federated-token-0123456789"
# The SDK keeps one boto3 session per region for the process: a region per test keeps
# each test's keys its own STS's.
_regions = (f"us-test-{n}" for n in itertools.count(1))


def next_region() -> str:
    """A region no test of this process has used."""
    return next(_regions)


@dataclass
class Cloud:
    """One provider, ready: ``spec`` is ``spec.provider``, ``env`` what the pod gets."""

    name: str
    model: ModelServer
    spec: dict[str, Any]
    env: dict[str, str]
    model_id: str
    gen_ai_name: str
    wires: list[ProviderServer] = field(default_factory=list)
    issued: Callable[[], list[str]] = lambda: []
    """Credentials handed out so far (temporary keys, tokens): never to be written."""
    given: list[str] = field(default_factory=list)
    """Credentials given to the run (keys, web-identity tokens): never to be written."""

    def provider(self) -> Provider:
        return Provider.from_spec(self.spec, self.env)

    def secrets(self) -> list[str]:
        return [*self.given, *self.issued()]

    def refused(self) -> list[str]:
        return [why for wire in self.wires for why in wire.refused]


def no_ambient_credentials(folder: Path) -> dict[str, str]:
    """Variables that keep a machine's own cloud credentials out of a test's clients (an
    empty value counts as unset to the AWS SDK; ``AWS_PROFILE`` must be unset)."""
    return {
        "AWS_ACCESS_KEY_ID": "",
        "AWS_SECRET_ACCESS_KEY": "",
        "AWS_SESSION_TOKEN": "",
        "AWS_CONFIG_FILE": str(folder / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(folder / "no-aws-credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
        "GOOGLE_APPLICATION_CREDENTIALS": "",
        "CLOUDSDK_CONFIG": str(folder / "no-gcloud"),
    }


@pytest.fixture(scope="session")
def metadata_server() -> Iterator[MetadataServer]:
    """The node's metadata server, one per process as on a GKE node: google-auth reads
    ``GCE_METADATA_HOST`` once, when it is first imported."""
    import os
    import sys

    with MetadataServer("runs-project", "runs@runs-project.iam") as server:
        loaded = sys.modules.get("google.auth.compute_engine._metadata")
        host = server.env()["GCE_METADATA_HOST"]
        saved = {name: os.environ.get(name) for name in server.env()}
        os.environ.update(server.env())
        if loaded is not None:  # imported before this fixture: point it here as well
            loaded._GCE_METADATA_HOST = host  # type: ignore[attr-defined]
        try:
            yield server
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


@pytest.fixture(params=CLOUDS)
def cloud(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    metadata_server: MetadataServer,
) -> Iterator[Cloud]:
    """Each provider in turn; its variables are set in this process too."""
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    for name, value in no_ambient_credentials(tmp_path).items():
        monkeypatch.setenv(name, value)
    with ModelServer() as model, cloud_for(request.param, model, tmp_path, metadata_server) as made:
        for name, value in made.env.items():
            monkeypatch.setenv(name, value)
        yield made


class cloud_for:
    """``with cloud_for(name, model, folder, metadata) as cloud``: provider ``name``'s
    servers in front of ``model`` while the block runs."""

    def __init__(
        self, name: str, model: ModelServer, folder: Path, metadata: MetadataServer
    ) -> None:
        self.name, self.model, self.folder, self.metadata = name, model, folder, metadata
        self.started: list[ProviderServer] = []

    def start(self, wire: ProviderServer) -> Any:
        self.started.append(wire.start())
        return wire

    def __enter__(self) -> Cloud:
        name, model = self.name, self.model
        if name == "gateway":
            gateway = self.start(GatewayServer(model, {"x-gateway-key": GATEWAY_SECRET}))
            return Cloud(
                name,
                model,
                spec={
                    "baseURL": gateway.url,
                    "headers": [
                        {"name": "x-gateway-route", "value": "team-a"},
                        {"name": "x-gateway-key", "secretKeyRef": {"name": "gw", "key": "k"}},
                    ],
                },
                env={
                    "ANTHROPIC_API_KEY": "sk-ant-gateway-run-key-0123456789",
                    "ALPINEAGENTS_PROVIDER_HEADER_X_GATEWAY_KEY": GATEWAY_SECRET,
                },
                model_id="claude-sonnet-4-5",
                gen_ai_name="anthropic",
                wires=[gateway],
                given=[GATEWAY_SECRET, "sk-ant-gateway-run-key-0123456789"],
            )
        if name == "bedrock":
            token_file = self.folder / "aws-token"
            token_file.write_text(WEB_IDENTITY_TOKEN)
            sts = self.start(LocalSTS("arn:aws:iam::123456789012:role/runs", WEB_IDENTITY_TOKEN))
            bedrock = self.start(BedrockServer(model, sts, next_region()))
            return Cloud(
                name,
                model,
                spec={"type": "bedrock", "region": bedrock.region, "baseURL": bedrock.url},
                env=sts.env(str(token_file)),
                model_id="us.anthropic.claude-sonnet-4-5-20250929-v1:0",
                gen_ai_name="aws.bedrock",
                wires=[sts, bedrock],
                issued=lambda: [v for key, pair in sts.issued.items() for v in (key, *pair)],
                given=[WEB_IDENTITY_TOKEN],
            )
        if name == "vertex":
            metadata = self.metadata
            vertex = self.start(VertexServer(model, metadata, "us-east5"))
            return Cloud(
                name,
                model,
                spec={
                    "type": "vertex",
                    "region": "us-east5",
                    "projectId": "runs-project",
                    "baseURL": vertex.base_url,
                },
                env=metadata.env(),
                model_id="claude-sonnet-4-5@20250929",
                gen_ai_name="gcp.vertex_ai",
                wires=[vertex],
                issued=lambda: list(metadata.tokens),
            )
        if name == "vertex-key":
            oauth = self.start(OAuthServer("runs-project"))
            vertex = self.start(VertexServer(model, oauth, "us-east5"))
            key = oauth.service_account_key("runs@runs-project.iam.gserviceaccount.com")
            return Cloud(
                name,
                model,
                spec={
                    "type": "vertex",
                    "region": "us-east5",
                    "projectId": "runs-project",
                    "baseURL": vertex.base_url,
                    "credentials": {"secretKeyRef": {"name": "vertex-sa", "key": "key.json"}},
                },
                env={"ALPINEAGENTS_PROVIDER_CREDENTIALS": key},
                model_id="claude-sonnet-4-5@20250929",
                gen_ai_name="gcp.vertex_ai",
                wires=[oauth, vertex],
                issued=lambda: list(oauth.tokens),
                given=[key, json.loads(key)["private_key"]],
            )
        if name == "foundry-key":
            foundry = self.start(FoundryServer(model, api_key=FOUNDRY_KEY))
            return Cloud(
                name,
                model,
                spec={
                    "type": "foundry",
                    "baseURL": foundry.base_url,
                    "credentials": {"secretKeyRef": {"name": "foundry", "key": "key"}},
                },
                env={"ALPINEAGENTS_PROVIDER_CREDENTIALS": FOUNDRY_KEY},
                model_id="claude-sonnet-4-5",
                gen_ai_name="azure.ai.inference",
                wires=[foundry],
                given=[FOUNDRY_KEY],
            )
        token_file = self.folder / "azure-token"
        token_file.write_text(FEDERATED_TOKEN)
        entra = self.start(EntraServer("tenant-1", "client-1", FEDERATED_TOKEN))
        foundry = self.start(FoundryServer(model, api_key=FOUNDRY_KEY, entra=entra))
        return Cloud(
            name,
            model,
            spec={"type": "foundry", "baseURL": foundry.base_url},
            env=entra.env(str(token_file)),
            model_id="claude-sonnet-4-5",
            gen_ai_name="azure.ai.inference",
            wires=[entra, foundry],
            issued=lambda: list(entra.tokens),
            given=[FEDERATED_TOKEN, FOUNDRY_KEY],
        )

    def __exit__(self, *exc: object) -> None:
        for wire in reversed(self.started):
            wire.stop()
