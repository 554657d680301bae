"""Google Vertex AI's wire over the scripted Messages API, and a local metadata server.

:class:`VertexServer` serves ``POST /v1/projects/{project}/locations/{region}/publishers/
anthropic/models/{model}:rawPredict`` and ``:streamRawPredict`` and accepts only a bearer
token its :class:`MetadataServer` (or :class:`OAuthServer`) issued and that has not expired (else 401
``UNAUTHENTICATED``, as Google answers). A 429 goes back as Google's
``RESOURCE_EXHAUSTED``; the rest of the Messages API's answers pass as they are.

:class:`MetadataServer` is the GKE metadata server Workload Identity answers from: the
ping, the project id, the service account and its access token, each only with the
``Metadata-Flavor: Google`` header. google-auth finds it by ``GCE_METADATA_HOST`` and
``GCE_METADATA_IP`` (:meth:`MetadataServer.env`). :class:`OAuthServer` is Google's token
endpoint for a service account key given instead (the JWT-bearer grant, the assertion's
signature checked).
"""

from __future__ import annotations

import json
import secrets
import time
import urllib.parse
from typing import Any

from .provider_wire import ProviderRequest, ProviderServer, _Handler

__all__ = ["MetadataServer", "OAuthServer", "VertexServer"]

_FLAVOR = {"metadata-flavor": "Google"}
_JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
_GOOGLE_TOKEN_URI = "https://oauth2.googleapis.com/token"


class MetadataServer(ProviderServer):
    """The metadata server of a GKE node with Workload Identity, on loopback."""

    name = "metadata"

    def __init__(
        self,
        project_id: str,
        service_account: str,
        *,
        token_lifetime: int = 3600,
        host: str = "127.0.0.1",
    ) -> None:
        super().__init__(None, host=host)
        self.project_id = project_id
        self.service_account = service_account
        self.token_lifetime = token_lifetime
        self.tokens: dict[str, float] = {}
        """Each access token issued, with the time it expires."""

    def env(self) -> dict[str, str]:
        """Where google-auth looks for the metadata server."""
        host = self.url.removeprefix("http://")
        return {"GCE_METADATA_HOST": host, "GCE_METADATA_IP": host}

    def handle(self, request: ProviderRequest, answer: _Handler) -> None:
        if request.headers.get("metadata-flavor") != "Google":
            self.refuse("metadata: no Metadata-Flavor header")
            answer.send_body(403, b"Missing Metadata-Flavor:Google header.", "text/html")
            return
        path = request.path
        base = "/computeMetadata/v1/"
        accounts = base + "instance/service-accounts/"
        if path in ("", "/"):
            answer.send_body(200, b"computeMetadata/\n", "application/text", _FLAVOR)
        elif path == base + "project/project-id":
            answer.send_body(200, self.project_id.encode(), "application/text", _FLAVOR)
        elif path == base + "universe/universe-domain":
            answer.send_body(200, b"googleapis.com", "application/text", _FLAVOR)
        elif path.startswith(accounts) and path.endswith("/token"):
            token = "ya29.local-" + secrets.token_urlsafe(32)
            with self._lock:
                self.tokens[token] = time.time() + self.token_lifetime
            body = {
                "access_token": token,
                "expires_in": self.token_lifetime,
                "token_type": "Bearer",
            }
            answer.send_body(200, json.dumps(body).encode(), "application/json", _FLAVOR)
        elif path.startswith(accounts) and path.rstrip("/").count("/") == 5:
            info = {
                "aliases": ["default"],
                "email": self.service_account,
                "scopes": ["https://www.googleapis.com/auth/cloud-platform"],
            }
            answer.send_body(200, json.dumps(info).encode(), "application/json", _FLAVOR)
        elif path.startswith(accounts) and path.endswith("/email"):
            answer.send_body(200, self.service_account.encode(), "application/text", _FLAVOR)
        else:
            answer.send_body(404, b"not found", "text/html", _FLAVOR)

    def valid(self, token: str) -> bool:
        with self._lock:
            expires = self.tokens.get(token)
        return expires is not None and expires > time.time()


