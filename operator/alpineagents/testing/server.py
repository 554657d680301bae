"""A scripted stand-in for the Anthropic Messages API, served over real HTTP.

The server speaks enough of the Messages API (``POST /v1/messages``, streaming and not,
and ``POST /v1/messages/count_tokens``) for the unmodified ``anthropic`` client to talk
to it: point the client at :attr:`ModelServer.url` (``base_url=`` or
``ANTHROPIC_BASE_URL``). Each model request consumes the next turn of a *script*
(:mod:`.script`)::

    with ModelServer([reply("I'll look", tool_use("read", {"path": "a.txt"})),
                      error(529),
                      reply("Done.")]) as server:
        client = anthropic.Anthropic(base_url=server.url, api_key="test")
        ...

When the script runs out the server answers 500 ``api_error`` ("script exhausted"),
unless ``echo=True``, in which case the echo model answers (:mod:`.echo`), or
``respond=fn``, in which case ``fn(request_body)`` returns the turn (for long runs whose
answers are computed, not listed; it is called one request at a time, under the server's
lock, so it must not call the server's methods).

It bills like the API (:mod:`.billing`), unless ``billing=False``:

- Prompt caching. ``cache_control`` breakpoints (``{"type": "ephemeral"}``, ``"ttl":
  "5m"`` or ``"1h"``) on tool definitions, system blocks and message content blocks, and
  the request's top-level ``cache_control`` (on the last cacheable block), at most 4 and
  no ``1h`` after a ``5m``, else the API's 400. For each breakpoint the longest live
  cached prefix at it or up to 20 blocks before it is read; every breakpoint past that is
  written if its prefix has at least ``min_cacheable_tokens`` (1024 by default). Entries
  live 5 minutes (or 1 hour) from their last write or read, on ``clock``
  (``time.monotonic``; pass a fake clock to jump past a TTL).
- ``usage`` carries the API's four numbers (``input_tokens``,
  ``cache_creation_input_tokens``, ``cache_read_input_tokens``, ``output_tokens``) and
  ``cache_creation`` by TTL, in ``message_start`` and ``message_delta`` too when
  streaming. With ``billing=False`` it is just ``input_tokens`` (the whole prompt) and
  ``output_tokens``, and ``cache_control`` is ignored.
- :attr:`ModelServer.bill` sums what was charged (a :class:`~.billing.Bill`).

Tokens are counted as :func:`.billing.count_tokens` does (about 4 characters of JSON a
token). A prompt of more than ``window`` tokens (200,000 by default; ``None`` for no
limit) gets the API's 400 "prompt is too long: N tokens > 200000 maximum" and does not
use a turn; ``count_tokens`` answers the prompt's size.

With ``limits=RateLimits(...)`` it limits like the API (:mod:`.rate_limits`): requests,
uncached input tokens and output tokens (``max_tokens`` reserved, the unused part given
back) a minute, as token buckets on ``clock``. A model request that finds no room gets
the API's 429 ``rate_limit_error`` with ``retry-after`` and ``retry-after-ms``, is
recorded in :attr:`~ModelServer.requests` and uses no turn; every answer to a model
request carries the ``anthropic-ratelimit-*`` headers. Without ``limits`` (the default)
nothing is limited and no such headers are sent. :attr:`~ModelServer.rate_limited` counts
the limiter's 429s; :attr:`~ModelServer.answers` has each answer's time and status.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import logging
import math
import os
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self
from urllib.parse import urlsplit

from . import wire
from .billing import (
    DEFAULT_MIN_CACHEABLE_TOKENS,
    Bill,
    Prompt,
    PromptCache,
    PromptRefused,
    Usage,
    count_tokens,
    prompt_too_long,
)
from .echo import echo_reply
from .rate_limits import Admission, Outcome, RateLimiter, RateLimits, Refusal
from .script import Drop, Failure, Hold, Reply, Turn, as_answer

__all__ = ["ModelServer", "RecordedRequest"]

_log = logging.getLogger("alpineagents.testing")

# The SDK treats a zero retry hint as "no hint" and falls back to its own backoff
# (about a second); 1 ms keeps "retry at once" fast while still being a hint.
_MIN_RETRY_AFTER_MS = 1
# How often a held answer looks at whether its client went away or the server stops.
_HOLD_CHECK_SECONDS = 0.05
# How often serve_forever looks for shutdown(); stop() waits up to this long.
_SHUTDOWN_POLL_SECONDS = 0.05


@dataclass(frozen=True)
class RecordedRequest:
    """One request the server received: its path (no query), headers (lower-case
    names) and decoded JSON body."""

    path: str
    headers: Mapping[str, str]
    body: Mapping[str, Any]

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream", False))


@dataclass(frozen=True)
class _Admitted:
    """A model request that passed the API's checks: its prompt read for caching (None
    with billing off) and its size in tokens."""

    prompt: Prompt | None
    tokens: int


class ModelServer:
    """The scripted Messages API on a loopback port, in a background thread.

    ``ModelServer(script, echo=False, respond=None, window=200_000,
    min_cacheable_tokens=1024, billing=True, clock=time.monotonic, limits=None)``; use as
    a context manager or call :meth:`start` / :meth:`stop`. Thread-safe: tests may
    :meth:`add` turns, read :attr:`requests` and :attr:`bill` and :meth:`release` holds
    while clients are talking to it. See the module docstring for billing, the window and
    rate limits.
    """

    def __init__(
        self,
        script: Iterable[Turn] | None = None,
        *,
        echo: bool = False,
        respond: Callable[[Mapping[str, Any]], Turn] | None = None,
        window: int | None = 200_000,
        min_cacheable_tokens: int = DEFAULT_MIN_CACHEABLE_TOKENS,
        billing: bool = True,
        clock: Callable[[], float] = time.monotonic,
        limits: RateLimits | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        if echo and respond is not None:
            raise ValueError("ModelServer: pass echo=True or respond=..., not both")
        if window is not None and (
            isinstance(window, bool) or not isinstance(window, int) or window < 1
        ):
            raise ValueError(
                f"ModelServer: window must be a positive number of tokens or None, got {window!r}"
            )
        self.echo = echo
        self.respond = respond
        self.window = window
        self.billing = billing
        self.limits = limits
        self._clock = clock
        self._limiter = RateLimiter(limits, clock=clock) if limits is not None else None
        self._rate_limited = 0
        self._answers: list[Outcome] = []
        self._cache = PromptCache(min_cacheable_tokens=min_cacheable_tokens, clock=clock)
        self._bill = Bill()
        self._address = (host, port)
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._script: deque[Reply | Failure | Drop | Hold] = deque()
        self._scripted = 0
        self._requests: list[RecordedRequest] = []
        self._token_count_requests: list[RecordedRequest] = []
        self._held: list[threading.Event] = []
        self._stopping = threading.Event()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.add(*(script or ()))

    # lifecycle

    def start(self) -> Self:
        """Bind the port and start serving; returns ``self``."""
        if self._httpd is not None:
            raise RuntimeError("ModelServer already started")
        self._stopping.clear()
        httpd = _HTTPServer(self._address, self)
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": _SHUTDOWN_POLL_SECONDS},
            name=f"model-server-{httpd.server_port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving: held and delayed answers end by closing their connection, open
        connections are closed, and every handler thread has finished when this returns."""
        httpd = self._httpd
        if httpd is None:
            return
        self._stopping.set()
        httpd.shutdown()
        httpd.close_connections()
        httpd.server_close()  # joins the handler threads
        if self._thread is not None:
            self._thread.join()
        self._httpd = None
        self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # where to find it

    @property
    def url(self) -> str:
        """Base URL for the client, e.g. ``http://127.0.0.1:41234``."""
        if self._httpd is None:
            raise RuntimeError("ModelServer is not started")
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def env(self) -> dict[str, str]:
        """Environment for a child process's ``anthropic`` client: ``ANTHROPIC_BASE_URL``
        and a dummy ``ANTHROPIC_API_KEY``."""
        return {"ANTHROPIC_BASE_URL": self.url, "ANTHROPIC_API_KEY": "scripted-model-key"}

    @contextlib.contextmanager
    def in_environment(self) -> Iterator[None]:
        """Point this process's ``anthropic`` clients at the server (:attr:`env`, and no
        ``ANTHROPIC_AUTH_TOKEN``) while the block runs; the variables are put back after."""
        names = (*self.env, "ANTHROPIC_AUTH_TOKEN")
        saved = {name: os.environ.get(name) for name in names}
        os.environ.pop("ANTHROPIC_AUTH_TOKEN", None)
        os.environ.update(self.env)
        try:
            yield
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value

    # the script

    def add(self, *turns: Turn) -> None:
        """Append turns to the script (also while serving)."""
        answers = [as_answer(t) for t in turns]
        with self._lock:
            self._script.extend(answers)
            self._scripted += len(answers)

    @property
    def turns_left(self) -> int:
        """Scripted turns not yet consumed."""
        with self._lock:
            return len(self._script)

    # what arrived

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every model request (``POST /v1/messages``) so far, in arrival order (a copy).

        Includes requests answered with errors, malformed ones and ones past the end of
        the script."""
        with self._lock:
            return list(self._requests)

    @property
    def rate_limited(self) -> int:
        """How many model requests the rate limits refused (a scripted 429 is not counted)."""
        with self._lock:
            return self._rate_limited

    @property
    def answers(self) -> list[Outcome]:
        """How each model request was answered, in the order the status lines went out (a
        copy): :class:`~.rate_limits.Outcome` ``(at, status, rate_limited)``, ``at`` on
        ``clock``. A request dropped before any byte, or cut short by :meth:`stop` while
        held or delayed, has none."""
        with self._lock:
            return list(self._answers)

    @property
    def token_count_requests(self) -> list[RecordedRequest]:
        """Every ``POST /v1/messages/count_tokens`` request so far (a copy)."""
        with self._lock:
            return list(self._token_count_requests)

    def wait_for_requests(self, n: int, timeout: float = 120.0) -> list[RecordedRequest]:
        """Block until at least ``n`` model requests arrived; return them all.

        Raises ``TimeoutError`` if they have not arrived within ``timeout`` seconds. The
        default is generous on purpose: a child process that makes the request may need
        many seconds just to start on a busy machine. A held request counts as soon as it
        arrives."""
        with self._arrived:
            if not self._arrived.wait_for(lambda: len(self._requests) >= n, timeout):
                raise TimeoutError(
                    f"expected {n} model requests within {timeout}s, got {len(self._requests)}"
                )
            return list(self._requests)

    def release(self) -> int:
        """Let every request currently held by a :func:`hold` turn get its answer.

        Returns how many were released. Holds that arrive later stay held."""
        with self._lock:
            held, self._held = self._held, []
        for event in held:
            event.set()
        return len(held)

    # the bill

    @property
    def bill(self) -> Bill:
        """What the requests answered with a reply were charged, summed (a snapshot)."""
        with self._lock:
            return self._bill

    def reset_bill(self) -> Bill:
        """Start a new bill (the cache stays as it is); returns the one that ends."""
        with self._lock:
            ended, self._bill = self._bill, Bill()
            return ended

    # called by the handler threads

    def _take_turn(
        self, recorded: RecordedRequest
    ) -> tuple[int, Turn | None, threading.Event | None]:
        with self._lock:
            self._requests.append(recorded)
            number = len(self._requests)
            turn: Turn | None = self._script.popleft() if self._script else None
            if turn is None and self.respond is not None:
                # Under the lock: a responder with state sees one request at a time, and
                # a hold it returns is registered before anyone can see the request.
                turn = self._responded(recorded.body)
            released: threading.Event | None = None
            if isinstance(turn, Hold):
                released = threading.Event()
                self._held.append(released)
            self._arrived.notify_all()
            return number, turn, released

    def _record_refused(self, recorded: RecordedRequest, *, rate_limited: bool = False) -> None:
        with self._lock:
            self._requests.append(recorded)
            if rate_limited:
                self._rate_limited += 1
            self._arrived.notify_all()

    def _record_token_count(self, recorded: RecordedRequest) -> None:
        with self._lock:
            self._token_count_requests.append(recorded)

    def _admit(self, body: Mapping[str, Any], *, whole: bool) -> _Admitted | str:
        """The request read for billing, or the API's refusal of it; ``whole`` says a
        model request (the window applies), not a token count."""
        try:
            prompt = Prompt(body) if self.billing else None
        except PromptRefused as refusal:
            return str(refusal)
        tokens = prompt.total_tokens if prompt is not None else count_tokens(body)
        if whole and self.window is not None and tokens > self.window:
            return prompt_too_long(tokens, self.window)
        return _Admitted(prompt, tokens)

    def _limit(self, admitted: _Admitted, max_tokens: int) -> Admission | Refusal | None:
        """Take the request's share of the rate limits (None: no limits)."""
        if self._limiter is None:
            return None
        if admitted.prompt is None:
            uncached = admitted.tokens
        else:
            # What the cache holds now; a request charged meanwhile may change it a little,
            # as the API's own estimate may be off.
            usage = self._cache.quote(admitted.prompt)
            uncached = usage.input_tokens + usage.cache_creation_input_tokens
        return self._limiter.admit(uncached, max_tokens)

    def _settle(self, admission: Admission | None, output_tokens: int) -> None:
        if self._limiter is not None and admission is not None:
            self._limiter.settle(admission, output_tokens)

    def _answered(self, status: int, rate_limited: bool) -> dict[str, str]:
        """Note a model request's answer; returns the rate-limit headers it carries."""
        with self._lock:
            self._answers.append(Outcome(self._clock(), status, rate_limited))
        return self._limiter.headers() if self._limiter is not None else {}

    def _charge(self, admitted: _Admitted, output_tokens: int) -> dict[str, Any]:
        """Bill one reply; returns the input half of its ``usage``."""
        if admitted.prompt is not None:
            usage = self._cache.charge(admitted.prompt)
        else:
            usage = Usage(input_tokens=admitted.tokens)
        with self._lock:
            self._bill = self._bill.plus(usage, output_tokens)
        return self._usage_fields(usage)

    def _quote(self, admitted: _Admitted) -> dict[str, Any]:
        """The input half of ``usage`` for an answer that is not billed (a broken stream)."""
        if admitted.prompt is None:
            return self._usage_fields(Usage(input_tokens=admitted.tokens))
        return self._usage_fields(self._cache.quote(admitted.prompt))

    def _usage_fields(self, usage: Usage) -> dict[str, Any]:
        return usage.as_api() if self.billing else {"input_tokens": usage.input_tokens}

    def _responded(self, body: Mapping[str, Any]) -> Turn:
        """The responder's turn, or a 500 naming what it raised."""
        assert self.respond is not None
        try:
            return as_answer(self.respond(body))
        except Exception as exc:
            _log.exception("model server: respond raised")
            return Failure(status=500, message=f"respond raised {exc!r}")

    def _exhausted_failure(self, number: int) -> Failure:
        with self._lock:
            scripted = self._scripted
        return Failure(
            status=500,
            message=(
                f"model script exhausted: request #{number} has no scripted turn "
                f"(the script had {scripted}); add turns with ModelServer.add() "
                "or use echo=True or respond=..."
            ),
        )


