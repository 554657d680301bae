"""A runner on a shared key: killed while it waits for its turn, its next process waits
on in the same place instead of sending (real runner processes, SIGKILL, the shared
limiter's real HTTP service on a fake clock the test moves)."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator

import pytest

from alpineagents.pacing.limiter import KeyLimits, Limiter
from alpineagents.testing import ModelServer, reply
from tests.bench.pacer import FakeClock, Service
from tests.bench.runner_process import DEADLINE, RunnerProcess, Workspace


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def limiter(clock: FakeClock) -> Iterator[Service]:
    # One request a second, none in the bucket at first: nobody's turn until the test says.
    service = Service(
        Limiter(KeyLimits(requests_per_minute=60), headroom=1, burst_seconds=1, clock=clock),
        poll_seconds=0.5,
    )
    yield service
    service.close()


def _line(runner: RunnerProcess, word: str) -> str:
    """The runner's next stderr line that holds ``word`` (its progress log, as it goes)."""
    assert runner.process.stderr is not None
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        line = runner.process.stderr.readline()
        if not line:
            raise AssertionError(f"the runner ended without a {word!r} line")
        if word in line:
            return line
    raise AssertionError(f"no {word!r} line within {DEADLINE}s")


def test_a_run_killed_while_it_waits_for_its_turn_resumes_waiting_not_sending(
    workspace: Workspace, model_server: ModelServer, limiter: Service, clock: FakeClock
) -> None:
    model_server.add(reply("Done."))
    manifest = workspace.manifest(prompt="Summarize.")
    first = workspace.start(manifest, ALPINEAGENTS_PACER=limiter.url)
    assert "waiting" in _line(first, "throttled")
    clock.now += 0.5  # half a turn
    first.signal(signal.SIGKILL)
    first.wait()

    second = workspace.start(manifest, ALPINEAGENTS_PACER=limiter.url)
    line = _line(second, "throttled")
    assert "for requests, place 1 in line" in line
    (waiting,) = limiter.get("/v1/waiting")
    assert waiting["run"] == "job"
    assert waiting["waited"] == 0.5  # the first process's place, not a new one
    assert model_server.requests == []  # neither process sent while it waited

    clock.now += 0.5  # the turn
    assert second.wait() == 0, second.stderr
    assert second.message["answer"] == "Done."
    assert len(model_server.requests) == 1
    assert limiter.get("/v1/waiting") == []
    metrics = limiter.get("/metrics")
    assert 'alpineagents_pacing_granted_total{namespace="default"} 1' in metrics


def test_a_throttled_run_logs_each_wait_as_json(
    workspace: Workspace, model_server: ModelServer, limiter: Service, clock: FakeClock
) -> None:
    model_server.add(reply("Done."))
    runner = workspace.start(
        workspace.manifest(prompt="Summarize.", priority=3),
        "--log-format",
        "json",
        ALPINEAGENTS_PACER=limiter.url,
        ALPINEAGENTS_PACER_SHARE="team-a",
    )
    record = json.loads(_line(runner, '"throttled"'))
    assert record["limit"] == "requests"
    assert record["position"] == 1
    (waiting,) = limiter.get("/v1/waiting")
    assert (waiting["namespace"], waiting["priority"]) == ("team-a", 3)
    clock.now += 1
    assert runner.wait() == 0, runner.stderr
