"""A tool result bigger than the window never loops: the requests carry its start and
where the whole of it is, the history keeps every byte, and a request that still cannot
fit ends the run with one error after a bounded number of refusals.

The real Agent and ``anthropic`` client against the scripted Messages API, which refuses
a prompt past its window as the API does ("prompt is too long: N tokens > M maximum").
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anthropic
import pytest

from alpineagents import Agent, FileStore, Message, State, Store, open_store, tool
from alpineagents.context import Compaction
from alpineagents.testing import ModelServer, reply, tool_use
from alpineagents.testing.script import Turn

MODEL = "claude-sonnet-5"
MIB = 1024 * 1024


def _dump(size: int) -> Any:
    @tool
    def dump(what: str) -> str:
        """Returns a large text (a log, a file, a page).

        Args:
            what: what to return
        """
        return "".join(itertools.islice(itertools.cycle("log line of the service\n"), size))

    return dump


class _Model:
    """Asks for the dump once, then answers with the last characters of the result it saw
    (so a test can read what the model got)."""

    def __init__(self) -> None:
        self.bodies: list[Mapping[str, Any]] = []

    def __call__(self, body: Mapping[str, Any]) -> Turn:
        self.bodies.append(body)
        results = [
            block
            for message in body["messages"]
            if message["role"] == "user" and isinstance(message["content"], list)
            for block in message["content"]
            if block.get("type") == "tool_result"
        ]
        if not results:
            return reply(tool_use("dump", {"what": "the service's log"}))
        content = results[-1]["content"]
        text = content if isinstance(content, str) else json.dumps(content)
        return reply(f"I read it. It ends: {text[-160:]}")


@pytest.mark.parametrize("kind", ["file", "minio"])
def test_a_one_mib_result_is_cut_in_the_requests_and_kept_whole_in_the_history(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    store: Store
    if kind == "file":
        store = FileStore(tmp_path / "runs")
    else:
        minio, bucket = request.getfixturevalue("minio"), request.getfixturevalue("minio_bucket")
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", minio.access_key)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", minio.secret_key)
        store = open_store(f"s3://{bucket}/runs?endpoint={minio.endpoint}&secure=false")
    model = _Model()
    with ModelServer(respond=model, window=200_000) as server:
        client = anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0)
        agent = Agent(MODEL, store, tools=[_dump(MIB)], client=client, max_tokens=1024)
        answer = agent.run(State("huge", [Message.user("Read the service's log.")]))
        assert answer is not None
        assert len(server.requests) == 2  # the call, then the answer: nothing refused
        assert server.bill.largest_prompt < 200_000
    # The model saw the start of the result and where the whole of it is.
    assert "all of it is entry" in answer and "of the run's history)" in answer
    saved = store.load("huge")
    (result,) = [e for e in saved.history if e.kind == "tool_result"]
    assert len(result.data["content"]) == MIB  # every byte kept
    assert f"entry {result.seq} of the run's history" in answer
    (cut,) = [e for e in saved.history if e.kind == "cleared"]
    assert cut.data["cut"][0][0] == result.seq


@pytest.mark.parametrize(
    ("size", "window", "compaction"),
    list(
        itertools.product(
            [0, 30_000, 300_000, 2 * MIB, 10 * MIB],
            [8_000, 100_000, 1_000_000],
            [Compaction(), Compaction(summarize=False), Compaction(clear_results=False)],
        )
    ),
)
def test_any_result_size_answers_or_fails_once_within_a_bounded_number_of_requests(
    size: int, window: int, compaction: Compaction, tmp_path: Path
) -> None:
    model = _Model()
    with ModelServer(respond=model, window=window) as server:
        client = anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0)
        agent = Agent(
            MODEL,
            FileStore(tmp_path),
            tools=[_dump(size)],
            client=client,
            max_tokens=512,
            context_window=window,
            compaction=compaction,
        )
        state = State("sweep", [Message.user("Read the service's log.")])
        try:
            answered = agent.run(state) is not None
        except anthropic.BadRequestError as error:
            answered = False
            assert "prompt is too long" in str(error)
        # The call, the answer, and at most three refused requests and a summary between.
        assert len(server.requests) <= 6
        sent = [json.dumps(r.body, sort_keys=True) for r in server.requests]
        assert len(sent) == len(set(sent)), "a request was sent twice unchanged"
    assert answered or state.stopped == "error"
    assert FileStore(tmp_path).load("sweep").history[-1].kind == "stop"
