"""A run on a shared key waits for capacity instead of failing (issue: a fleet on one key).

The real ``anthropic`` client against the scripted Messages API, limited like the real one
where a test needs limits; the shared limiter as its real HTTP service on loopback. Where
time matters, the server's clock and the pacer's are one fake clock that the pacer's
sleeps move: no test waits for real seconds it could miss on a busy machine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest

from alpineagents import Agent, FileStore, Message, State
from alpineagents.model import Retry
from alpineagents.pacing import HeaderPacer, SharedPacer, Throttle, key_fingerprint
from alpineagents.pacing.limiter import KeyLimits, Limiter
from alpineagents.testing import ModelServer, RateLimits, error, reply, tool_use
from alpineagents.tools import tool
from tests.bench.pacer import FakeClock, Service


@tool
def look(topic: str) -> str:
    """Looks something up.

    Args:
        topic: what to look up
    """
    return f"notes on {topic}"


def _agent(tmp_path: Path, server: ModelServer, **options: Any) -> Agent:
    client = anthropic.AsyncAnthropic(base_url=server.url, api_key="shared-key", max_retries=0)
    return Agent("claude-sonnet-5", FileStore(tmp_path), tools=[look], client=client, **options)


def test_a_429_and_a_529_are_waits_never_a_failed_step(tmp_path: Path) -> None:
    refusals = [error(429, retry_after=0), error(529), error(529)] * 3
    with ModelServer([*refusals, reply("Done.")]) as server:
        waits: list[Throttle] = []
        agent = _agent(
            tmp_path,
            server,
            retry=Retry(attempts=2),  # more refusals than attempts: none of them counts
            pacer=HeaderPacer(first_delay=0.001, max_delay=0.01),
            on_throttle=lambda state, throttle: waits.append(throttle),
        )
        state = State("fleet-1", [Message.user("Go.")])
        assert agent.run(state) == "Done."
        assert len(server.requests) == len(refusals) + 1
    saved = FileStore(tmp_path).load("fleet-1")
    assert [e.kind for e in saved.history].count("model_error") == 0
    assert saved.stopped == "answered"
    assert [w.limit for w in waits] == ["requests", "overloaded", "overloaded"] * 3
    assert all(w.refused for w in waits)


def test_a_wait_bounded_by_retry_max_wait_raises_the_refusal(tmp_path: Path) -> None:
    with ModelServer([error(429, retry_after=0)]) as server:
        agent = _agent(tmp_path, server, retry=Retry(max_wait=0))
        with pytest.raises(anthropic.RateLimitError):
            agent.run(State("bounded", [Message.user("Go.")]))


def test_a_run_paced_by_the_headers_sends_no_request_the_limit_refuses(tmp_path: Path) -> None:
    clock = FakeClock()
    limits = RateLimits(requests_per_minute=60, burst_seconds=1)
    turns = [reply("Looking.", tool_use("look", {"topic": t})) for t in ("a", "b", "c")]
    with ModelServer([*turns, reply("Done.")], limits=limits, clock=clock) as server:
        waits: list[Throttle] = []
        agent = _agent(
            tmp_path,
            server,
            pacer=HeaderPacer(clock=clock, sleep=clock.sleep),
            on_throttle=lambda state, throttle: waits.append(throttle),
        )
        assert agent.run(State("paced", [Message.user("Look up three things.")])) == "Done."
        assert server.rate_limited == 0
        assert len(server.requests) == 4
    # Each request after the first waited for the bucket (1 a second), before sending.
    assert [w.limit for w in waits] == ["requests"] * 3
    assert not any(w.refused for w in waits)


# ---------------------------------------------------------------------- the shared limiter
@pytest.fixture
def limiter_service() -> Iterator[Service]:
    service = Service(Limiter(KeyLimits(requests_per_minute=6000)))
    yield service
    service.close()


def test_a_fleet_on_the_shared_limiter_all_answer_and_its_metrics_count_them(
    tmp_path: Path, limiter_service: Service
) -> None:
    with ModelServer(echo=True, limits=RateLimits(requests_per_minute=6000)) as server:

        async def fleet() -> list[str | None]:
            agents = [
                _agent(
                    tmp_path / f"run-{i}",
                    server,
                    pacer=SharedPacer(
                        limiter_service.url,
                        key=key_fingerprint("shared-key"),
                        run=f"run-{i}",
                        namespace="team-a" if i % 2 else "team-b",
                    ),
                )
                for i in range(6)
            ]
            return await asyncio.gather(
                *(
                    a.arun(State(f"run-{i}", [Message.user('use look {"topic": "x"}')]))
                    for i, a in enumerate(agents)
                )
            )

        answers = asyncio.run(fleet())
        assert all(answer and answer.startswith("look returned") for answer in answers)
        assert server.rate_limited == 0
    metrics = limiter_service.get("/metrics")
    assert 'alpineagents_pacing_granted_total{namespace="team-a"} 6' in metrics
    assert 'alpineagents_pacing_granted_total{namespace="team-b"} 6' in metrics
    assert limiter_service.get("/v1/waiting") == []


def test_a_limiter_that_cannot_be_reached_costs_politeness_not_the_run(tmp_path: Path) -> None:
    with ModelServer([reply("Done.")]) as server:
        pacer = SharedPacer("http://127.0.0.1:9", key="k", run="alone")  # the discard port: refused
        agent = _agent(tmp_path, server, pacer=pacer)
        assert agent.run(State("alone", [Message.user("Go.")])) == "Done."


def test_the_shared_line_goes_by_share_then_priority_then_age() -> None:
    clock = FakeClock()
    limiter = Limiter(KeyLimits(requests_per_minute=60), burst_seconds=1, headroom=1, clock=clock)
    for run, namespace, priority in [
        ("a-old", "team-a", 0),
        ("a-new", "team-a", 0),
        ("a-urgent", "team-a", 5),
        ("b-1", "team-b", 0),
    ]:
        limiter.ask("key", run, namespace, priority, {"requests": 1})
        clock.now += 1
    # team-a's three and team-b's one: team-a's urgent run first, then team-b's (its share),
    # then team-a's in order of age.
    order = []
    while len(order) < 4:
        order += [grant.run for grant in limiter.grants()]
        clock.now += 1
    assert order == ["a-urgent", "b-1", "a-old", "a-new"]


def test_two_shares_weighted_one_to_one_get_equal_turns_however_many_runs_each_has() -> None:
    clock = FakeClock()
    limiter = Limiter(KeyLimits(requests_per_minute=60), burst_seconds=1, headroom=1, clock=clock)
    runs = {f"a-{i}": "team-a" for i in range(9)} | {f"b-{i}": "team-b" for i in range(3)}
    for run, namespace in runs.items():
        limiter.ask("key", run, namespace, 0, {"requests": 1})
    served = {"team-a": 0, "team-b": 0}
    for _ in range(30):
        clock.now += 1
        for grant in limiter.grants():
            served[runs[grant.run]] += 1
            limiter.ask("key", grant.run, runs[grant.run], 0, {"requests": 1})  # its next request
    assert served == {"team-a": 15, "team-b": 15}


def test_a_run_whose_pod_was_replaced_keeps_its_place_in_line() -> None:
    clock = FakeClock()
    limiter = Limiter(KeyLimits(requests_per_minute=60), burst_seconds=1, headroom=1, clock=clock)
    limiter.ask("key", "first", "ns", 0, {"requests": 1})
    clock.now += 0.5
    limiter.ask("key", "second", "ns", 0, {"requests": 1})
    limiter.away("first")  # its pod is gone mid-wait...
    clock.now += 0.2
    assert [w.run for w in limiter.waiting()] == ["first", "second"]
    limiter.ask("key", "first", "ns", 0, {"requests": 1})  # ...and its next pod asks again
    clock.now += 1
    assert [g.run for g in limiter.grants()] == ["first"]


def test_a_key_whose_limits_are_not_known_goes_one_request_at_a_time_until_they_are() -> None:
    clock = FakeClock()
    limiter = Limiter(clock=clock)
    for run in ("a", "b", "c"):
        limiter.ask("key", run, "ns", 0, {"requests": 1})
    (probe,) = limiter.grants()
    assert limiter.grants() == []
    from alpineagents.pacing import RateSignals

    signals = RateSignals.from_headers(
        {
            "anthropic-ratelimit-requests-limit": "120",
            "anthropic-ratelimit-requests-remaining": "119",
            "anthropic-ratelimit-requests-reset": "2026-12-06T00:00:00Z",
        }
    )
    limiter.done(probe.ticket, {"input_tokens": 10, "output_tokens": 5}, signals)
    # The learned bucket holds about a second of the limit (at 95 % of it): b now, c next.
    assert [g.run for g in limiter.grants()] == ["b"]
    clock.now += 1
    assert [g.run for g in limiter.grants()] == ["c"]


def test_a_refusal_after_a_turn_holds_the_whole_key_back_for_its_retry_after() -> None:
    from alpineagents.pacing import RateSignals

    clock = FakeClock()
    limiter = Limiter(KeyLimits(requests_per_minute=600), burst_seconds=1, headroom=1, clock=clock)
    for run in ("a", "b"):
        limiter.ask("key", run, "ns", 0, {"requests": 1})
    clock.now += 1
    first, _ = limiter.grants()
    # Another client of the key spent it: the provider refuses a, for 5 s.
    limiter.done(first.ticket, None, RateSignals(retry_after=5.0), refused="requests")
    limiter.ask("key", "c", "ns", 0, {"requests": 1})
    limiter.ask("key", "a", "ns", 0, {"requests": 1})  # after c, yet before it in line
    clock.now += 4.9
    assert limiter.grants() == []
    assert {w.limit for w in limiter.waiting()} == {"requests"}
    clock.now += 0.2
    assert [g.run for g in limiter.grants()] == ["a", "c"]  # a kept its place


def test_a_key_whose_answers_carry_no_limits_is_not_held_one_request_at_a_time() -> None:
    from alpineagents.pacing import RateSignals

    clock = FakeClock()
    limiter = Limiter(clock=clock)
    for run in ("a", "b", "c"):
        limiter.ask("key", run, "ns", 0, {"requests": 1})
    (probe,) = limiter.grants()
    limiter.done(probe.ticket, {"output_tokens": 5}, RateSignals())  # a gateway: no headers
    assert sorted(g.run for g in limiter.grants()) == ["b", "c"]


def test_a_probe_whose_run_never_reports_is_given_up_and_another_goes() -> None:
    clock = FakeClock()
    limiter = Limiter(clock=clock)
    for run in ("a", "b"):
        limiter.ask("key", run, "ns", 0, {"requests": 1})
    assert [g.run for g in limiter.grants()] == ["a"]  # a's pod dies with its turn
    clock.advance(29)
    assert limiter.grants() == []
    clock.advance(2)
    assert [g.run for g in limiter.grants()] == ["b"]


def test_an_overload_in_the_middle_of_a_streamed_reply_is_a_wait_too(tmp_path: Path) -> None:
    with ModelServer([error(529, in_stream=True), reply("Done.")]) as server:
        waits: list[Throttle] = []
        agent = _agent(
            tmp_path,
            server,
            max_tokens=8192,  # streamed
            retry=Retry(attempts=1),
            pacer=HeaderPacer(first_delay=0.001, max_delay=0.01),
            on_throttle=lambda state, throttle: waits.append(throttle),
        )
        assert agent.run(State("streamed", [Message.user("Go.")])) == "Done."
    assert [w.limit for w in waits] == ["overloaded"]


def test_limits_learned_from_the_answers_follow_them_and_go_when_they_do() -> None:
    from alpineagents.pacing import RateSignals

    def limit(per_minute: int) -> RateSignals:
        return RateSignals.from_headers(
            {
                "anthropic-ratelimit-requests-limit": str(per_minute),
                "anthropic-ratelimit-requests-remaining": "0",
            }
        )

    clock = FakeClock()
    limiter = Limiter(clock=clock, burst_seconds=1, headroom=1)
    used = {"input_tokens": 1, "output_tokens": 1}

    def one_round(signals: RateSignals) -> list[str]:
        for run in ("a", "b", "c"):
            limiter.ask("key", run, "ns", 0, {"requests": 1})
        granted = limiter.grants()
        for grant in granted:
            limiter.done(grant.ticket, used, signals)
        return [g.run for g in granted]

    assert one_round(limit(60)) == ["a"]  # the probe, which tells 60 a minute
    clock.advance(1)
    assert one_round(limit(60)) == ["b"]  # one a second
    clock.advance(1)
    assert one_round(limit(180)) == ["c"]  # an answer tells the key's limit was raised
    clock.advance(1)
    assert len(one_round(RateSignals())) == 3  # 3 a second; then no limits reported
    assert len(one_round(RateSignals())) == 3  # gone: nobody waits
