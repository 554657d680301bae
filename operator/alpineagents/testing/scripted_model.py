"""The model behind a :class:`~.server.ModelServer`: the script and the turns it hands
out (or the responder's, or the echo model's), what arrived, what it billed and how the
rate limits stand. Thread-safe: the server's HTTP handler threads ask it for each
request's answer while a test adds turns and reads what arrived."""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from .billing import Bill, Prompt, PromptCache, PromptRefused, Usage, count_tokens, prompt_too_long
from .rate_limits import Admission, Outcome, RateLimiter, RateLimits, Refusal
from .script import Drop, Failure, Hold, Reply, Turn, as_answer

__all__ = ["Admitted", "ModelSettings", "RecordedRequest", "ScriptedModel"]

_log = logging.getLogger("alpineagents.testing")


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
class Admitted:
    """A model request that passed the API's checks: its prompt read for caching (None
    with billing off) and its size in tokens."""

    prompt: Prompt | None
    tokens: int


class ModelSettings(Protocol):
    """The settings a ModelServer was made with (read at each request: set on the
    server, they apply from the next one)."""

    echo: bool
    respond: Callable[[Mapping[str, Any]], Turn] | None
    window: int | None
    billing: bool


class ScriptedModel:
    """The script, what arrived, the bill and the rate limits of one ModelServer."""

    def __init__(
        self,
        settings: ModelSettings,
        *,
        min_cacheable_tokens: int,
        clock: Callable[[], float],
        limits: RateLimits | None,
    ) -> None:
        self.settings = settings
        self._clock = clock
        self._limiter = RateLimiter(limits, clock=clock) if limits is not None else None
        self._rate_limited = 0
        self._answers: list[Outcome] = []
        self._cache = PromptCache(min_cacheable_tokens=min_cacheable_tokens, clock=clock)
        self._bill = Bill()
        # Reentrant: ``respond`` runs under it and may read the bill so far.
        self._lock = threading.RLock()
        self._arrived = threading.Condition(self._lock)
        self._script: deque[Reply | Failure | Drop | Hold] = deque()
        self._scripted = 0
        self._requests: list[RecordedRequest] = []
        self._token_count_requests: list[RecordedRequest] = []
        self._held: list[threading.Event] = []

    # ------------------------------------------------------------------ the script
    def add(self, *turns: Turn) -> None:
        """Append turns to the script."""
        answers = [as_answer(t) for t in turns]
        with self._lock:
            self._script.extend(answers)
            self._scripted += len(answers)

    @property
    def turns_left(self) -> int:
        """Scripted turns not yet consumed."""
        with self._lock:
            return len(self._script)

    def release(self) -> int:
        """Let every request held now get its answer; returns how many."""
        with self._lock:
            held, self._held = self._held, []
        for event in held:
            event.set()
        return len(held)

    # ------------------------------------------------------------------ what arrived
    @property
    def requests(self) -> list[RecordedRequest]:
        """Every model request so far, in arrival order (a copy)."""
        with self._lock:
            return list(self._requests)

    @property
    def rate_limited(self) -> int:
        """How many model requests the rate limits refused."""
        with self._lock:
            return self._rate_limited

    @property
    def answers(self) -> list[Outcome]:
        """How each model request was answered, in order (a copy)."""
        with self._lock:
            return list(self._answers)

    @property
    def token_count_requests(self) -> list[RecordedRequest]:
        """Every token-count request so far (a copy)."""
        with self._lock:
            return list(self._token_count_requests)

    def wait_for_requests(self, n: int, timeout: float) -> list[RecordedRequest]:
        """Block until at least ``n`` model requests arrived (``TimeoutError`` after
        ``timeout`` seconds); return them all."""
        with self._arrived:
            if not self._arrived.wait_for(lambda: len(self._requests) >= n, timeout):
                raise TimeoutError(
                    f"expected {n} model requests within {timeout}s, got {len(self._requests)}"
                )
            return list(self._requests)

    # ------------------------------------------------------------------ the bill
    @property
    def bill(self) -> Bill:
        """What the replies were charged, summed (a snapshot)."""
        with self._lock:
            return self._bill

    def reset_bill(self) -> Bill:
        """Start a new bill (the cache stays as it is); returns the one that ends."""
        with self._lock:
            ended, self._bill = self._bill, Bill()
            return ended

    # ------------------------------------------------------------------ one request
    def take_turn(
        self, recorded: RecordedRequest
    ) -> tuple[int, Turn | None, threading.Event | None]:
        """Record a model request and take its turn: its number, the turn (None when
        the script ran out), and the event that releases it when the turn is a hold."""
        with self._lock:
            self._requests.append(recorded)
            number = len(self._requests)
            turn: Turn | None = self._script.popleft() if self._script else None
            if turn is None and self.settings.respond is not None:
                # Under the lock: a responder with state sees one request at a time, and
                # a hold it returns is registered before anyone can see the request.
                turn = self._responded(self.settings.respond, recorded.body)
            released: threading.Event | None = None
            if isinstance(turn, Hold):
                released = threading.Event()
                self._held.append(released)
            self._arrived.notify_all()
            return number, turn, released

    def record_refused(self, recorded: RecordedRequest, *, rate_limited: bool = False) -> None:
        """Record a model request refused before the model saw it (no turn used)."""
        with self._lock:
            self._requests.append(recorded)
            if rate_limited:
                self._rate_limited += 1
            self._arrived.notify_all()

    def record_token_count(self, recorded: RecordedRequest) -> None:
        """Record a token-count request."""
        with self._lock:
            self._token_count_requests.append(recorded)

    def admit(self, body: Mapping[str, Any], *, whole: bool) -> Admitted | str:
        """The request read for billing, or the API's refusal of it; ``whole`` says a
        model request (the window applies), not a token count."""
        try:
            prompt = Prompt(body) if self.settings.billing else None
        except PromptRefused as refusal:
            return str(refusal)
        tokens = prompt.total_tokens if prompt is not None else count_tokens(body)
        window = self.settings.window
        if whole and window is not None and tokens > window:
            return prompt_too_long(tokens, window)
        return Admitted(prompt, tokens)

    def limit(self, admitted: Admitted, max_tokens: int) -> Admission | Refusal | None:
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

    def settle(self, admission: Admission | None, output_tokens: int) -> None:
        """Give back what a request reserved beyond the ``output_tokens`` it used."""
        if self._limiter is not None and admission is not None:
            self._limiter.settle(admission, output_tokens)

    def answered(self, status: int, rate_limited: bool) -> dict[str, str]:
        """Note a model request's answer; returns the rate-limit headers it carries."""
        with self._lock:
            self._answers.append(Outcome(self._clock(), status, rate_limited))
        return self._limiter.headers() if self._limiter is not None else {}

    def charge(self, admitted: Admitted, output_tokens: int) -> dict[str, Any]:
        """Bill one reply; returns the input half of its ``usage``."""
        if admitted.prompt is not None:
            usage = self._cache.charge(admitted.prompt)
        else:
            usage = Usage(input_tokens=admitted.tokens)
        with self._lock:
            self._bill = self._bill.plus(usage, output_tokens)
        return self._usage_fields(usage)

    def quote(self, admitted: Admitted) -> dict[str, Any]:
        """The input half of ``usage`` for an answer that is not billed (a broken stream)."""
        if admitted.prompt is None:
            return self._usage_fields(Usage(input_tokens=admitted.tokens))
        return self._usage_fields(self._cache.quote(admitted.prompt))

    def exhausted_failure(self, number: int) -> Failure:
        """The 500 of request ``number`` when the script ran out."""
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

    def _usage_fields(self, usage: Usage) -> dict[str, Any]:
        return usage.as_api() if self.settings.billing else {"input_tokens": usage.input_tokens}

    @staticmethod
    def _responded(respond: Callable[[Mapping[str, Any]], Turn], body: Mapping[str, Any]) -> Turn:
        """The responder's turn, or a 500 naming what it raised."""
        try:
            return as_answer(respond(body))
        except Exception as exc:
            _log.exception("model server: respond raised")
            return Failure(status=500, message=f"respond raised {exc!r}")