class _HTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = True  # server_close() joins the handler threads

    def __init__(self, address: tuple[str, int], model: ModelServer) -> None:
        self.model = model
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__(address, _Handler)

    def track(self, connection: socket.socket, open_: bool) -> None:
        with self._connections_lock:
            if open_:
                self._connections.add(connection)
            else:
                self._connections.discard(connection)

    def close_connections(self) -> None:
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
    server: _HTTPServer
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
        admitted = model._admit(recorded.body, whole=whole) if problem is None else problem
        if not whole:
            model._record_token_count(recorded)
            if isinstance(admitted, str):
                self._send_error(400, "invalid_request_error", admitted)
            else:
                self._send_json(200, {"input_tokens": admitted.tokens})
            return
        if isinstance(admitted, str):
            # Refused before the model sees it, as the API does: no turn is used.
            model._record_refused(recorded)
            self._send_error(400, "invalid_request_error", admitted)
            return
        admission = model._limit(admitted, recorded.body["max_tokens"])
        if isinstance(admission, Refusal):
            model._record_refused(recorded, rate_limited=True)
            self._rate_limited = True
            self._send_failure(Failure(429, admission.message, retry_after=admission.retry_after))
            return
        try:
            self._take_and_answer(recorded, admitted, admission)
        finally:
            # An answer that was no reply (a failure, a drop, a hold or delay cut short)
            # gives back the whole output reservation; a reply has settled already.
            model._settle(admission, 0)

    def _take_and_answer(
        self, recorded: RecordedRequest, admitted: _Admitted, admission: Admission | None
    ) -> None:
        model = self.server.model
        number, turn, released = model._take_turn(recorded)
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
            answer = echo_reply(recorded.body) if model.echo else model._exhausted_failure(number)
        _log.info("model request #%d: %s", number, type(answer).__name__.lower())
        if answer.delay > 0 and model._stopping.wait(answer.delay):
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
        admitted: _Admitted,
        admission: Admission | None,
        answer: Reply | Failure | Drop,
    ) -> None:
        model = self.server.model
        if isinstance(answer, Failure):
            if answer.in_stream and recorded.stream:
                self._stream_failure(recorded, model._quote(admitted), answer)
            else:
                self._send_failure(answer)
        elif isinstance(answer, Drop):
            if recorded.stream:
                self._start_stream()
                start = wire.message_start(recorded.body, model._quote(admitted))
                self._send_event("message_start", start)
            # Without the terminating chunk (or any response) the client sees a broken body.
            self.close_connection = True
        else:
            content = wire.content_blocks(answer)
            output_tokens = wire.count_output_tokens(content)
            usage = model._charge(admitted, output_tokens)
            if recorded.stream:
                try:
                    self._stream_reply(recorded, answer, content, usage)
                finally:  # the reservation holds while the reply streams
                    model._settle(admission, output_tokens)
            else:
                # Before the headers go out, so they show the reply's own count.
                model._settle(admission, output_tokens)
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
            recorded.body, answer, content, usage, cumulative=self.server.model.billing
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
            for name, value in self.server.model._answered(status, self._rate_limited).items():
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
        stopping = self.server.model._stopping
        while not released.wait(_HOLD_CHECK_SECONDS):
            if stopping.is_set() or _client_gone(self.connection):
                return False
        return True


def _client_gone(connection: socket.socket) -> bool:
    readable, _, _ = select.select([connection], [], [], 0)
    if not readable:
        return False
    try:
        # Clients do not pipeline, so a readable socket with no data is a closed one.
        return connection.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True
