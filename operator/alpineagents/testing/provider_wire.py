"""A cloud provider's wire in front of the scripted Messages API (:class:`ProviderServer`).

Bedrock, Vertex AI and Foundry serve the same Messages API under their own paths, framing
and authentication. A :class:`ProviderServer` listens on loopback, checks each request's
credentials the way its provider does (refusing it as the provider would), and hands the
Messages API request to a :class:`~alpineagents.testing.ModelServer` over loopback HTTP:
its script, billing, prompt caching, rate limits, failures, drops and holds are the same
whichever provider the client speaks to. The answer goes back in the provider's framing
(``answer_stream`` re-frames a streamed reply, as Bedrock's event stream does).

Subclasses: :mod:`.bedrock_wire`, :mod:`.vertex_wire`, :mod:`.foundry_wire`.
"""

from __future__ import annotations

import http.client
import http.server
import json
import socket
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self
from urllib.parse import urlsplit

from .server import ModelServer

__all__ = ["QUOTE", "ProviderRequest", "ProviderServer", "Upstream"]

_CHUNK = 65536


@dataclass(frozen=True)
class ProviderRequest:
    """A request as the provider's endpoint received it."""

    method: str
    path: str
    query: str
    headers: Mapping[str, str]
    """Lower-case names."""
    body: bytes
    host: str
    """The Host header, as the client signed it."""

    def json(self) -> Any:
        try:
            return json.loads(self.body) if self.body else None
        except ValueError:
            return None


@dataclass
class Upstream:
    """The scripted Messages API's answer to a forwarded request."""

    status: int
    headers: Mapping[str, str]
    response: http.client.HTTPResponse

    def events(self) -> Iterator[tuple[str, bytes]]:
        """A streamed reply's Server-Sent Events as ``(event, data)``; raises
        ``http.client.IncompleteRead`` (or ``OSError``) when the upstream dropped it."""
        event, data = "", b""
        while True:
            line = self.response.readline()
            if not line:
                if event or data:
                    raise http.client.IncompleteRead(data)
                return
            line = line.rstrip(b"\r\n")
            if not line:
                if event or data:
                    yield event, data
                event, data = "", b""
            elif line.startswith(b"event:"):
                event = line[6:].strip().decode()
            elif line.startswith(b"data:"):
                data += line[5:].strip()

    def body(self) -> bytes:
        return self.response.read()


class ProviderServer:
    """A provider's endpoint on a loopback port, answering from ``model``.

    Subclasses implement :meth:`handle`; :attr:`refused` lists why requests were refused
    (authentication failures), for tests to assert on.
    """

    name = "provider"

    def __init__(self, model: ModelServer | None, *, host: str = "127.0.0.1") -> None:
        self.model = model
        self.refused: list[str] = []
        self.quotes_requests = False
        """When set, every error answer quotes the request's headers in its JSON body, as a
        careless proxy's error page does: what secret masking must hold against."""
        self._address = (host, 0)
        self._httpd: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # lifecycle

    def start(self) -> Self:
        handler = type("_Handler", (_Handler,), {"provider": self})
        httpd = http.server.ThreadingHTTPServer(self._address, handler)
        httpd.daemon_threads = True
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"{self.name}-wire-{httpd.server_port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is None:
            return
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join()
        self._httpd = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def url(self) -> str:
        if self._httpd is None:
            raise RuntimeError(f"{type(self).__name__} is not started")
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    # what subclasses use

    def handle(self, request: ProviderRequest, answer: _Handler) -> None:
        raise NotImplementedError

    def refuse(self, why: str) -> None:
        with self._lock:
            self.refused.append(why)

    def forward(
        self, body: Mapping[str, Any], headers: Mapping[str, str] | None = None
    ) -> Upstream:
        """Ask the scripted Messages API (``POST /v1/messages``) with ``body`` (and
        ``headers`` passed along)."""
        if self.model is None:
            raise RuntimeError(f"{type(self).__name__} has no model server behind it")
        target = urlsplit(self.model.url)
        connection = http.client.HTTPConnection(target.hostname or "", target.port, timeout=600)
        data = json.dumps(body).encode()
        connection.request(
            "POST",
            "/v1/messages",
            body=data,
            headers={
                **(headers or {}),
                "content-type": "application/json",
                "x-api-key": "scripted-model-key",
            },
        )
        response = connection.getresponse()
        headers = {k.lower(): v for k, v in response.getheaders()}
        return Upstream(response.status, headers, response)


