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
lock, so it must not wait on the server, e.g. with ``wait_for_requests``; reading
``bill`` is fine).

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
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import TracebackType
from typing import Any, Self

from .billing import DEFAULT_MIN_CACHEABLE_TOKENS, Bill
from .messages_http import MessagesHTTPServer
from .rate_limits import Outcome, RateLimits
from .script import Turn
from .scripted_model import RecordedRequest, ScriptedModel

__all__ = ["ModelServer", "RecordedRequest"]

# How often serve_forever looks for shutdown(); stop() waits up to this long.
_SHUTDOWN_POLL_SECONDS = 0.05


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
        self._model = ScriptedModel(
            self, min_cacheable_tokens=min_cacheable_tokens, clock=clock, limits=limits
        )
        self._address = (host, port)
        self._stopping = threading.Event()
        self._httpd: MessagesHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.add(*(script or ()))

    # lifecycle

    def start(self) -> Self:
        """Bind the port and start serving; returns ``self``."""
        if self._httpd is not None:
            raise RuntimeError("ModelServer already started")
        self._stopping.clear()
        httpd = MessagesHTTPServer(self._address, self._model, self._stopping)
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
        self._model.add(*turns)

    @property
    def turns_left(self) -> int:
        """Scripted turns not yet consumed."""
        return self._model.turns_left

    # what arrived

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every model request (``POST /v1/messages``) so far, in arrival order (a copy).

        Includes requests answered with errors, malformed ones and ones past the end of
        the script."""
        return self._model.requests

    @property
    def rate_limited(self) -> int:
        """How many model requests the rate limits refused (a scripted 429 is not counted)."""
        return self._model.rate_limited

    @property
    def answers(self) -> list[Outcome]:
        """How each model request was answered, in the order the status lines went out (a
        copy): :class:`~.rate_limits.Outcome` ``(at, status, rate_limited)``, ``at`` on
        ``clock``. A request dropped before any byte, or cut short by :meth:`stop` while
        held or delayed, has none."""
        return self._model.answers

    @property
    def token_count_requests(self) -> list[RecordedRequest]:
        """Every ``POST /v1/messages/count_tokens`` request so far (a copy)."""
        return self._model.token_count_requests

    def wait_for_requests(self, n: int, timeout: float = 120.0) -> list[RecordedRequest]:
        """Block until at least ``n`` model requests arrived; return them all.

        Raises ``TimeoutError`` if they have not arrived within ``timeout`` seconds. The
        default is generous on purpose: a child process that makes the request may need
        many seconds just to start on a busy machine. A held request counts as soon as it
        arrives."""
        return self._model.wait_for_requests(n, timeout)

    def release(self) -> int:
        """Let every request currently held by a :func:`hold` turn get its answer.

        Returns how many were released. Holds that arrive later stay held."""
        return self._model.release()

    # the bill

    @property
    def bill(self) -> Bill:
        """What the requests answered with a reply were charged, summed (a snapshot); also
        readable from inside ``respond``."""
        return self._model.bill

    def reset_bill(self) -> Bill:
        """Start a new bill (the cache stays as it is); returns the one that ends."""
        return self._model.reset_bill()