class OAuthServer(ProviderServer):
    """Google's OAuth 2.0 token endpoint for service account keys (a key's ``token_uri``):
    the JWT-bearer grant, its assertion verified with the public half of a key it made
    (:meth:`service_account_key`). A :class:`VertexServer` takes the tokens it issues."""

    name = "oauth"

    def __init__(self, project_id: str, *, host: str = "127.0.0.1") -> None:
        super().__init__(None, host=host)
        self.project_id = project_id
        self.tokens: dict[str, float] = {}
        """Each access token issued, with the time it expires."""
        self._public_keys: dict[str, str] = {}

    def service_account_key(self, email: str) -> str:
        """A new key of service account ``email``: its JSON, as Google hands it out, with
        this endpoint as its ``token_uri``."""
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        private = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode()
        public = (
            key.public_key()
            .public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
            .decode()
        )
        with self._lock:
            self._public_keys[email] = public
        info = {
            "type": "service_account",
            "project_id": self.project_id,
            "private_key_id": secrets.token_hex(20),
            "private_key": private,
            "client_email": email,
            "client_id": str(secrets.randbelow(10**20)),
            "token_uri": self.url + "/token",
        }
        return json.dumps(info, indent=2)

    def handle(self, request: ProviderRequest, answer: _Handler) -> None:
        from google.auth import jwt

        if request.method != "POST" or request.path != "/token":
            answer.send_json(404, {"error": "not_found"})
            return
        form = dict(urllib.parse.parse_qsl(request.body.decode()))
        if form.get("grant_type") != _JWT_BEARER:
            answer.send_json(400, {"error": "unsupported_grant_type"})
            return
        assertion = form.get("assertion", "")
        try:
            claims = jwt.decode(assertion, verify=False)  # type: ignore[no-untyped-call]
            issuer = claims.get("iss", "")
            with self._lock:
                public = self._public_keys[issuer]
            # google-auth names Google's endpoint as the audience whatever the token_uri.
            audience = [_GOOGLE_TOKEN_URI, self.url + "/token"]
            jwt.decode(assertion, certs=public, audience=audience)  # type: ignore[no-untyped-call]
        except (ValueError, KeyError):
            self.refuse("oauth: an assertion not signed by a key of this endpoint")
            answer.send_json(400, {"error": "invalid_grant", "error_description": "Invalid JWT"})
            return
        token = "ya29.sa-" + secrets.token_urlsafe(32)
        with self._lock:
            self.tokens[token] = time.time() + 3600
        answer.send_json(200, {"access_token": token, "expires_in": 3600, "token_type": "Bearer"})

    def valid(self, token: str) -> bool:
        with self._lock:
            expires = self.tokens.get(token)
        return expires is not None and expires > time.time()


class VertexServer(ProviderServer):
    """Vertex AI's ``rawPredict`` and ``streamRawPredict`` for Claude in ``project_id`` and
    ``region``, for tokens ``metadata`` issued, answered by ``model``."""

    name = "vertex"

    def __init__(
        self,
        model: Any,
        metadata: MetadataServer | OAuthServer,
        region: str,
        *,
        host: str = "127.0.0.1",
    ) -> None:
        super().__init__(model, host=host)
        self.metadata = metadata
        self.region = region
        self.model_ids: list[str] = []

    @property
    def base_url(self) -> str:
        """The client's ``base_url`` (the API's version is part of it, as Google's is)."""
        return self.url + "/v1"

    def handle(self, request: ProviderRequest, answer: _Handler) -> None:
        prefix = (
            f"/v1/projects/{self.metadata.project_id}/locations/{self.region}"
            f"/publishers/anthropic/models/"
        )
        path = urllib.parse.unquote(request.path)
        if request.method != "POST" or not path.startswith(prefix) or ":" not in path:
            _google_error(answer, 404, "NOT_FOUND", f"{request.method} {path} is not served")
            return
        model_id, _, method = path[len(prefix) :].rpartition(":")
        if method not in ("rawPredict", "streamRawPredict"):
            _google_error(answer, 404, "NOT_FOUND", f"unknown method {method}")
            return
        token = request.headers.get("authorization", "").removeprefix("Bearer ")
        if not self.metadata.valid(token):
            self.refuse("vertex: no valid access token")
            _google_error(
                answer, 401, "UNAUTHENTICATED", "Request had invalid authentication credentials."
            )
            return
        body = request.json()
        if not isinstance(body, dict) or "anthropic_version" not in body or "model" in body:
            _google_error(
                answer,
                400,
                "INVALID_ARGUMENT",
                "anthropic_version is required, model is not allowed",
            )
            return
        with self._lock:
            self.model_ids.append(model_id)
        forwarded = {k: v for k, v in body.items() if k != "anthropic_version"}
        forwarded["model"] = model_id
        if method == "streamRawPredict":
            forwarded["stream"] = True
        upstream = self.forward(forwarded)
        if upstream.status == 429:
            upstream.body()
            _google_error(
                answer, 429, "RESOURCE_EXHAUSTED", "Quota exceeded for aiplatform.googleapis.com"
            )
            return
        answer.pass_through(upstream)


def _google_error(answer: _Handler, code: int, status: str, message: str) -> None:
    answer.send_json(code, {"error": {"code": code, "message": message, "status": status}})
