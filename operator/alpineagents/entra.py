"""Microsoft Entra workload identity: the token AKS mounts in a pod, exchanged for an access
token to Azure AI Foundry (the ``foundry`` provider without a key).

AKS's workload identity webhook sets ``AZURE_FEDERATED_TOKEN_FILE``, ``AZURE_CLIENT_ID``,
``AZURE_TENANT_ID`` and ``AZURE_AUTHORITY_HOST``; the exchange is OAuth 2.0's client
credentials grant with the mounted token as the client assertion. The file is read again
at each exchange (the kubelet renews it), and an access token is kept until shortly before
it expires.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from os import environ as _environ

from .redaction import learn

__all__ = ["FOUNDRY_SCOPE", "EntraToken"]

FOUNDRY_SCOPE = "https://ai.azure.com/.default"
_RENEW_BEFORE = 300.0  # seconds before expiry a new token is asked for
_ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"


@dataclass
class EntraToken:
    """An access token provider for ``AsyncAnthropicFoundry(azure_ad_token_provider=...)``."""

    token_file: str
    client_id: str
    tenant_id: str
    authority: str = "https://login.microsoftonline.com/"
    scope: str = FOUNDRY_SCOPE
    _token: str = field(default="", repr=False)
    _expires: float = 0.0

    @classmethod
    def from_environment(cls, env: Mapping[str, str] | None = None) -> EntraToken:
        """From the variables AKS's workload identity sets; a clear error names the missing."""
        env = _environ if env is None else env
        names = ("AZURE_FEDERATED_TOKEN_FILE", "AZURE_CLIENT_ID", "AZURE_TENANT_ID")
        missing = [name for name in names if not env.get(name)]
        if missing:
            raise ValueError(
                f"provider type 'foundry' without credentials uses Entra workload identity, "
                f"but {', '.join(missing)} is not set: label the pod's ServiceAccount for "
                f"workload identity (the chart's runs.serviceAccount.annotations), or give "
                f"spec.provider.credentials a key by Secret reference"
            )
        return cls(
            token_file=env["AZURE_FEDERATED_TOKEN_FILE"],
            client_id=env["AZURE_CLIENT_ID"],
            tenant_id=env["AZURE_TENANT_ID"],
            authority=env.get("AZURE_AUTHORITY_HOST") or cls.authority,
        )

    async def __call__(self) -> str:
        if self._token and time.time() < self._expires - _RENEW_BEFORE:
            return self._token
        token, lifetime = await asyncio.to_thread(self._exchange)
        learn(token)  # masked in whatever the run writes from now on
        self._token, self._expires = token, time.time() + lifetime
        return token

    def _exchange(self) -> tuple[str, float]:
        with open(self.token_file, encoding="utf-8") as file:
            assertion = file.read().strip()
        form = urllib.parse.urlencode(
            {
                "grant_type": "client_credentials",
                "client_id": self.client_id,
                "client_assertion_type": _ASSERTION_TYPE,
                "client_assertion": assertion,
                "scope": self.scope,
            }
        ).encode()
        url = f"{self.authority.rstrip('/')}/{self.tenant_id}/oauth2/v2.0/token"
        request = urllib.request.Request(url, data=form, method="POST")
        request.add_header("Content-Type", "application/x-www-form-urlencoded")
        with urllib.request.urlopen(request, timeout=30) as answer:
            body = json.load(answer)
        return str(body["access_token"]), float(body.get("expires_in", 3600))
