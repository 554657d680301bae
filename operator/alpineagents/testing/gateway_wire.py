"""A gateway in front of the scripted Messages API (LiteLLM, Portkey, an Envoy AI gateway).

:class:`GatewayServer` serves ``POST /v1/messages`` for a request carrying each of its
``required`` headers with the expected value (a gateway's own key, from a Secret), and
refuses anything else with 401 as such gateways do. It passes the request on with its
headers (the gateway's route, the client's own key swapped for the upstream's), and the
answer back as it came, streamed or not.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from typing import Any

from .provider_wire import ProviderRequest, ProviderServer, _Handler

__all__ = ["GatewayServer"]

# Not passed on: how this hop was framed, and the client's key (the gateway holds its own).
_HOP_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "x-api-key", "authorization"}
)


class GatewayServer(ProviderServer):
    """A gateway answering from ``model`` to requests that carry ``required`` headers."""

    name = "gateway"

    def __init__(self, model: Any, required: Mapping[str, str], *, host: str = "127.0.0.1") -> None:
        super().__init__(model, host=host)
        self.required = {name.lower(): value for name, value in required.items()}

    def handle(self, request: ProviderRequest, answer: _Handler) -> None:
        if request.method != "POST" or request.path != "/v1/messages":
            answer.send_json(404, {"error": f"{request.method} {request.path} is not served"})
            return
        for name, value in self.required.items():
            if not hmac.compare_digest(request.headers.get(name, ""), value):
                self.refuse(f"gateway: no valid {name}")
                answer.send_json(401, {"error": f"missing or wrong {name}"})
                return
        body = request.json()
        passed = {k: v for k, v in request.headers.items() if k not in _HOP_HEADERS}
        answer.pass_through(self.forward(body if isinstance(body, dict) else {}, passed))
