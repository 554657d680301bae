"""The Messages API over HTTP for a :class:`~.server.ModelServer`: the routes
(``POST /v1/messages``, streaming and not, and ``POST /v1/messages/count_tokens``), the
answers as the API writes them (JSON, server-sent events, errors with ``retry-after``),
held and delayed answers, and connections closed on stop. What each request is answered
is the :class:`~.scripted_model.ScriptedModel`'s."""

from __future__ import annotations

import contextlib
import http.server
import json
import logging
import math
import select
import socket
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from . import wire
from .echo import echo_reply
from .rate_limits import Admission, Refusal
from .script import Drop, Failure, Hold, Reply, as_answer
from .scripted_model import Admitted, RecordedRequest, ScriptedModel

__all__ = ["MessagesHTTPServer"]

_log = logging.getLogger("alpineagents.testing")

# The SDK treats a zero retry hint as "no hint" and falls back to its own backoff
# (about a second); 1 ms keeps "retry at once" fast while still being a hint.
_MIN_RETRY_AFTER_MS = 1
# How often a held answer looks at whether its client went away or the server stops.
_HOLD_CHECK_SECONDS = 0.05


class MessagesHTTPServer(http.server.ThreadingHTTPServer):
    """The Messages API's routes for ``model``, on ``address``; ``stopping`` set ends
    held and delayed answers."""

    daemon_threads = True
    block_on_close = True  # server_close() joins the handler threads

    def __init__(
        self, address: tuple[str, int], model: ScriptedModel, stopping: threading.Event
    ) -> None:
        self.model = model
        self.stopping = stopping
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__(address, _Handler)

    def track(self, connection: socket.socket, open_: bool) -> None:
        """Note a connection opened (or closed), so that :meth:`close_connections` finds it."""
        with self._connections_lock:
            if open_:
                self._connections.add(connection)
            else:
                self._connections.discard(connection)

    def close_connections(self) -> None:
        """Wake every open connection's handler, so that ``server_close()`` can join it."""
        # Keep-alive handlers sit in readline() waiting for a next request; a shutdown
        # wakes them so server_close() can join them.
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        _log.exception("model server: error while handling a request from %s", client_address)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "alpineagents-scripted-model"
    server: MessagesHTTPServer
    # Per request (a keep-alive connection serves several): whether the answer is to a
    # model request, which carries rate-limit headers and is counted in answers.
    _model_request = False
    _rate_limited = False

    def setup(self) -> None:
        super().setup()
        self.server.track(self.connection, True)

    def finish(self) -> None:
        self.server.track(self.connection, False)
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        _log.debug("model server: " + format, *args)

    # routing

    def do_GET(self) -> None:
        self._model_request = False
        self._send_error(404, "not_found_error", f"{self.command} {self.path} is not served")

    def do_POST(self) -> None:
        path = urlsplit(self.path).path
        self._model_request, self._rate_limited = path == "/v1/messages", False
        raw = self._read_body()
        headers = {k.lower(): v for k, v in self.headers.items()}
        try:
            body = json.loads(raw) if raw else None
        except (json.JSONDecodeError, UnicodeDecodeError):
            body = None
        if path not in ("/v1/messages", "/v1/messages/count_tokens"):
            self._send_error(404, "not_found_error", f"POST {path} is not served")
            return
        recorded = RecordedRequest(
            path=path, headers=headers, body=body if isinstance(body, dict) else {}
        )
        model = self.server.model
        whole = path == "/v1/messages"
        problem = wire.request_problem(body, path)
        admitted = model.admit(recorded.body, whole=whole) if problem is None else problem
        if not whole:
            model.record_token_count(recorded)
            if isinstance(admitted, str):
                self._send_error(400, "invalid_request_error", admitted)
            else:
                self._send_json(200, {"input_tokens": admitted.tokens})
            return
        if isinstance(admitted, str):
            # Refused before the model sees it, as the API does: no turn is used.
            model.record_refused(recorded)
            self._send_error(400, "invalid_request_error", admitted)
            return
        admission = model.limit(admitted, recorded.body["max_tokens"])
        if isinstance(admission, Refusal):
            model.record_refused(recorded, rate_limited=True)
            self._rate_limited = True
            self._send_failure(Failure(429, admission.message, retry_after=admission.retry_after))
            return
        try:
            self._take_and_answer(recorded, admitted, admission)
        finally:
            # An answer that was no reply (a failure, a drop, a hold or delay cut short)
            # gives back the whole output reservation; a reply has settled already.
            model.settle(admission, 0)

    def _take_and_answer(
        self, recorded: RecordedRequest, admitted: Admitted, admission: Admission | None
    ) -> None:
        model = self.server.model
        number, turn, released = model.take_turn(recorded)
        answer = as_answer(turn) if turn is not None else None
        if isinstance(answer, Hold):
            assert released is not None
            _log.info("model request #%d: held", number)
            if not self._wait_for_release(released):
                _log.info("model request #%d: hold ended without release", number)
                self.close_connection = True
                return
            answer = answer.then
        if answer is None:
            answer = (
                echo_reply(recorded.body)
                if model.settings.echo
                else model.exhausted_failure(number)
            )
        _log.info("model request #%d: %s", number, type(answer).__name__.lower())
        if answer.delay > 0 and self.server.stopping.wait(answer.delay):
            self.close_connection = True
            return
        try:
            self._answer(recorded, admitted, admission, answer)
        except (BrokenPipeError, ConnectionResetError):
            # The client went away mid-answer; nothing left to tell it.
            self.close_connection = True

    # answers

    def _answer(
        self,
        recorded: RecordedRequest,
        admitted: Admitted,
        admission: Admission | None,
        answer: Reply | Failure | Drop,
    ) -> None:
        model = self.server.model
        if isinstance(answer, Failure):
            if answer.in_stream and recorded.stream:
                self._stream_failure(recorded, model.quote(admitted), answer)
            else:
                self._send_failure(answer)
        elif isinstance(answer, Drop):
            if recorded.stream:
                self._start_stream()
                start = wire.message_start(recorded.body, model.quote(admitted))
                self._send_event("message_start", start)
            # Without the terminating chunk (or any response) the client sees a broken body.
            self.close_connection = True
        else:
            content = wire.content_blocks(answer)
            output_tokens = wire.count_output_tokens(content)
            usage = model.charge(admitted, output_tokens)
            if recorded.stream:
                try:
                    self._stream_reply(recorded, answer, content, usage)
                finally:  # the reservation holds while the reply streams
                    model.settle(admission, output_tokens)
            else:
                # Before the headers go out, so they show the reply's own count.
                model.settle(admission, output_tokens)
                message = wire.message(recorded.body, answer, content, usage)
                self._send_json(200, message, wire.request_id_header())

    def _stream_reply(
        self,
        recorded: RecordedRequest,
        answer: Reply,
        content: list[dict[str, Any]],
        usage: dict[str, Any],
    ) -> None:
        self._start_stream()
        events = wire.reply_events(
            recorded.body, answer, content, usage, cumulative=self.server.model.settings.billing
        )
        for event, data in events:
            self._send_event(event, data)
        self._end_stream()

    def _stream_failure(
        self, recorded: RecordedRequest, usage: dict[str, Any], failure: Failure
    ) -> None:
        self._start_stream()
        self._send_event("message_start", wire.message_start(recorded.body, usage))
        self._send_event("ping", {"type": "ping"})
        self._send_event("error", wire.error_body(failure.error_type, failure.message))
        self._end_stream()

    def _send_failure(self, failure: Failure) -> None:
        headers = wire.request_id_header()
        if failure.retry_after is not None:
            ms = max(_MIN_RETRY_AFTER_MS, round(failure.retry_after * 1000))
            headers["retry-after"] = str(math.ceil(failure.retry_after))
            headers["retry-after-ms"] = str(ms)
        self._send_json(
            failure.status, wire.error_body(failure.error_type, failure.message), headers
        )

    def _send_error(self, status: int, error_type: str, message: str) -> None:
        self._send_json(status, wire.error_body(error_type, message), wire.request_id_header())

    # wire

    def _read_body(self) -> bytes:
        length = int(self.headers.get("content-length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _send_json(
        self, status: int, payload: object, headers: Mapping[str, str] | None = None
    ) -> None:
        data = json.dumps(payload).encode("utf-8")
        self._status_line(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def _status_line(self, status: int) -> None:
        self.send_response(status)
        if self._model_request:
            for name, value in self.server.model.answered(status, self._rate_limited).items():
                self.send_header(name, value)

    def _start_stream(self) -> None:
        self._status_line(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        for name, value in wire.request_id_header().items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.flush()

    def _send_event(self, event: str, data: object) -> None:
        chunk = f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()
        self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        self.wfile.flush()

    def _end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _wait_for_release(self, released: threading.Event) -> bool:
        stopping = self.server.stopping
        while not released.wait(_HOLD_CHECK_SECONDS):
            if stopping.is_set() or _client_gone(self.connection):
                return False
        return True


def _client_gone(connection: socket.socket) -> bool:
    # poll, not select: a busy server's descriptors pass 1024, which select refuses.
    poller = select.poll()
    poller.register(connection, select.POLLIN)
    if not poller.poll(0):
        return False
    try:
        # Clients do not pipeline, so a readable socket with no data is a closed one.
        return connection.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True
