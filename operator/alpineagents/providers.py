"""Where a run's model requests go: the Anthropic API (directly or through a gateway), AWS
Bedrock, Google Vertex AI or Azure AI Foundry.

A :class:`Provider` is a checked value (``Agent(provider=...)``, or ``spec.provider`` read by
:meth:`Provider.from_spec`) that makes the anthropic SDK's own client for its cloud
(:meth:`Provider.client`): the same Messages API, prompt caching and usage numbers, other
endpoints and credentials. Credentials come from where each cloud puts a workload's
identity, never from the manifest itself:

- ``bedrock``: the AWS SDK's default chain (IRSA's web-identity token exchanged at STS,
  EKS Pod Identity, an instance role), signed with SigV4 on every request;
- ``vertex``: Application Default Credentials (GKE Workload Identity's metadata server),
  or a service account key from a Secret (``credentials``);
- ``foundry``: a key from a Secret (``credentials``), or Microsoft Entra workload identity
  (the federated token AKS mounts, exchanged for an access token: :mod:`.entra`);
- ``anthropic``: ``ANTHROPIC_API_KEY`` as always; with ``baseURL`` and ``headers``, a
  gateway (LiteLLM, Portkey, an Envoy AI gateway) that takes its own headers.

Header and credential values kept in Secrets reach the runner as variables
(:func:`alpineagents.pod_contract.provider_secret_refs`) and are masked wherever it writes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from .pod_contract import ENV_PROVIDER_CREDENTIALS, provider_header_variable

__all__ = ["GEN_AI_PROVIDER", "Provider", "ProviderError", "ProviderType"]

ProviderType = Literal["anthropic", "bedrock", "vertex", "foundry"]
GEN_AI_PROVIDER: Mapping[str, str] = {
    "anthropic": "anthropic",
    "bedrock": "aws.bedrock",
    "vertex": "gcp.vertex_ai",
    "foundry": "azure.ai.inference",
}
"""Each provider's ``gen_ai.provider.name`` (``gen_ai.system``) in the OpenTelemetry GenAI
conventions."""
_TYPES: tuple[str, ...] = get_args(ProviderType)
# The fields each type takes besides type, headers and baseURL (the rest are refused).
_FIELDS: Mapping[str, tuple[str, ...]] = {
    "anthropic": (),
    "bedrock": ("region",),
    "vertex": ("region", "projectId", "credentials"),
    "foundry": ("resource", "credentials"),
}
_SPEC_FIELDS = ("type", "region", "projectId", "resource", "baseURL", "headers", "credentials")
_CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"


class ProviderError(ValueError):
    """A provider setting that cannot be used; names the field and what to do."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}")
        self.where = where
        self.problem = problem