class _Handler(http.server.BaseHTTPRequestHandler):
    provider: ProviderServer
    received: ProviderRequest | None = None
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return None

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length > 0 else b""
        if len(body) < length:
            # The client went away mid-request (a process killed while it sent): a cloud
            # never sees the request whole, so it neither answers nor refuses it.
            self.close_connection = True
            return
        parts = urlsplit(self.path)
        request = ProviderRequest(
            method=self.command,
            path=parts.path,
            query=parts.query,
            headers={k.lower(): v for k, v in self.headers.items()},
            body=body,
            host=self.headers.get("host", ""),
        )
        self.received = request
        try:
            self.provider.handle(request, self)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    # answers

    def send_body(
        self,
        status: int,
        data: bytes,
        content_type: str = "application/json",
        headers: Mapping[str, str] | None = None,
    ) -> None:
        if status >= 400 and self.provider.quotes_requests and self.received is not None:
            data = _quoting(data, self.received)
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def send_json(
        self, status: int, payload: object, headers: Mapping[str, str] | None = None
    ) -> None:
        self.send_body(status, json.dumps(payload).encode(), headers=headers)

    def start_chunks(self, content_type: str, headers: Mapping[str, str] | None = None) -> None:
        self.send_response(200)
        self.send_header("content-type", content_type)
        self.send_header("transfer-encoding", "chunked")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.flush()

    def chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def end_chunks(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def drop(self) -> None:
        """End the connection with the answer unfinished (as the upstream did)."""
        self.close_connection = True
        with _quiet():
            self.connection.shutdown(socket.SHUT_RDWR)

    def pass_through(self, upstream: Upstream, headers: Mapping[str, str] | None = None) -> None:
        """Send the upstream's answer as it is (a streamed one chunk by chunk)."""
        kept = {
            k: v
            for k, v in upstream.headers.items()
            if k not in ("content-length", "transfer-encoding", "connection", "content-type")
        }
        kept.update(headers or {})
        content_type = upstream.headers.get("content-type", "application/json")
        try:
            if "text/event-stream" not in content_type:
                self.send_body(upstream.status, upstream.body(), content_type, kept)
                return
            self.start_chunks(content_type, kept)
            while True:
                data = upstream.response.read1(_CHUNK)
                if not data:
                    break
                self.chunk(data)
        except (http.client.HTTPException, OSError):
            self.drop()
            return
        if upstream.response.chunked and upstream.response.chunk_left is not None:
            self.drop()  # the upstream ended the body without its last chunk
            return
        self.end_chunks()


QUOTE = "; the request was: "
"""What an error's message says before the request's headers it quotes."""


def _quoting(data: bytes, request: ProviderRequest) -> bytes:
    """An error body whose message also quotes ``request``'s headers (credentials and all)."""
    try:
        payload = json.loads(data)
    except ValueError:
        payload = None
    if not isinstance(payload, dict):
        payload = {"message": data.decode(errors="replace")}
    quote = QUOTE + json.dumps(dict(request.headers))
    detail = payload.get("error")
    if isinstance(detail, dict):  # the Messages API's, Vertex AI's, Foundry's shape
        detail["message"] = str(detail.get("message", "")) + quote
    elif isinstance(detail, str):  # an OAuth-style error
        payload["error"] = detail + quote
    else:  # Bedrock's {"message": ...}
        payload["message"] = str(payload.get("message", "")) + quote
    return json.dumps(payload).encode()


class _quiet:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return True
