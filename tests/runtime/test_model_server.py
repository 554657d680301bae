"""The scripted model server, driven by the real anthropic client.

These prove the bench's model stand-in behaves as the rest of the suite relies on:
the SDK rebuilds its answers (streamed or not), its errors map to the SDK's exception
classes and retry policy, and holds let a test act while a request is in flight.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anthropic
import pytest

from alpineagents.testing import (
    ModelServer,
    drop,
    echo_reply,
    error,
    hold,
    load_script,
    parse_script,
    reply,
    tool_use,
)
from tests.bench.pipes import read_line
from tests.paths import REPO

try:  # the transport the installed SDK is built on (httpx2 in anthropic 2.x)
    import httpx2 as _transport
except ImportError:  # pragma: no cover - older SDKs
    import httpx as _transport  # type: ignore[no-redef]

WAIT = 120.0  # seconds a child or a held answer may take on a loaded machine: a safety net

pytestmark = pytest.mark.bench_infra

MODEL = "claude-scripted"
HELLO = [{"role": "user", "content": "Hello"}]


def ask(client: anthropic.Anthropic, **overrides: Any) -> anthropic.types.Message:
    arguments: dict[str, Any] = {"model": MODEL, "max_tokens": 256, "messages": HELLO}
    arguments.update(overrides)
    return client.messages.create(**arguments)


def client_for(server: ModelServer, **options: Any) -> anthropic.Anthropic:
    options.setdefault("max_retries", 0)
    return anthropic.Anthropic(base_url=server.url, api_key="scripted-model-key", **options)


# --- answers ---------------------------------------------------------------------


def test_text_reply_is_a_full_message(
    model_server: ModelServer, model_client: anthropic.Anthropic
) -> None:
    model_server.add(reply("Hello back."))

    message = ask(model_client)

    assert message.type == "message"
    assert message.role == "assistant"
    assert message.model == MODEL
    assert message.id.startswith("msg_")
    assert [(b.type, getattr(b, "text", None)) for b in message.content] == [
        ("text", "Hello back.")
    ]
    assert message.stop_reason == "end_turn"
    assert message.stop_sequence is None
    assert message.usage.input_tokens > 0
    assert message.usage.output_tokens > 0


def test_tool_use_reply_with_text_and_several_calls(
    model_server: ModelServer, model_client: anthropic.Anthropic
) -> None:
    nested = {"path": "a/b.txt", "lines": [1, 2, {"deep": "ünïcode"}], "flag": True}
    model_server.add(
        reply("I'll check.", tool_use("read", nested, id="toolu_fixed"), tool_use("pwd"))
    )

    message = ask(model_client)

    assert message.stop_reason == "tool_use"
    text, read, pwd = message.content
    assert text.type == "text" and text.text == "I'll check."
    assert read.type == "tool_use" and pwd.type == "tool_use"
    assert (read.id, read.name, read.input) == ("toolu_fixed", "read", nested)
    assert pwd.name == "pwd" and pwd.input == {}
    assert pwd.id.startswith("toolu_") and pwd.id != read.id


def test_bare_string_and_tool_use_are_turns(
    model_server: ModelServer, model_client: anthropic.Anthropic
) -> None:
    model_server.add("plain", tool_use("ls", {"path": "."}))

    assert ask(model_client).content[0].text == "plain"  # type: ignore[union-attr]
    second = ask(model_client)
    assert second.stop_reason == "tool_use"
    assert second.content[0].input == {"path": "."}  # type: ignore[union-attr]


def test_stop_reason_can_be_scripted(
    model_server: ModelServer, model_client: anthropic.Anthropic
) -> None:
    model_server.add(reply("cut sho", stop_reason="max_tokens"))

    assert ask(model_client).stop_reason == "max_tokens"


def test_stream_helper_rebuilds_text_and_tool_input(
    model_server: ModelServer, model_client: anthropic.Anthropic
) -> None:
    tool_input = {"query": "weather in Zürich " * 5, "days": [1, 2, 3], "units": {"t": "C"}}
    model_server.add(reply("Let me look that up for you.", tool_use("search", tool_input)))

    with model_client.messages.stream(model=MODEL, max_tokens=256, messages=HELLO) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()

    assert len(pieces) > 1, "text should arrive in several deltas"
    assert "".join(pieces) == "Let me look that up for you."
    assert final.stop_reason == "tool_use"
    assert final.content[0].type == "text"
    assert final.content[0].text == "Let me look that up for you."
    call = final.content[1]
    assert call.type == "tool_use" and call.name == "search" and call.input == tool_input
    assert final.usage.output_tokens > 0


def test_raw_stream_has_the_api_event_sequence(
    model_server: ModelServer, model_client: anthropic.Anthropic
) -> None:
    model_server.add(reply("two blocks", tool_use("t", {"a": "bcdefgh"})))

    events = list(ask(model_client, stream=True))

    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.count("content_block_start") == 2 == kinds.count("content_block_stop")
    json_parts = [
        e.delta.partial_json
        for e in events
        if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    ]
    assert len(json_parts) > 1 and json.loads("".join(json_parts)) == {"a": "bcdefgh"}
    message_delta = events[-2]
    assert message_delta.type == "message_delta"
    assert message_delta.delta.stop_reason == "tool_use"


def test_raw_wire_includes_ping_and_chunked_sse(model_server: ModelServer) -> None:
    model_server.add(reply("hi"))
    status, headers, body = raw_post(
        model_server,
        "/v1/messages",
        {"model": MODEL, "max_tokens": 5, "messages": HELLO, "stream": True},
    )

    assert status == 200
    assert headers["content-type"].startswith("text/event-stream")
    events = [line.split(": ", 1)[1] for line in body.splitlines() if line.startswith("event: ")]
    assert events[:2] == ["message_start", "ping"]
    assert events[-1] == "message_stop"


def test_async_client_streamed_and_not(model_server: ModelServer) -> None:
    import asyncio

    model_server.add(reply("async plain"), reply("async streamed", tool_use("t", {"k": [1]})))

    async def talk() -> tuple[anthropic.types.Message, anthropic.types.Message]:
        async with anthropic.AsyncAnthropic(
            base_url=model_server.url, api_key="k", max_retries=0
        ) as client:
            plain = await client.messages.create(model=MODEL, max_tokens=9, messages=HELLO)
            async with client.messages.stream(model=MODEL, max_tokens=9, messages=HELLO) as stream:
                streamed = await stream.get_final_message()
            return plain, streamed

    plain, streamed = asyncio.run(talk())

    assert plain.content[0].text == "async plain"  # type: ignore[union-attr]
    assert streamed.content[0].text == "async streamed"  # type: ignore[union-attr]
    assert streamed.content[1].input == {"k": [1]}  # type: ignore[union-attr]


async def test_async_client_under_pytest_asyncio(model_server: ModelServer) -> None:
    model_server.add(reply("from the event loop"))
    async with anthropic.AsyncAnthropic(
        base_url=model_server.url, api_key="k", max_retries=0
    ) as client:
        message = await client.messages.create(model=MODEL, max_tokens=9, messages=HELLO)
    assert message.content[0].text == "from the event loop"  # type: ignore[union-attr]


def test_count_tokens(model_server: ModelServer, model_client: anthropic.Anthropic) -> None:
    counted = model_client.messages.count_tokens(model=MODEL, messages=HELLO, system="Be brief.")

    assert counted.input_tokens > 0
    assert model_server.requests == [], "count_tokens is not a model turn"
    (recorded,) = model_server.token_count_requests
    assert recorded.body["system"] == "Be brief."
    assert model_server.turns_left == 0


# --- errors ----------------------------------------------------------------------


def test_scripted_errors_raise_the_sdk_exception_classes(
    model_server: ModelServer, model_client: anthropic.Anthropic
) -> None:
    model_server.add(error(529), error(429, retry_after=7), error(500, "boom"))

    with pytest.raises(anthropic.OverloadedError) as overloaded:
        ask(model_client)
    assert overloaded.value.status_code == 529
    assert overloaded.value.body == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "Overloaded (scripted)."},
    }
    assert overloaded.value.request_id is not None

    with pytest.raises(anthropic.RateLimitError) as limited:
        ask(model_client)
    assert limited.value.response.headers["retry-after"] == "7"

    with pytest.raises(anthropic.InternalServerError) as internal:
        ask(model_client)
    assert internal.value.status_code == 500
    assert "boom" in str(internal.value)
    assert len(model_server.requests) == 3


def test_sdk_retries_through_scripted_errors(model_server: ModelServer) -> None:
    model_server.add(error(529), error(429, retry_after=0), reply("third time lucky"))

    with client_for(model_server, max_retries=2) as client:
        message = ask(client)

    assert message.content[0].text == "third time lucky"  # type: ignore[union-attr]
    assert len(model_server.requests) == 3
    # The SDK marks its retries; all three carried the same conversation.
    retry_counts = [r.headers.get("x-stainless-retry-count") for r in model_server.requests]
    assert retry_counts == ["0", "1", "2"]
    assert {json.dumps(r.body["messages"]) for r in model_server.requests} == {json.dumps(HELLO)}


def test_error_inside_a_stream(
    model_server: ModelServer, model_client: anthropic.Anthropic
) -> None:
    model_server.add(error(529, in_stream=True))

    with (
        pytest.raises(anthropic.APIStatusError) as raised,
        model_client.messages.stream(model=MODEL, max_tokens=9, messages=HELLO) as stream,
    ):
        stream.get_final_message()

    assert raised.value.body == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "Overloaded (scripted)."},
    }


def test_malformed_requests_get_invalid_request_error(
    model_server: ModelServer, model_client: anthropic.Anthropic
) -> None:
    model_server.add(reply("kept for a valid request"))

    with pytest.raises(anthropic.BadRequestError) as empty:
        ask(model_client, messages=[])
    assert empty.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]

    status, _, body = raw_post(model_server, "/v1/messages", {"max_tokens": 5, "messages": HELLO})
    assert status == 400
    assert json.loads(body)["error"] == {
        "type": "invalid_request_error",
        "message": "model: Field required",
    }
    status, _, body = raw_post(model_server, "/v1/messages", {"model": MODEL, "messages": HELLO})
    assert status == 400 and "max_tokens" in body

    # Rejected requests are recorded but do not use up the script.
    assert len(model_server.requests) == 3
    assert ask(model_client).content[0].text == "kept for a valid request"  # type: ignore[union-attr]


def test_exhausted_script_is_a_500_that_says_so(
    model_server: ModelServer, model_client: anthropic.Anthropic
) -> None:
    model_server.add(reply("only one"))
    ask(model_client)

    with pytest.raises(anthropic.InternalServerError) as exhausted:
        ask(model_client)

    assert "script exhausted" in str(exhausted.value)
    assert exhausted.value.body["error"]["type"] == "api_error"  # type: ignore[index]
    assert len(model_server.requests) == 2


def test_drop_before_a_non_streamed_answer(
    model_server: ModelServer, model_client: anthropic.Anthropic
) -> None:
    model_server.add(drop())

    with pytest.raises(anthropic.APIConnectionError):
        ask(model_client)


def test_drop_mid_stream_breaks_the_stream(
    model_server: ModelServer, model_client: anthropic.Anthropic
) -> None:
    model_server.add(drop(), drop())

    # What anthropic 2.x really raises: the transport's incomplete-body error, unwrapped,
    # once message_start has arrived.
    broken = (_transport.RemoteProtocolError, anthropic.APIConnectionError)
    with (
        pytest.raises(broken),
        model_client.messages.stream(model=MODEL, max_tokens=9, messages=HELLO) as stream,
    ):
        stream.get_final_message()

    seen: list[str] = []
    with pytest.raises(broken):  # the failure comes while iterating
        for event in ask(model_client, stream=True):
            seen.append(event.type)
    assert seen == ["message_start"]


def test_sdk_retries_a_dropped_connection(model_server: ModelServer) -> None:
    model_server.add(drop(), reply("after the drop"))

    with client_for(model_server, max_retries=1) as client:
        assert ask(client).content[0].text == "after the drop"  # type: ignore[union-attr]


def test_delay_makes_a_client_time_out(model_server: ModelServer) -> None:
    model_server.add(reply("too late", delay=60))

    with client_for(model_server, timeout=0.2) as client, pytest.raises(anthropic.APITimeoutError):
        ask(client)
    # Teardown's stop() must cut the 60 s delay short (the fixture would hang otherwise).


# --- recording, holds ------------------------------------------------------------


def test_requests_are_recorded_with_body_and_headers(
    model_server: ModelServer, model_client: anthropic.Anthropic
) -> None:
    tools = [{"name": "ls", "description": "List files", "input_schema": {"type": "object"}}]
    model_server.add(reply("ok"))

    ask(model_client, system="You are terse.", tools=tools, metadata={"user_id": "u1"})

    (recorded,) = model_server.wait_for_requests(1)
    assert recorded.path == "/v1/messages"
    assert recorded.body["messages"] == HELLO
    assert recorded.body["system"] == "You are terse."
    assert recorded.body["tools"] == tools
    assert recorded.body["model"] == MODEL and recorded.body["max_tokens"] == 256
    assert recorded.stream is False
    # Older SDKs send x-api-key, anthropic 2.x a bearer token; either is recorded as sent.
    credentials = {recorded.headers.get("x-api-key"), recorded.headers.get("authorization")}
    assert credentials & {"scripted-model-key", "Bearer scripted-model-key"}
    assert "anthropic-version" in recorded.headers


def test_hold_blocks_until_released(
    model_server: ModelServer, model_client: anthropic.Anthropic
) -> None:
    model_server.add(hold(reply("released answer")), reply("next"))

    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(ask, model_client)
        (held,) = model_server.wait_for_requests(1)
        assert held.body["messages"] == HELLO
        assert not pending.done(), "a held request must not be answered"
        assert model_server.release() == 1
        assert pending.result(timeout=WAIT).content[0].text == "released answer"  # type: ignore[union-attr]

    assert ask(model_client).content[0].text == "next"  # type: ignore[union-attr]
    assert model_server.release() == 0


def test_hold_streamed_then_an_error(
    model_server: ModelServer, model_client: anthropic.Anthropic
) -> None:
    model_server.add(hold(error(529)))

    def stream_it() -> anthropic.types.Message:
        with model_client.messages.stream(model=MODEL, max_tokens=9, messages=HELLO) as stream:
            return stream.get_final_message()

    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(stream_it)
        model_server.wait_for_requests(1)
        model_server.release()
        with pytest.raises(anthropic.OverloadedError):
            pending.result(timeout=WAIT)


def test_stop_ends_held_requests() -> None:
    server = ModelServer([hold()]).start()
    try:
        with client_for(server) as client, ThreadPoolExecutor(1) as pool:
            pending = pool.submit(ask, client)
            server.wait_for_requests(1)
            server.stop()
            with pytest.raises(anthropic.APIConnectionError):
                pending.result(timeout=WAIT)
    finally:
        server.stop()


def test_wait_for_requests_times_out_with_a_count(model_server: ModelServer) -> None:
    with pytest.raises(TimeoutError, match=r"expected 1 model requests within 0\.01s, got 0"):
        model_server.wait_for_requests(1, timeout=0.01)


def test_turns_can_be_added_while_serving(
    model_server: ModelServer, model_client: anthropic.Anthropic
) -> None:
    model_server.add("first")
    assert ask(model_client).content[0].text == "first"  # type: ignore[union-attr]
    model_server.add("second", "third")
    assert model_server.turns_left == 2
    assert [ask(model_client).content[0].text for _ in range(2)] == ["second", "third"]  # type: ignore[union-attr]


def test_environment_points_a_client_at_the_server(model_server: ModelServer) -> None:
    model_server.add("via env")
    env = model_server.env
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with anthropic.Anthropic(max_retries=0) as client:
            assert ask(client).content[0].text == "via env"  # type: ignore[union-attr]
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# --- echo mode -------------------------------------------------------------------


def test_echo_mode_demo_conversation() -> None:
    tools = [
        {"name": "add", "description": "Add numbers", "input_schema": {"type": "object"}},
    ]
    with ModelServer(echo=True) as server, client_for(server) as client:
        first = ask(client)
        assert first.content[0].text == "Echo: Hello"  # type: ignore[union-attr]

        conversation: list[dict[str, Any]] = [
            {"role": "user", "content": 'Please add.\nuse add {"a": 2, "b": 3}'}
        ]
        call = ask(client, messages=conversation, tools=tools)
        assert call.stop_reason == "tool_use"
        text, tool_call = call.content
        assert text.text == "Using add."  # type: ignore[union-attr]
        assert tool_call.name == "add" and tool_call.input == {"a": 2, "b": 3}  # type: ignore[union-attr]

        conversation += [
            {"role": "assistant", "content": [b.model_dump() for b in call.content]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": tool_call.id, "content": "5"}  # type: ignore[union-attr]
                ],
            },
        ]
        with client.messages.stream(
            model=MODEL, max_tokens=99, messages=conversation, tools=tools
        ) as stream:
            final = stream.get_final_message()
        assert final.stop_reason == "end_turn"
        assert final.content[0].text == "add returned: 5"  # type: ignore[union-attr]


def test_echo_mode_answers_after_the_script() -> None:
    with ModelServer([reply("scripted")], echo=True) as server, client_for(server) as client:
        assert ask(client).content[0].text == "scripted"  # type: ignore[union-attr]
        assert ask(client).content[0].text == "Echo: Hello"  # type: ignore[union-attr]


def test_echo_rules() -> None:
    offered = [{"name": "ls"}]
    # A tool that is not offered, or input that is not a JSON object, is just text.
    assert echo_reply(
        {"messages": [{"role": "user", "content": "use rm {}"}], "tools": offered}
    ).content == ("Echo: use rm {}",)
    assert echo_reply(
        {"messages": [{"role": "user", "content": "use ls [1]"}], "tools": offered}
    ).content == ("Echo: use ls [1]",)
    several = echo_reply(
        {
            "messages": [{"role": "user", "content": 'use ls\nuse ls {"path": "/"}'}],
            "tools": offered,
        }
    )
    assert [getattr(b, "input", None) for b in several.content] == [None, {}, {"path": "/"}]
    failed = echo_reply(
        {
            "messages": [
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t1", "name": "ls", "input": {}}],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t1",
                            "is_error": True,
                            "content": [{"type": "text", "text": "denied"}],
                        }
                    ],
                },
            ]
        }
    )
    assert failed.content == ("ls failed: denied",)
    long = echo_reply({"messages": [{"role": "user", "content": "x" * 5000}]})
    assert isinstance(long.content[0], str) and len(long.content[0]) < 1100


# --- scripts from files and the CLI ----------------------------------------------


def test_parse_script_forms(tmp_path: Path) -> None:
    turns, echo = parse_script(
        {
            "echo": True,
            "turns": [
                "text",
                {"reply": "also text", "delay": 0.5},
                {"text": "t", "tool_uses": [{"name": "a", "input": {"x": 1}, "id": "i"}]},
                {"tool_use": {"name": "b"}},
                {"error": 429, "retry_after": 2},
                {"drop": True},
                {"hold": True, "then": {"reply": "after"}},
            ],
        }
    )
    assert echo is True
    assert turns == [
        "text",
        reply("also text", delay=0.5),
        reply("t", tool_use("a", {"x": 1}, id="i")),
        reply(tool_use("b")),
        error(429, retry_after=2),
        drop(),
        hold(reply("after")),
    ]
    script = tmp_path / "turns.yaml"
    script.write_text("- hi\n- error: 529\n")
    assert load_script(script) == (["hi", error(529)], False)
    for bad in (
        [{"nothing": 1}],
        [42],
        {"turns": [], "extra": 1},
        [{"text": "x", "stop_reason": "?"}],
    ):
        with pytest.raises(ValueError):
            parse_script(bad)


@pytest.fixture
def serve_process(tmp_path: Path) -> Iterator[Any]:
    """Start ``python -m alpineagents.testing serve`` with given args; kill at teardown."""
    started: list[subprocess.Popen[str]] = []
    package_root = REPO / "operator"

    def start(*args: str) -> tuple[subprocess.Popen[str], str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(package_root), env.get("PYTHONPATH")])
        )
        process = subprocess.Popen(
            [sys.executable, "-m", "alpineagents.testing", "serve", "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        started.append(process)
        return process, read_line(process.stdout).strip()

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.communicate()


def test_cli_serves_a_script_and_stops_on_sigterm(serve_process: Any, tmp_path: Path) -> None:
    script = tmp_path / "turns.json"
    script.write_text(
        json.dumps([{"reply": "from the file"}, {"tool_use": {"name": "ls", "input": {"p": 1}}}])
    )

    process, url = serve_process("--script", str(script))

    assert url.startswith("http://127.0.0.1:")
    with anthropic.Anthropic(base_url=url, api_key="k", max_retries=0) as client:
        assert ask(client).content[0].text == "from the file"  # type: ignore[union-attr]
        assert ask(client).content[0].input == {"p": 1}  # type: ignore[union-attr]
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=WAIT)
    assert process.returncode == 0
    assert "model request #2" in stderr


def test_cli_echo_and_sigusr1_releases_holds(serve_process: Any, tmp_path: Path) -> None:
    script = tmp_path / "turns.yaml"
    script.write_text("- hold: true\n  then: {reply: released by signal}\n")

    process, url = serve_process("--script", str(script), "--echo")

    with (
        anthropic.Anthropic(base_url=url, api_key="k", max_retries=0) as client,
        ThreadPoolExecutor(1) as pool,
    ):
        pending = pool.submit(ask, client)
        # The hold is only observable from inside the process; wait for its log line.
        assert "held" in read_line(process.stderr)
        assert not pending.done()
        process.send_signal(signal.SIGUSR1)
        assert pending.result(timeout=WAIT).content[0].text == "released by signal"  # type: ignore[union-attr]
        assert ask(client).content[0].text == "Echo: Hello"  # type: ignore[union-attr]
    process.send_signal(signal.SIGINT)
    process.communicate(timeout=WAIT)
    assert process.returncode == 0


def test_cli_window_and_no_cache(serve_process: Any) -> None:
    _, url = serve_process("--echo", "--window", "50", "--no-cache")
    long_prompt = [{"role": "user", "content": "x" * 400}]

    with anthropic.Anthropic(base_url=url, api_key="k", max_retries=0) as client:
        with pytest.raises(anthropic.BadRequestError, match=r"prompt is too long: \d+ tokens > 50"):
            ask(client, messages=long_prompt)
        usage = ask(client).usage

    assert usage.cache_read_input_tokens is None, "--no-cache: the plain usage"
    assert usage.input_tokens > 0


def test_cli_needs_a_script_or_echo() -> None:
    package_root = REPO / "operator"
    result = subprocess.run(
        [sys.executable, "-m", "alpineagents.testing", "serve"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(package_root)},
        timeout=60,
    )
    assert result.returncode == 2
    assert "--script" in result.stderr


# --- raw HTTP (for what the SDK will not send) -----------------------------------


def raw_post(server: ModelServer, path: str, body: object) -> tuple[int, dict[str, str], str]:
    host, port = server.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=WAIT)
    try:
        connection.request("POST", path, json.dumps(body), {"content-type": "application/json"})
        response = connection.getresponse()
        headers = {k.lower(): v for k, v in response.getheaders()}
        return response.status, headers, response.read().decode()
    finally:
        connection.close()
