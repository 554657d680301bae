"""spec.provider checked into a Provider: clear errors naming the field, secrets from the
pod's variables, and each provider's model ids known to the window and price tables."""

from __future__ import annotations

import anthropic
import pytest

from alpineagents.context import window_for
from alpineagents.model_ids import anthropic_model_id
from alpineagents.pacing import SharedPacer
from alpineagents.pod_contract import (
    ENV_PROVIDER_CREDENTIALS,
    SecretRef,
    provider_header_variable,
    provider_secret_refs,
)
from alpineagents.providers import Provider, ProviderError
from alpineagents.redaction import Redactor
from alpineagents.runner import ExitCode
from alpineagents.runner.build import pacer_for
from alpineagents.testing import ModelServer
from alpineagents.usage import Price, price_for
from tests.bench.runner_process import Workspace


@pytest.mark.parametrize(
    ("spec", "where", "says"),
    [
        ({"type": "openai"}, "spec.provider.type", "one of anthropic, bedrock"),
        ({"type": "bedrock"}, "spec.provider.region", "required"),
        ({"type": "vertex", "region": "us-east5"}, "spec.provider.projectId", "required"),
        ({"type": "foundry"}, "spec.provider.resource", "one of the two"),
        (
            {"type": "bedrock", "region": "eu-west-1", "credentials": {"secretKeyRef": {}}},
            "spec.provider.credentials",
            "IRSA",
        ),
        ({"region": "us-east-1"}, "spec.provider.region", "not a setting of type 'anthropic'"),
        ({"type": "anthropic", "baseURL": "gateway.local"}, "spec.provider.baseURL", "http(s)"),
        ({"regoin": "x"}, "spec.provider.regoin", "not a setting"),
        ({"headers": [{"name": "x-a"}]}, "spec.provider.headers[0]", "a value or a secretKeyRef"),
        (
            {"headers": [{"name": "x-key", "secretKeyRef": {"name": "s", "key": "k"}}]},
            "spec.provider.headers[0].secretKeyRef",
            "ALPINEAGENTS_PROVIDER_HEADER_X_KEY is not set",
        ),
        (
            {"type": "foundry", "resource": "r", "credentials": {"secretKeyRef": {}}},
            "spec.provider.credentials.secretKeyRef",
            "ALPINEAGENTS_PROVIDER_CREDENTIALS is not set",
        ),
        (
            {"type": "foundry", "resource": "r", "credentials": "key"},
            "spec.provider.credentials",
            "by reference",
        ),
    ],
)
def test_a_provider_that_cannot_be_used_is_refused_naming_the_field(
    spec: dict[str, object], where: str, says: str
) -> None:
    with pytest.raises(ProviderError) as refused:
        Provider.from_spec(spec, {})
    assert refused.value.where == where
    assert says in refused.value.problem


def test_a_vertex_service_account_key_must_be_one() -> None:
    spec = {
        "type": "vertex",
        "region": "us-east5",
        "projectId": "p",
        "credentials": {"secretKeyRef": {"name": "sa", "key": "key.json"}},
    }
    with pytest.raises(ProviderError) as refused:
        Provider.from_spec(spec, {ENV_PROVIDER_CREDENTIALS: "not json"})
    assert refused.value.where == "spec.provider.credentials"
    assert "service account key" in refused.value.problem


def test_secret_headers_come_from_the_pods_variables_and_are_masked() -> None:
    spec = {
        "baseURL": "https://gateway.internal",
        "headers": [
            {"name": "x-route", "value": "team-a"},
            {"name": "x-portkey-api-key", "secretKeyRef": {"name": "portkey", "key": "key"}},
        ],
    }
    variable = provider_header_variable("x-portkey-api-key")
    assert variable == "ALPINEAGENTS_PROVIDER_HEADER_X_PORTKEY_API_KEY"
    provider = Provider.from_spec(spec, {variable: "pk-secret-0123456789"})
    assert provider.headers == {"x-route": "team-a", "x-portkey-api-key": "pk-secret-0123456789"}
    assert provider.secrets() == ["pk-secret-0123456789"]
    assert "pk-secret" not in repr(provider)
    assert provider_secret_refs({"provider": spec}) == [SecretRef(variable, "portkey", "key")]
    # The runner masks the provider's variables wherever it writes.
    masked = Redactor.from_environment({variable: "pk-secret-0123456789"})
    assert masked.text("sent pk-secret-0123456789") == "sent ***"