@dataclass(frozen=True)
class Provider:
    """Where and how a run asks its model (see the module's docstring).

    ``headers`` are sent with every request (a gateway's own); ``credentials`` is a Vertex
    AI service account key (its JSON) or a Foundry key. Both are kept out of ``repr``.
    """

    type: ProviderType = "anthropic"
    region: str | None = None
    project_id: str | None = None
    resource: str | None = None
    base_url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    credentials: str | None = field(default=None, repr=False)
    secret_headers: frozenset[str] = frozenset()
    """Names of the ``headers`` whose values are secrets (from Secrets): masked in errors."""

    def __post_init__(self) -> None:
        where = "provider"
        if self.type not in _TYPES:
            raise ProviderError(
                f"{where}.type", f"must be one of {', '.join(_TYPES)}, not {self.type!r}"
            )
        given = {
            "region": self.region,
            "projectId": self.project_id,
            "resource": self.resource,
            "credentials": self.credentials,
        }
        for name, value in given.items():
            if value is not None and name not in _FIELDS[self.type]:
                raise ProviderError(
                    f"{where}.{name}",
                    f"is not a setting of type {self.type!r}"
                    + (
                        " (Bedrock takes the pod's AWS identity: IRSA or EKS Pod Identity, "
                        "never a key in the manifest)"
                        if self.type == "bedrock" and name == "credentials"
                        else ""
                    ),
                )
        if self.type in ("bedrock", "vertex") and not self.region:
            raise ProviderError(f"{where}.region", f"is required for type {self.type!r}")
        if self.type == "vertex" and not self.project_id:
            raise ProviderError(f"{where}.projectId", "is required for type 'vertex'")
        if self.type == "foundry" and bool(self.resource) == bool(self.base_url):
            raise ProviderError(
                f"{where}.resource",
                "type 'foundry' takes a resource (its name, as in "
                "https://<resource>.services.ai.azure.com) or a baseURL, one of the two",
            )
        if self.base_url is not None and not self.base_url.startswith(("https://", "http://")):
            raise ProviderError(
                f"{where}.baseURL", f"must be an http(s) URL, not {self.base_url!r}"
            )
        if self.type == "vertex" and self.credentials is not None:
            _service_account_info(self.credentials)  # checked now: a bad key fails the start

    @classmethod
    def from_spec(cls, raw: Any, environ: Mapping[str, str] | None = None) -> Provider:
        """The provider ``spec.provider`` asks for (``None`` or absent: the Anthropic API).

        Values from Secrets (``headers[].secretKeyRef``, ``credentials.secretKeyRef``) are
        read from the variables the operator sets (``ALPINEAGENTS_PROVIDER_*``, see
        :mod:`alpineagents.pod_contract`); on a laptop, export them.
        """
        env = os.environ if environ is None else environ
        where = "spec.provider"
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping):
            raise ProviderError(where, "must be a mapping with a type (anthropic, bedrock, ...)")
        unknown = sorted(set(raw) - set(_SPEC_FIELDS))
        if unknown:
            raise ProviderError(
                f"{where}.{unknown[0]}", f"is not a setting (known: {', '.join(_SPEC_FIELDS)})"
            )
        for name in ("type", "region", "projectId", "resource", "baseURL"):
            if name in raw and not isinstance(raw[name], str):
                raise ProviderError(f"{where}.{name}", "must be a string")
        headers, secret = _headers(raw.get("headers"), env, f"{where}.headers")
        kind = raw.get("type", "anthropic")
        given = raw.get("credentials")
        credentials = (
            _credentials(given, env, f"{where}.credentials")
            if "credentials" in _FIELDS.get(kind, ())
            else None
            if given is None
            else "(given)"  # refused below, naming the type
        )
        try:
            return cls(
                type=kind,
                region=raw.get("region"),
                project_id=raw.get("projectId"),
                resource=raw.get("resource"),
                base_url=raw.get("baseURL"),
                headers=headers,
                credentials=credentials,
                secret_headers=secret,
            )
        except ProviderError as error:
            if error.where.startswith(where):
                raise
            raise ProviderError(error.where.replace("provider", where, 1), error.problem) from None

    def check_identity(self, environ: Mapping[str, str] | None = None) -> None:
        """Raise :class:`ProviderError` now if the pod's identity this provider needs is
        plainly missing (a keyless Foundry run without Entra workload identity's variables),
        rather than at the first model request."""
        if self.type == "foundry" and self.credentials is None:
            from .entra import EntraToken

            try:
                EntraToken.from_environment(environ)
            except ValueError as error:
                raise ProviderError("provider.credentials", str(error)) from None

    @property
    def gen_ai_name(self) -> str:
        """This provider's ``gen_ai.provider.name`` in traces."""
        return GEN_AI_PROVIDER[self.type]

    def secrets(self) -> list[str]:
        """The secret values this provider holds (masked wherever a run writes)."""
        values = [v for k, v in self.headers.items() if k in self.secret_headers]
        if self.credentials:
            values.append(self.credentials)
            if self.type == "vertex":
                values.append(str(_service_account_info(self.credentials).get("private_key", "")))
        return [v for v in values if v]

    def client(self) -> Any:
        """A new async client of the anthropic SDK for this provider (its retries are the
        run's own: ``max_retries=0``)."""
        import anthropic

        common: dict[str, Any] = {"max_retries": 0}
        if self.headers:
            common["default_headers"] = dict(self.headers)
        if self.type == "anthropic":
            return anthropic.AsyncAnthropic(base_url=self.base_url, **common)
        if self.type == "bedrock":
            return anthropic.AsyncAnthropicBedrock(
                aws_region=self.region, base_url=self.base_url, **common
            )
        if self.type == "vertex":
            return anthropic.AsyncAnthropicVertex(
                region=str(self.region),
                project_id=str(self.project_id),
                base_url=self.base_url,
                credentials=self._google_credentials(),
                **common,
            )
        if self.credentials is not None:
            auth: dict[str, Any] = {"api_key": self.credentials}
        else:
            from .entra import EntraToken

            auth = {"azure_ad_token_provider": EntraToken.from_environment()}
        if self.base_url is not None:
            return anthropic.AsyncAnthropicFoundry(base_url=self.base_url, **auth, **common)
        return anthropic.AsyncAnthropicFoundry(resource=self.resource, **auth, **common)

    def _google_credentials(self) -> Any:
        if self.credentials is None:
            return None  # the SDK finds Application Default Credentials (Workload Identity)
        from google.oauth2 import service_account

        return service_account.Credentials.from_service_account_info(  # type: ignore[no-untyped-call]
            _service_account_info(self.credentials), scopes=[_CLOUD_PLATFORM]
        )


def _headers(raw: Any, env: Mapping[str, str], where: str) -> tuple[dict[str, str], frozenset[str]]:
    if raw is None:
        return {}, frozenset()
    if not isinstance(raw, list):
        raise ProviderError(where, "must be a list of {name, value} or {name, secretKeyRef}")
    headers: dict[str, str] = {}
    secret: set[str] = set()
    for index, item in enumerate(raw):
        here = f"{where}[{index}]"
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
            raise ProviderError(here, "must be a mapping with a name")
        name = item["name"]
        if ("value" in item) == ("secretKeyRef" in item):
            raise ProviderError(here, f"header {name!r} takes a value or a secretKeyRef, one")
        if "value" in item:
            if not isinstance(item["value"], str):
                raise ProviderError(f"{here}.value", "must be a string")
            headers[name] = item["value"]
            continue
        variable = provider_header_variable(name)
        value = env.get(variable)
        if not value:
            raise ProviderError(
                f"{here}.secretKeyRef",
                f"{variable} is not set (the operator sets it from the Secret; on a laptop, "
                f"export it)",
            )
        headers[name] = value
        secret.add(name)
    return headers, frozenset(secret)


def _credentials(raw: Any, env: Mapping[str, str], where: str) -> str | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping) or not isinstance(raw.get("secretKeyRef"), Mapping):
        raise ProviderError(where, "must be {secretKeyRef: {name, key}}: a key by reference")
    value = env.get(ENV_PROVIDER_CREDENTIALS)
    if not value:
        raise ProviderError(
            f"{where}.secretKeyRef",
            f"{ENV_PROVIDER_CREDENTIALS} is not set (the operator sets it from the Secret; on "
            f"a laptop, export it)",
        )
    return value


def _service_account_info(credentials: str) -> dict[str, Any]:
    try:
        info = json.loads(credentials)
    except ValueError:
        info = None
    if not isinstance(info, dict) or info.get("type") != "service_account":
        raise ProviderError(
            "provider.credentials",
            "type 'vertex' takes a service account key (its JSON, type service_account) "
            "here; leave it out to use the pod's Workload Identity",
        )
    return info
