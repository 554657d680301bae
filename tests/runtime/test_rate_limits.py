"""The scripted model server rate-limits like the Messages API.

Requests, input tokens and output tokens a minute as token buckets, the 429 and its
``retry-after``, the ``anthropic-ratelimit-*`` headers on every answer, driven by the real
``anthropic`` client over loopback with a fake clock; then the CLI's flags and
:class:`~alpineagents.testing.rate_limits.RateLimiter` on its own.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import anthropic
import pytest

from alpineagents.testing import ModelServer, RateLimits, error, hold, reply
from alpineagents.testing.rate_limits import Admission, RateLimiter, Refusal
from tests.bench.clock import FakeClock
from tests.bench.pipes import read_line
from tests.paths import REPO

pytestmark = pytest.mark.bench_infra

MODEL = "claude-scripted"
HELLO = [{"role": "user", "content": "Hello"}]
WAIT = 120.0  # a safety net for a held answer or a child process on a loaded machine
LIMITS = ("requests", "input-tokens", "output-tokens", "tokens")
RFC3339_SECOND = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


@contextmanager
def limited(
    limits: RateLimits, *turns: Any, **options: Any
) -> Iterator[tuple[ModelServer, anthropic.Anthropic, FakeClock]]:
    """A server with ``limits`` on a fake clock (the echo model once the turns run out) and
    a client that does not retry."""
    clock = FakeClock()
    options.setdefault("echo", True)
    with (
        ModelServer(list(turns), clock=clock, limits=limits, **options) as server,
        anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0) as client,
    ):
        yield server, client, clock


def ask(client: anthropic.Anthropic, **overrides: Any) -> anthropic.types.Message:
    arguments: dict[str, Any] = {"model": MODEL, "max_tokens": 256, "messages": HELLO}
    arguments.update(overrides)
    return client.messages.create(**arguments)


def ask_raw(client: anthropic.Anthropic, **overrides: Any) -> Any:
    arguments: dict[str, Any] = {"model": MODEL, "max_tokens": 256, "messages": HELLO}
    arguments.update(overrides)
    return client.messages.with_raw_response.create(**arguments)


def said(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def remaining(headers: Any, limit: str) -> int:
    return int(headers[f"anthropic-ratelimit-{limit}-remaining"])


def error_body(refused: pytest.ExceptionInfo[anthropic.RateLimitError]) -> dict[str, str]:
    body = refused.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    error: dict[str, str] = body["error"]
    assert error["type"] == "rate_limit_error"
    return error


# --- requests a minute --------------------------------------------------------------


def test_requests_per_minute_refuses_past_the_burst_and_refills() -> None:
    limits = RateLimits(requests_per_minute=60, burst_seconds=2)
    with limited(limits, reply("one"), reply("two"), reply("three")) as (server, client, clock):
        assert ask(client).content[0].text == "one"  # type: ignore[union-attr]
        assert ask(client).content[0].text == "two"  # type: ignore[union-attr]
        with pytest.raises(anthropic.RateLimitError) as refused:
            ask(client)

        headers = refused.value.response.headers
        assert headers["retry-after"] == "1", "one request a second refills the bucket"
        assert headers["retry-after-ms"] == "1000"
        assert headers["anthropic-ratelimit-requests-limit"] == "60"
        assert headers["anthropic-ratelimit-requests-remaining"] == "0"
        assert "anthropic-ratelimit-tokens-limit" not in headers, "no token limit was set"
        message = error_body(refused)["message"]
        assert "rate limit of 60 requests per minute" in message
        assert server.turns_left == 1, "the refused request used no turn"
        assert len(server.requests) == 3, "the refused request is recorded"
        assert server.rate_limited == 1

        clock.advance(1)
        assert ask(client).content[0].text == "three"  # type: ignore[union-attr]
        with pytest.raises(anthropic.RateLimitError):
            ask(client)

    assert [(a.status, a.rate_limited) for a in server.answers] == [
        (200, False),
        (200, False),
        (429, True),
        (200, False),
        (429, True),
    ]
    assert [a.at for a in server.answers] == [1000.0, 1000.0, 1000.0, 1001.0, 1001.0]
    assert server.rate_limited == 2


def test_the_sdk_retries_a_rate_limit_after_retry_after() -> None:
    # Bursting with a real clock: the retry hint is honoured and the third request passes
    # once the bucket refills (about 50 ms at 1200 a minute).
    limits = RateLimits(requests_per_minute=1200, burst_seconds=0.05)
    with (
        ModelServer(echo=True, limits=limits) as server,
        anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=5) as client,
    ):
        for _ in range(3):
            assert ask(client).content[0].text == "Echo: Hello"  # type: ignore[union-attr]
    statuses = [a.status for a in server.answers]
    assert statuses.count(200) == 3
    assert server.rate_limited == statuses.count(429)


# --- headers ---------------------------------------------------------------------------


def test_every_answer_carries_the_rate_limit_headers() -> None:
    limits = RateLimits(
        requests_per_minute=60,
        input_tokens_per_minute=10_000,
        output_tokens_per_minute=2_000,
        burst_seconds=60,  # a bucket holds the whole minute, so its limit is its size
    )
    with limited(limits, window=1_000) as (server, client, _):
        before = datetime.now(UTC).replace(microsecond=0)
        raw = ask_raw(client)
        message = raw.parse()
        for name in LIMITS:
            for part in ("limit", "remaining", "reset"):
                assert f"anthropic-ratelimit-{name}-{part}" in raw.headers, (name, part)
        assert raw.headers["anthropic-ratelimit-requests-limit"] == "60"
        assert raw.headers["anthropic-ratelimit-input-tokens-limit"] == "10000"
        assert raw.headers["anthropic-ratelimit-output-tokens-limit"] == "2000"
        assert remaining(raw.headers, "requests") == 59
        assert remaining(raw.headers, "input-tokens") == 10_000 - message.usage.input_tokens
        # A non-streamed reply settles before its headers: only what it wrote is used.
        assert remaining(raw.headers, "output-tokens") == 2_000 - message.usage.output_tokens
        # The output bucket is the smaller, so it is the "most restrictive" one.
        assert raw.headers["anthropic-ratelimit-tokens-limit"] == "2000"
        assert remaining(raw.headers, "tokens") == remaining(raw.headers, "output-tokens")
        after_first = datetime.now(UTC)
        for name in LIMITS:
            reset = raw.headers[f"anthropic-ratelimit-{name}-reset"]
            assert RFC3339_SECOND.match(reset), reset
            # A bucket holds a minute here, so it is full again within one.
            when = datetime.strptime(reset, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
            assert before <= when <= after_first + timedelta(seconds=61), (name, reset)

        # A streamed reply's headers go out before it is written: the whole max_tokens
        # is reserved until the stream ends.
        streamed = ask_raw(client, stream=True, max_tokens=500)
        assert (
            remaining(streamed.headers, "output-tokens")
            == remaining(raw.headers, "output-tokens") - 500
        )
        events = list(streamed.parse())
        written = next(e.usage.output_tokens for e in events if e.type == "message_delta")
        after = ask_raw(client)
        assert remaining(after.headers, "output-tokens") == (
            remaining(raw.headers, "output-tokens") - written - after.parse().usage.output_tokens
        )

        # A 400 (over the window) is not rate-limited, and still carries the headers.
        with pytest.raises(anthropic.BadRequestError) as too_long:
            ask(client, messages=said("x" * 8_000))
        assert remaining(too_long.value.response.headers, "requests") == 57
    assert [a.status for a in server.answers] == [200, 200, 200, 400]
    assert server.rate_limited == 0


def test_without_limits_there_are_no_rate_limit_headers(
    model_server: ModelServer, model_client: anthropic.Anthropic
) -> None:
    model_server.add(reply("free"))

    raw = model_client.messages.with_raw_response.create(
        model=MODEL, max_tokens=256, messages=HELLO
    )

    assert not [name for name in raw.headers if name.startswith("anthropic-ratelimit-")]
    assert "retry-after" not in raw.headers
    assert [(a.status, a.rate_limited) for a in model_server.answers] == [(200, False)]
    assert model_server.rate_limited == 0


# --- input tokens ----------------------------------------------------------------------


def test_a_prompt_over_the_input_limit_is_refused_naming_it() -> None:
    limits = RateLimits(input_tokens_per_minute=1_000, burst_seconds=60)
    with limited(limits, reply("small")) as (server, client, clock):
        with pytest.raises(anthropic.RateLimitError) as refused:
            ask(client, messages=said("x" * 8_000))  # about 2,000 tokens
        message = error_body(refused)["message"]
        assert "rate limit of 1,000 input tokens per minute" in message
        assert "reduce the prompt length" in message
        assert server.turns_left == 1

        assert ask(client).content[0].text == "small"  # type: ignore[union-attr]

        # 600 tokens twice in a row: the second waits for the bucket to refill.
        clock.advance(60)
        ask(client, messages=said("y" * 2_400))
        with pytest.raises(anthropic.RateLimitError) as waiting:
            ask(client, messages=said("y" * 2_400))
        assert "input tokens per minute" in error_body(waiting)["message"]
        assert int(waiting.value.response.headers["retry-after"]) > 1
        clock.advance(int(waiting.value.response.headers["retry-after"]))
        ask(client, messages=said("y" * 2_400))
    assert server.rate_limited == 2


def test_cache_reads_do_not_count_against_the_input_limit() -> None:
    system = [{"type": "text", "text": "z" * 2_400, "cache_control": {"type": "ephemeral"}}]
    limits = RateLimits(input_tokens_per_minute=1_000, burst_seconds=60)
    with limited(limits, min_cacheable_tokens=50) as (server, client, _):
        first = ask(client, system=system)
        assert first.usage.cache_creation_input_tokens, "the first request writes the cache"

        # The same prompt again is more than what is left, but most of it is read.
        second = ask_raw(client, system=system)
        usage = second.parse().usage
        assert usage.cache_read_input_tokens > 1_000 - first.usage.cache_creation_input_tokens
        assert remaining(second.headers, "input-tokens") == (
            1_000
            - first.usage.input_tokens
            - first.usage.cache_creation_input_tokens
            - usage.input_tokens
            - usage.cache_creation_input_tokens
        )

        # Without the cache the same text is refused.
        with pytest.raises(anthropic.RateLimitError):
            ask(client, system=system[0]["text"])
    assert server.rate_limited == 1


# --- output tokens ---------------------------------------------------------------------


def test_max_tokens_over_the_output_limit_is_refused() -> None:
    limits = RateLimits(output_tokens_per_minute=1_000, burst_seconds=60)
    with limited(limits, reply("ok")) as (server, client, _):
        with pytest.raises(anthropic.RateLimitError) as refused:
            ask(client, max_tokens=2_000)
        message = error_body(refused)["message"]
        assert "rate limit of 1,000 output tokens per minute" in message
        assert "maximum tokens requested" in message
        assert server.turns_left == 1

        raw = ask_raw(client, max_tokens=900)
        assert remaining(raw.headers, "output-tokens") == 1_000 - raw.parse().usage.output_tokens


def test_the_output_reservation_holds_while_answering_and_is_refunded_after() -> None:
    limits = RateLimits(output_tokens_per_minute=1_000, burst_seconds=60)
    with (
        limited(limits, hold(reply("slow")), reply("after")) as (server, client, _),
        ThreadPoolExecutor(1) as pool,
    ):
        pending = pool.submit(ask, client, max_tokens=800)
        server.wait_for_requests(1, timeout=WAIT)
        with pytest.raises(anthropic.RateLimitError) as refused:
            ask(client, max_tokens=400)  # 200 left while 800 are reserved
        assert "output tokens per minute" in error_body(refused)["message"]
        assert remaining(refused.value.response.headers, "output-tokens") == 200

        server.release()
        slow = pending.result(timeout=WAIT)
        raw = ask_raw(client, max_tokens=400)
        assert raw.parse().content[0].text == "after"
        assert remaining(raw.headers, "output-tokens") == (
            1_000 - slow.usage.output_tokens - raw.parse().usage.output_tokens
        )
    assert server.rate_limited == 1


def test_a_failed_answer_refunds_its_whole_reservation() -> None:
    limits = RateLimits(output_tokens_per_minute=1_000, burst_seconds=60)
    with limited(limits, error(529), reply("ok")) as (_, client, _clock):
        with pytest.raises(anthropic.OverloadedError) as overloaded:
            ask(client, max_tokens=900)
        # The 529's headers go out before it settles; the next answer shows the refund.
        assert remaining(overloaded.value.response.headers, "output-tokens") == 100
        raw = ask_raw(client, max_tokens=900)
        assert remaining(raw.headers, "output-tokens") == 1_000 - raw.parse().usage.output_tokens


# --- the limits themselves -------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("requests_per_minute", 0),
        ("input_tokens_per_minute", -5),
        ("output_tokens_per_minute", 1.5),
        ("requests_per_minute", True),
        ("burst_seconds", 0),
        ("burst_seconds", float("nan")),
    ],
)
def test_bad_limits_raise_naming_the_field(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=field):
        RateLimits(**{field: value})


def test_the_limiter_takes_nothing_when_it_refuses() -> None:
    clock = FakeClock()
    limiter = RateLimiter(
        RateLimits(requests_per_minute=60, input_tokens_per_minute=600, burst_seconds=60),
        clock=clock,
    )

    refusal = limiter.admit(700, 1)
    assert isinstance(refusal, Refusal)
    assert (refusal.limit, refusal.too_large) == ("input_tokens", True)
    assert limiter.headers()["anthropic-ratelimit-requests-remaining"] == "60"

    admission = limiter.admit(500, 1)
    assert isinstance(admission, Admission)
    refusal = limiter.admit(300, 1)
    assert isinstance(refusal, Refusal)
    assert refusal.limit == "input_tokens"
    assert refusal.retry_after == pytest.approx(20.0), "200 more at 10 a second"
    assert limiter.headers()["anthropic-ratelimit-requests-remaining"] == "59"


def test_a_request_bigger_than_the_burst_waits_for_a_full_bucket() -> None:
    clock = FakeClock()
    # A 6-second bucket of 600 a minute holds 60 tokens; a 300-token prompt still passes
    # when the bucket is full, and leaves it in debt.
    limiter = RateLimiter(RateLimits(input_tokens_per_minute=600, burst_seconds=6), clock=clock)

    assert isinstance(limiter.admit(300, 1), Admission)
    refusal = limiter.admit(300, 1)
    assert isinstance(refusal, Refusal)
    assert not refusal.too_large
    assert refusal.retry_after == pytest.approx(30.0), "240 of debt and 60 to fill, at 10/s"
    assert limiter.headers()["anthropic-ratelimit-input-tokens-remaining"] == "0"
    clock.advance(30)
    assert isinstance(limiter.admit(300, 1), Admission)


def test_the_limit_that_frees_last_is_named() -> None:
    clock = FakeClock()
    # Buckets of one request (1 a second) and one output token (1 every 2 seconds).
    limiter = RateLimiter(
        RateLimits(requests_per_minute=60, output_tokens_per_minute=30, burst_seconds=1),
        clock=clock,
    )
    assert isinstance(limiter.admit(1, 1), Admission)

    refusal = limiter.admit(1, 1)
    assert isinstance(refusal, Refusal)
    assert refusal.limit == "output_tokens"
    assert refusal.retry_after == pytest.approx(2.0)
    clock.advance(1)
    refusal = limiter.admit(1, 1)
    assert isinstance(refusal, Refusal)
    assert refusal.limit == "output_tokens"
    assert refusal.retry_after == pytest.approx(1.0)
    clock.advance(1)
    assert isinstance(limiter.admit(1, 1), Admission)


def test_settling_twice_refunds_once() -> None:
    clock = FakeClock()
    limiter = RateLimiter(RateLimits(output_tokens_per_minute=1_000, burst_seconds=60), clock=clock)
    admission = limiter.admit(1, 600)
    assert isinstance(admission, Admission)
    refused = limiter.admit(1, 600)
    assert isinstance(refused, Refusal) and refused.limit == "output_tokens"

    limiter.settle(admission, 100)
    limiter.settle(admission, 0)

    assert limiter.headers()["anthropic-ratelimit-output-tokens-remaining"] == "900"
    assert limiter.headers()["anthropic-ratelimit-tokens-remaining"] == "900"


def test_reset_is_when_the_bucket_is_full_again() -> None:
    clock = FakeClock()
    wall = 1_800_000_000.0  # 2027-01-15T08:00:00Z
    limiter = RateLimiter(
        RateLimits(requests_per_minute=60, burst_seconds=10), clock=clock, wall=lambda: wall
    )
    assert limiter.headers()["anthropic-ratelimit-requests-reset"] == "2027-01-15T08:00:00Z"

    for _ in range(3):
        limiter.admit(0, 1)

    headers = limiter.headers()
    assert headers["anthropic-ratelimit-requests-remaining"] == "7"
    assert headers["anthropic-ratelimit-requests-reset"] == "2027-01-15T08:00:03Z"


# --- the CLI ---------------------------------------------------------------------------


def test_cli_rate_limit_flags() -> None:
    package_root = REPO / "operator"
    env = {**os.environ, "PYTHONPATH": str(package_root)}
    command = [sys.executable, "-m", "alpineagents.testing", "serve", "--port", "0", "--echo"]
    # One request a minute: the second, well within the minute, is refused.
    with subprocess.Popen(
        [*command, "--rpm", "1", "--itpm", "100000", "--otpm", "10000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    ) as process:
        try:
            assert process.stdout is not None
            url = read_line(process.stdout, WAIT).strip()
            with anthropic.Anthropic(base_url=url, api_key="k", max_retries=0) as client:
                first = ask_raw(client)
                assert first.headers["anthropic-ratelimit-requests-limit"] == "1"
                assert first.headers["anthropic-ratelimit-input-tokens-limit"] == "100000"
                with pytest.raises(anthropic.RateLimitError) as refused:
                    ask(client)
            assert int(refused.value.response.headers["retry-after"]) > 1
        finally:
            process.terminate()

    bad = subprocess.run(
        [*command, "--rpm", "0"], capture_output=True, text=True, env=env, timeout=60
    )
    assert bad.returncode == 2
    assert "requests_per_minute" in bad.stderr