def test_each_provider_makes_the_sdks_own_client() -> None:
    made = {
        "anthropic": Provider(base_url="https://gateway.internal").client(),
        "bedrock": Provider(type="bedrock", region="eu-west-3").client(),
        "vertex": Provider(type="vertex", region="us-east5", project_id="p").client(),
        "foundry": Provider(type="foundry", resource="my-res", credentials="k" * 20).client(),
    }
    assert isinstance(made["anthropic"], anthropic.AsyncAnthropic)
    assert isinstance(made["bedrock"], anthropic.AsyncAnthropicBedrock)
    assert isinstance(made["vertex"], anthropic.AsyncAnthropicVertex)
    assert isinstance(made["foundry"], anthropic.AsyncAnthropicFoundry)
    assert str(made["foundry"].base_url) == "https://my-res.services.ai.azure.com/anthropic/"
    assert str(made["bedrock"].base_url).startswith("https://bedrock-runtime.eu-west-3.")
    assert all(client.max_retries == 0 for client in made.values())  # the run retries


@pytest.mark.parametrize(
    ("model", "anthropic_id"),
    [
        ("anthropic.claude-sonnet-4-5-20250929-v1:0", "claude-sonnet-4-5-20250929"),
        ("us.anthropic.claude-3-5-haiku-20241022-v1:0", "claude-3-5-haiku-20241022"),
        ("global.anthropic.claude-opus-4-1-20250805-v1:0", "claude-opus-4-1-20250805"),
        (
            "arn:aws:bedrock:us-east-1:123456789012:inference-profile/"
            "us.anthropic.claude-sonnet-4-20250514-v1:0",
            "claude-sonnet-4-20250514",
        ),
        ("claude-sonnet-4-5@20250929", "claude-sonnet-4-5-20250929"),
        ("claude-sonnet-4-5", "claude-sonnet-4-5"),
        ("gpt-4o", "gpt-4o"),
    ],
)
def test_each_providers_model_ids_are_the_anthropic_ids_they_name(
    model: str, anthropic_id: str
) -> None:
    assert anthropic_model_id(model) == anthropic_id


def test_the_window_and_price_tables_know_the_providers_ids() -> None:
    sonnet, known = price_for("claude-sonnet-4-5")
    assert known
    for model in ("us.anthropic.claude-sonnet-4-5-20250929-v1:0", "claude-sonnet-4-5@20250929"):
        assert price_for(model) == (sonnet, True)
        assert window_for(model) == window_for("claude-sonnet-4-5")
    assert price_for("claude-3-5-haiku@20241022")[0] == Price(0.8, 4.0)
    # A table of your own may price a provider's id as the provider spells it.
    regional = {"eu.anthropic.claude-sonnet": Price(3.3, 16.5)}
    assert price_for("eu.anthropic.claude-sonnet-4-5-20250929-v1:0", regional)[0] == Price(
        3.3, 16.5
    )


def test_a_run_whose_provider_cannot_work_stops_at_its_start_naming_the_field(
    workspace: Workspace, model_server: ModelServer
) -> None:
    manifest = workspace.manifest(prompt="Hello.", provider={"type": "bedrock"})
    runner = workspace.run(manifest)
    assert runner.process.returncode == ExitCode.NOT_RETRYABLE, runner.stderr
    assert "spec.provider.region: is required for type 'bedrock'" in runner.message["error"]
    assert model_server.requests == []


def test_runs_share_the_limiters_line_by_provider_endpoint() -> None:
    env = {"ALPINEAGENTS_PACER": "http://pacer:8080", "ANTHROPIC_API_KEY": "sk-ant-k"}

    def key(provider: Provider | None) -> str:
        pacer = pacer_for(env, "run", 0, provider)
        assert isinstance(pacer, SharedPacer)
        return pacer.key

    bedrock = Provider(type="bedrock", region="us-east-1")
    assert key(bedrock) == key(Provider(type="bedrock", region="us-east-1"))
    assert key(bedrock) != key(Provider(type="bedrock", region="eu-west-1"))
    assert key(bedrock) != key(None) == key(Provider())
    assert key(Provider(base_url="https://gateway.internal")) != key(None)


def test_a_keyless_foundry_run_without_workload_identity_stops_at_its_start(
    workspace: Workspace, model_server: ModelServer
) -> None:
    manifest = workspace.manifest(prompt="Hello.", provider={"type": "foundry", "resource": "r"})
    runner = workspace.run(manifest)
    assert runner.process.returncode == ExitCode.NOT_RETRYABLE, runner.stderr
    assert runner.message["error"].startswith("spec.provider.credentials: ")
    assert "AZURE_FEDERATED_TOKEN_FILE" in runner.message["error"]
    assert model_server.requests == []
