"""Azure AI Foundry's wire over the scripted Messages API, and a local Entra token endpoint.

:class:`FoundryServer` serves ``POST /anthropic/v1/messages`` (the Messages API as Foundry
hosts it) for a request carrying its key (``x-api-key`` or ``api-key``) or a bearer token
its :class:`EntraServer` issued; anything else gets 401, as Foundry answers.

:class:`EntraServer` is Microsoft Entra's token endpoint for workload identity: OAuth 2.0's
client credentials grant with the pod's federated token as the client assertion
(``POST /{tenant}/oauth2/v2.0/token``). Point ``AZURE_AUTHORITY_HOST`` at it
(:meth:`EntraServer.env`).
"""

from __future__ import annotations

import hmac
import secrets
import time
import urllib.parse
from typing import Any

from .provider_wire import ProviderRequest, ProviderServer, _Handler

__all__ = ["EntraServer", "FoundryServer"]

_ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"


class EntraServer(ProviderServer):
    """Entra's token endpoint for ``tenant_id``: access tokens for ``client_id`` to whoever
    shows ``federated_token``."""

    name = "entra"

    def __init__(
        self, tenant_id: str, client_id: str, federated_token: str, *, host: str = "127.0.0.1"
    ) -> None:
        super().__init__(None, host=host)
        self.tenant_id = tenant_id
        self.client_id = client_id
        self.federated_token = federated_token
        self.tokens: dict[str, float] = {}
        """Each access token issued, with the time it expires."""
        self.scopes: list[str] = []

    def env(self, token_file: str) -> dict[str, str]:
        """The variables AKS's workload identity webhook sets (and this endpoint)."""
        return {
            "AZURE_CLIENT_ID": self.client_id,
            "AZURE_TENANT_ID": self.tenant_id,
            "AZURE_FEDERATED_TOKEN_FILE": token_file,
            "AZURE_AUTHORITY_HOST": self.url + "/",
        }

    def handle(self, request: ProviderRequest, answer: _Handler) -> None:
        if request.path != f"/{self.tenant_id}/oauth2/v2.0/token" or request.method != "POST":
            answer.send_json(404, {"error": "invalid_request"})
            return
        form = dict(urllib.parse.parse_qsl(request.body.decode()))
        good = (
            form.get("grant_type") == "client_credentials"
            and form.get("client_id") == self.client_id
            and form.get("client_assertion_type") == _ASSERTION_TYPE
            and hmac.compare_digest(form.get("client_assertion", ""), self.federated_token)
        )
        if not good:
            self.refuse("entra: wrong client or federated token")
            answer.send_json(401, {"error": "invalid_client"})
            return
        token = "eyJ0eXAiOiJKV1Qi.local-" + secrets.token_urlsafe(32)
        with self._lock:
            self.tokens[token] = time.time() + 3600
            self.scopes.append(form.get("scope", ""))
        answer.send_json(200, {"access_token": token, "expires_in": 3600, "token_type": "Bearer"})

    def valid(self, token: str) -> bool:
        with self._lock:
            expires = self.tokens.get(token)
        return expires is not None and expires > time.time()


class FoundryServer(ProviderServer):
    """A Foundry resource's ``/anthropic/v1/messages``, for ``api_key`` or for tokens
    ``entra`` issued, answered by ``model``."""

    name = "foundry"

    def __init__(
        self,
        model: Any,
        *,
        api_key: str,
        entra: EntraServer | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        super().__init__(model, host=host)
        self.api_key = api_key
        self.entra = entra
        self.auth: list[str] = []
        """How each accepted request authenticated: ``key`` or ``token``."""

    @property
    def base_url(self) -> str:
        """The client's ``base_url``, as ``https://<resource>.services.ai.azure.com/anthropic/``."""
        return self.url + "/anthropic/"

    def handle(self, request: ProviderRequest, answer: _Handler) -> None:
        if request.method != "POST" or request.path != "/anthropic/v1/messages":
            answer.send_json(404, {"error": {"code": "404", "message": "Resource not found"}})
            return
        how = self._authenticated(request)
        if how is None:
            self.refuse("foundry: no valid key or token")
            answer.send_json(
                401,
                {
                    "error": {
                        "code": "401",
                        "message": "Access denied due to invalid subscription key or wrong "
                        "API endpoint.",
                    }
                },
            )
            return
        body = request.json()
        with self._lock:
            self.auth.append(how)
        answer.pass_through(self.forward(body if isinstance(body, dict) else {}))

    def _authenticated(self, request: ProviderRequest) -> str | None:
        for header in ("x-api-key", "api-key"):
            given = request.headers.get(header)
            if given is not None and hmac.compare_digest(given, self.api_key):
                return "key"
        bearer = request.headers.get("authorization", "")
        token = bearer.removeprefix("Bearer ") if bearer.startswith("Bearer ") else ""
        if self.entra is not None and token and self.entra.valid(token):
            return "token"
        return None
