"""The scripted model server bills and refuses like the Messages API.

Prompt caching (breakpoints, the 20-block lookback, the minimum cacheable length, 5m and
1h TTLs), the four usage numbers, the context window's 400 and the server's bill, driven
by the real ``anthropic`` client; then :mod:`alpineagents.testing.billing` on its own.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anthropic
import pytest

from alpineagents.testing import Bill, ModelServer, error, hold, reply
from alpineagents.testing.billing import (
    Prompt,
    PromptCache,
    PromptRefused,
    Usage,
    count_tokens,
)
from tests.bench.clock import FakeClock

pytestmark = pytest.mark.bench_infra

MODEL = "claude-scripted"
CACHE = {"type": "ephemeral"}
CACHE_1H = {"type": "ephemeral", "ttl": "1h"}
# Small enough that prompts stay small, large enough that a one-word prefix is not cached.
MIN_TOKENS = 50


def text(words: str, cache: Mapping[str, Any] | None = None) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "text", "text": words}
    if cache is not None:
        block["cache_control"] = dict(cache)
    return block


def long_text(label: str, tokens: int = 200) -> str:
    """About ``tokens`` tokens of text that starts with ``label``."""
    return (label + " " + "lorem ipsum " * tokens)[: tokens * 4]


def user(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": list(blocks)}


def assistant(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": list(blocks)}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def server(clock: FakeClock) -> Iterator[ModelServer]:
    with ModelServer(respond=lambda body: "ok", min_cacheable_tokens=MIN_TOKENS, clock=clock) as s:
        yield s


@pytest.fixture
def client(server: ModelServer) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0) as c:
        yield c


def create(client: anthropic.Anthropic, **arguments: Any) -> Any:
    """``client.messages.create`` with the model and max_tokens filled in (the requests
    here are plain dicts, so the SDK's parameter types are not checked)."""
    arguments.setdefault("model", MODEL)
    arguments.setdefault("max_tokens", 64)
    return client.messages.create(**arguments)


def ask(client: anthropic.Anthropic, **arguments: Any) -> anthropic.types.Usage:
    usage: anthropic.types.Usage = create(client, **arguments).usage
    return usage


def four(usage: anthropic.types.Usage) -> tuple[int, int, int]:
    """(input, cache write, cache read)."""
    return (
        usage.input_tokens,
        usage.cache_creation_input_tokens or 0,
        usage.cache_read_input_tokens or 0,
    )


def total(usage: anthropic.types.Usage) -> int:
    return sum(four(usage))


def prefix_tokens(**request: Any) -> int:
    """Tokens of a prefix: the request cut after its breakpoint block, counted whole."""
    return count_tokens(request)


# --- caching, through the real client --------------------------------------------


def test_a_second_request_with_the_same_prefix_reads_it(client: anthropic.Anthropic) -> None:
    system = [text(long_text("You are careful."), CACHE)]
    cached = prefix_tokens(system=system)

    first = ask(client, system=system, messages=[user(text("first question"))])
    second = ask(client, system=system, messages=[user(text("a different question"))])

    assert four(first) == (total(first) - cached, cached, 0)
    assert first.cache_creation is not None
    assert first.cache_creation.ephemeral_5m_input_tokens == cached
    assert first.cache_creation.ephemeral_1h_input_tokens == 0
    assert four(second) == (total(second) - cached, 0, cached)


def test_a_string_system_prompt_and_a_one_block_list_are_the_same_prefix(
    client: anthropic.Anthropic,
) -> None:
    words = long_text("Same words.")
    system = [text(words, CACHE)]
    ask(client, system=system, messages=[user(text("q"))])

    as_string = ask(client, system=words, messages=[user(text("q"))], cache_control=CACHE)

    # The top-level breakpoint sits on the message; the lookback finds the system prefix.
    assert as_string.cache_read_input_tokens == prefix_tokens(system=system)


def test_a_changed_early_block_misses(client: anthropic.Anthropic) -> None:
    tools = [
        {"name": "read", "description": long_text("Read a file."), "input_schema": {}},
        {
            "name": "write",
            "description": "Write a file.",
            "input_schema": {},
            "cache_control": CACHE,
        },
    ]
    system = [text(long_text("Be brief."), CACHE)]
    ask(client, tools=tools, system=system, messages=[user(text("q"))])

    changed = [{**tools[0], "description": long_text("Read a file, carefully.")}, tools[1]]
    usage = ask(client, tools=changed, system=system, messages=[user(text("q"))])

    assert usage.cache_read_input_tokens == 0
    assert usage.cache_creation_input_tokens == prefix_tokens(tools=changed, system=system)


def test_cache_control_is_not_part_of_the_prefix(client: anthropic.Anthropic) -> None:
    # A breakpoint that moves on (as an agent's does) still finds the earlier prefix.
    first_turn = [user(text(long_text("Task."), CACHE))]
    ask(client, messages=first_turn)

    moved = [user(text(long_text("Task."))), assistant(text("Sure.")), user(text("go", CACHE))]
    usage = ask(client, messages=moved)

    assert usage.cache_read_input_tokens == prefix_tokens(messages=[user(text(long_text("Task.")))])
    assert usage.cache_creation_input_tokens == total(usage) - usage.cache_read_input_tokens
    assert usage.input_tokens == 0


@pytest.mark.parametrize(("added", "hit"), [(20, True), (21, False)])
def test_the_lookback_reaches_20_blocks_before_a_breakpoint(
    client: anthropic.Anthropic, added: int, hit: bool
) -> None:
    first = text(long_text("Start."))
    ask(client, messages=[user({**first, "cache_control": CACHE})])

    later = [text(f"block {n}") for n in range(1, added + 1)]
    later[-1]["cache_control"] = CACHE
    usage = ask(client, messages=[user(first, *later)])

    expected = prefix_tokens(messages=[user(first)]) if hit else 0
    assert usage.cache_read_input_tokens == expected


def test_the_longest_cached_prefix_is_read(client: anthropic.Anthropic) -> None:
    system = [text(long_text("System."), CACHE)]
    turn = [user(text(long_text("Question.")), text("end", CACHE))]
    ask(client, system=system, messages=turn)

    usage = ask(
        client, system=system, messages=[*turn, assistant(text("A")), user(text("Q", CACHE))]
    )

    assert usage.cache_read_input_tokens == prefix_tokens(system=system, messages=turn)


def test_a_prefix_below_the_minimum_is_not_cached(clock: FakeClock) -> None:
    system = [text(long_text("Short.", tokens=500), CACHE)]
    with (
        ModelServer(respond=lambda body: "ok", clock=clock) as server,
        anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0) as client,
    ):
        assert prefix_tokens(system=system) < 1024
        first = ask(client, system=system, messages=[user(text("q"))])
        second = ask(client, system=system, messages=[user(text("q"))])
        long_system = [text(long_text("Long.", tokens=1100), CACHE)]
        written = ask(client, system=long_system, messages=[user(text("q"))])

    assert four(first) == (total(first), 0, 0)
    assert four(second) == (total(second), 0, 0)
    assert written.cache_creation_input_tokens == prefix_tokens(system=long_system) >= 1024


def test_an_entry_lives_5_minutes_from_its_last_read(
    client: anthropic.Anthropic, clock: FakeClock
) -> None:
    system = [text(long_text("Five minutes."), CACHE)]
    cached = prefix_tokens(system=system)

    def cache_read() -> int:
        return ask(client, system=system, messages=[user(text("q"))]).cache_read_input_tokens or 0

    assert cache_read() == 0
    clock.advance(299)
    assert cache_read() == cached
    clock.advance(299)  # 598 s after the write, 299 after the read that refreshed it
    assert cache_read() == cached
    clock.advance(301)
    assert cache_read() == 0, "expired: written again"
    clock.advance(1)
    assert cache_read() == cached


def test_1h_entries_outlive_5m_ones_and_are_billed_apart(
    client: anthropic.Anthropic, clock: FakeClock
) -> None:
    tools = [
        {
            "name": "t",
            "description": long_text("Tool."),
            "input_schema": {},
            "cache_control": CACHE_1H,
        }
    ]
    system = [text(long_text("System."), CACHE)]
    messages = [user(text("q"))]
    hour = prefix_tokens(tools=tools)
    five = prefix_tokens(tools=tools, system=system) - hour

    first = ask(client, tools=tools, system=system, messages=messages)
    clock.advance(30 * 60)
    later = ask(client, tools=tools, system=system, messages=messages)

    assert first.cache_creation is not None
    assert first.cache_creation.ephemeral_1h_input_tokens == hour
    assert first.cache_creation.ephemeral_5m_input_tokens == five
    assert first.cache_creation_input_tokens == hour + five
    assert later.cache_read_input_tokens == hour
    assert later.cache_creation is not None
    assert later.cache_creation.ephemeral_5m_input_tokens == five


def test_top_level_cache_control_marks_the_last_block(client: anthropic.Anthropic) -> None:
    messages = [user(text(long_text("Hello.")))]
    first = ask(client, messages=messages, cache_control=CACHE)

    followed = [*messages, assistant(text("Hi.")), user(text("And then?"))]
    second = ask(client, messages=followed, cache_control=CACHE)

    assert four(first) == (0, total(first), 0)
    assert second.cache_read_input_tokens == total(first)
    assert four(second) == (0, total(second) - total(first), total(first))


def test_a_model_name_is_part_of_the_cache_key(client: anthropic.Anthropic) -> None:
    system = [text(long_text("Model."), CACHE)]
    ask(client, system=system, messages=[user(text("q"))])

    other = ask(client, model="claude-other", system=system, messages=[user(text("q"))])

    assert other.cache_read_input_tokens == 0


# --- refusals ----------------------------------------------------------------------


def test_more_than_4_breakpoints_are_refused(
    server: ModelServer, client: anthropic.Anthropic
) -> None:
    server.add(reply("scripted"))
    messages = [user(*(text(f"part {n}", CACHE) for n in range(5)))]

    with pytest.raises(anthropic.BadRequestError) as refused:
        ask(client, messages=messages)

    assert refused.value.body == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "A maximum of 4 blocks with cache_control may be provided. Found 5.",
        },
    }
    assert server.turns_left == 1, "a refused request uses no turn"
    assert server.bill.requests == 0


def test_the_top_level_breakpoint_counts_toward_the_4(client: anthropic.Anthropic) -> None:
    messages = [user(*(text(f"part {n}", CACHE) for n in range(4)), text("last"))]

    with pytest.raises(anthropic.BadRequestError, match="Found 5"):
        ask(client, messages=messages, cache_control=CACHE)


def test_a_1h_breakpoint_after_a_5m_one_is_refused(client: anthropic.Anthropic) -> None:
    system = [text("s", CACHE)]
    messages = [user(text("a"), text("b", CACHE_1H))]

    with pytest.raises(anthropic.BadRequestError) as refused:
        ask(client, system=system, messages=messages)

    assert refused.value.status_code == 400
    assert refused.value.body["error"]["message"] == (  # type: ignore[index]
        "messages.0.content.1.cache_control.ttl: a ttl='1h' cache_control block must not "
        "come after a ttl='5m' cache_control block. Note that blocks are processed in the "
        "following order: `tools`, `system`, `messages`."
    )


def test_a_prompt_past_the_window_gets_the_apis_400() -> None:
    messages = [user(text(long_text("Too long.", tokens=1500)))]
    size = count_tokens({"messages": messages})
    with (
        ModelServer([reply("never")], window=1000) as server,
        anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0) as client,
    ):
        with pytest.raises(anthropic.BadRequestError) as refused:
            ask(client, messages=messages)
        counted = client.messages.count_tokens(model=MODEL, messages=messages)  # type: ignore[arg-type]
        assert server.turns_left == 1
        assert ask(client, messages=[user(text("short"))]).input_tokens < 1000

    assert size > 1000
    assert refused.value.body == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": f"prompt is too long: {size} tokens > 1000 maximum",
        },
    }
    assert counted.input_tokens == size


def test_the_default_window_is_the_apis_200k() -> None:
    assert ModelServer().window == 200_000
    assert ModelServer(window=None).window is None
    with pytest.raises(ValueError, match="window"):
        ModelServer(window=0)


def test_count_tokens_answers_the_whole_prompt(
    server: ModelServer, client: anthropic.Anthropic
) -> None:
    system = [text(long_text("Count me."), CACHE)]
    messages = [user(text("q"))]
    ask(client, system=system, messages=messages)  # cached: the count still is the total

    counted = client.messages.count_tokens(model=MODEL, system=system, messages=messages)  # type: ignore[arg-type]
    usage = ask(client, system=system, messages=messages)

    assert (
        counted.input_tokens
        == total(usage)
        == count_tokens({"system": system, "messages": messages})
    )


# --- streaming ---------------------------------------------------------------------


def test_streaming_reports_the_four_numbers_as_the_api_does(client: anthropic.Anthropic) -> None:
    system = [text(long_text("Stream."), CACHE)]
    cached = prefix_tokens(system=system)
    ask(client, system=system, messages=[user(text("q"))])

    events: list[Any] = list(create(client, system=system, messages=[user(text("q"))], stream=True))
    arguments: dict[str, Any] = {"system": system, "messages": [user(text("q"))]}
    with client.messages.stream(model=MODEL, max_tokens=64, **arguments) as stream:
        final = stream.get_final_message()

    start = events[0]
    assert start.type == "message_start"
    assert start.message.usage.cache_read_input_tokens == cached
    assert start.message.usage.cache_creation_input_tokens == 0
    assert start.message.usage.cache_creation is not None
    delta = next(e for e in events if e.type == "message_delta")
    assert delta.usage.cache_read_input_tokens == cached
    assert delta.usage.input_tokens == start.message.usage.input_tokens
    assert delta.usage.output_tokens > 0
    assert four(final.usage) == four(start.message.usage)
    assert final.usage.output_tokens == delta.usage.output_tokens


# --- the bill ----------------------------------------------------------------------


def test_the_bill_sums_what_was_charged(
    server: ModelServer, client: anthropic.Anthropic, clock: FakeClock
) -> None:
    tools = [
        {
            "name": "t",
            "description": long_text("Tool."),
            "input_schema": {},
            "cache_control": CACHE_1H,
        }
    ]
    system = [text(long_text("System."), CACHE)]
    seen = [
        create(client, tools=tools, system=system, messages=[user(text(q))])
        for q in ("one", "two", "three")
    ]
    server.add(error(529))
    with pytest.raises(anthropic.APIStatusError):
        ask(client, system=system, messages=[user(text("overloaded"))])

    bill = server.bill
    usages = [m.usage for m in seen]
    writes_5m = sum(u.cache_creation.ephemeral_5m_input_tokens for u in usages if u.cache_creation)
    writes_1h = sum(u.cache_creation.ephemeral_1h_input_tokens for u in usages if u.cache_creation)
    reads = sum(u.cache_read_input_tokens or 0 for u in usages)
    inputs = sum(u.input_tokens for u in usages)
    assert bill.requests == 3, "an error is not billed"
    assert bill.input_tokens == inputs
    assert bill.cache_creation_input_tokens == writes_5m + writes_1h > 0
    assert bill.cache_read_input_tokens == reads > 0
    assert bill.output_tokens == sum(u.output_tokens for u in usages)
    assert bill.largest_prompt == max(total(u) for u in usages)
    assert bill.uncached_units == sum(total(u) for u in usages)
    assert bill.input_units == pytest.approx(
        inputs + 1.25 * writes_5m + 2 * writes_1h + 0.1 * reads
    )
    assert bill.billed_fraction == pytest.approx(bill.input_units / bill.uncached_units)

    assert server.reset_bill() == bill
    assert server.bill == Bill()


def test_an_agents_moving_breakpoints_pay_each_prefix_once(
    server: ModelServer, client: anthropic.Anthropic
) -> None:
    # The agent's pattern: the last tool, the system prompt, the newest message's last
    # block and the block the previous request ended with.
    tools = [{"name": "read", "description": "Read.", "input_schema": {}, "cache_control": CACHE}]
    system = [text(long_text("Agent."), CACHE)]
    history: list[dict[str, Any]] = [user(text("Do the task."))]
    previous_end: int | None = None
    for turn in range(40):
        request = json.loads(json.dumps(history))
        request[-1]["content"][-1]["cache_control"] = CACHE
        if previous_end is not None:
            request[previous_end]["content"][-1]["cache_control"] = CACHE
        ask(client, tools=tools, system=system, messages=request)
        previous_end = len(history) - 1
        history += [
            assistant(text(f"calling read {turn}")),
            user(text(long_text(f"result {turn}"))),
        ]

    bill = server.bill
    assert bill.requests == 40
    assert bill.billed_fraction < 0.2
    # Each request after the first writes only what is new since the one before.
    assert bill.cache_creation_input_tokens == bill.largest_prompt


# --- respond, billing=False ----------------------------------------------------------


def test_respond_answers_once_the_script_is_empty() -> None:
    asked: list[Mapping[str, Any]] = []

    def respond(body: Mapping[str, Any]) -> Any:
        asked.append(body)
        return reply(f"computed {len(asked)}")

    with (
        ModelServer([reply("scripted")], respond=respond) as server,
        anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0) as client,
    ):
        answers = [
            create(client, messages=[user(text(q))]).content[0].text for q in ("a", "b", "c")
        ]

    assert answers == ["scripted", "computed 1", "computed 2"]
    assert [body["messages"][0]["content"][0]["text"] for body in asked] == ["b", "c"]


def test_respond_may_hold_and_a_raising_respond_is_a_500() -> None:
    answers = iter([hold("after the hold")])

    def respond(body: Mapping[str, Any]) -> Any:
        return next(answers)  # raises StopIteration on the second request

    with (
        ModelServer(respond=respond) as server,
        anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0) as client,
    ):
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(ask, client, messages=[user(text("q"))])
            server.wait_for_requests(1)
            assert server.release() == 1
            assert pending.result(timeout=120).output_tokens > 0
        with pytest.raises(anthropic.InternalServerError, match="respond raised"):
            ask(client, messages=[user(text("q"))])


def test_respond_and_echo_are_one_or_the_other() -> None:
    with pytest.raises(ValueError, match="not both"):
        ModelServer(echo=True, respond=lambda body: "x")


def test_billing_off_gives_the_plain_usage() -> None:
    messages = [user(*(text(f"part {n}", CACHE) for n in range(6)))]
    with (
        ModelServer([reply("a"), reply("b")], billing=False) as server,
        anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0) as client,
    ):
        raw = client.messages.with_raw_response.create(model=MODEL, max_tokens=9, messages=messages)  # type: ignore[arg-type]
        with client.messages.stream(model=MODEL, max_tokens=9, messages=messages) as stream:  # type: ignore[arg-type]
            streamed = stream.get_final_message()

    usage = json.loads(raw.text())["usage"]
    assert set(usage) == {"input_tokens", "output_tokens"}
    assert usage["input_tokens"] == count_tokens({"messages": messages})
    assert streamed.usage.cache_read_input_tokens is None
    assert streamed.usage.input_tokens == usage["input_tokens"]


# --- billing.py on its own -----------------------------------------------------------


REQUEST: dict[str, Any] = {
    "model": MODEL,
    "max_tokens": 10,
    "tools": [{"name": "t", "input_schema": {"type": "object"}, "cache_control": CACHE}],
    "system": "Be kind. Ünïcode too.",
    "messages": [
        {"role": "user", "content": "Hi"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "u1", "name": "t", "input": {}}],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "u1",
                    "content": [text("out", CACHE)],
                    "cache_control": CACHE,
                }
            ],
        },
    ],
}


def test_count_tokens_is_a_quarter_of_the_canonical_json() -> None:
    canonical = {
        "tools": [{"name": "t", "input_schema": {"type": "object"}}],
        "system": [text("Be kind. Ünïcode too.")],
        "messages": [
            {"role": "user", "content": [text("Hi")]},
            REQUEST["messages"][1],
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "u1", "content": [text("out")]}],
            },
        ],
    }

    assert count_tokens(REQUEST) == len(json.dumps(canonical)) // 4
    assert count_tokens({"model": MODEL}) == 1


def test_a_prompt_finds_its_breakpoints_in_api_order() -> None:
    prompt = Prompt({**REQUEST, "cache_control": CACHE_1H})

    # tools.0 is block 0; the top-level one lands on the tool_result, which has its own.
    assert [(p.block, p.ttl) for p in prompt.breakpoints] == [(0, "5m"), (4, "5m")]
    assert prompt.prefix(4).tokens == prompt.total_tokens


@pytest.mark.parametrize(
    ("cache_control", "message"),
    [
        (
            {"type": "persistent"},
            "messages.0.content.0.cache_control.type: Input should be 'ephemeral'",
        ),
        (
            {"type": "ephemeral", "ttl": "2h"},
            "messages.0.content.0.cache_control.ttl: Input should be '5m' or '1h'",
        ),
    ],
)
def test_a_bad_cache_control_is_refused(cache_control: dict[str, Any], message: str) -> None:
    with pytest.raises(PromptRefused) as refused:
        Prompt({"model": MODEL, "messages": [user(text("x", cache_control))]})
    assert str(refused.value) == message


def test_quote_changes_nothing_and_charge_writes() -> None:
    cache = PromptCache(min_cacheable_tokens=0, clock=FakeClock())
    prompt = Prompt({"model": MODEL, "messages": [user(text("hello there", CACHE), text("more"))]})
    cached = prompt.prefix(0).tokens

    assert (
        cache.quote(prompt)
        == cache.quote(prompt)
        == Usage(input_tokens=prompt.total_tokens - cached, ephemeral_5m_input_tokens=cached)
    )
    assert len(cache) == 0
    cache.charge(prompt)
    assert len(cache) == 1
    assert cache.charge(prompt) == Usage(
        input_tokens=prompt.total_tokens - cached, cache_read_input_tokens=cached
    )


def test_an_expired_entry_is_swept_from_memory() -> None:
    clock = FakeClock()
    cache = PromptCache(min_cacheable_tokens=0, clock=clock)
    for n in range(300):
        cache.charge(Prompt({"model": MODEL, "messages": [user(text(f"prompt {n}", CACHE))]}))
        clock.advance(10)

    assert len(cache) == 29  # those written less than 300 s ago
    assert len(cache._entries) < 300  # swept, not just expired


def test_bill_arithmetic() -> None:
    bill = Bill().plus(Usage(input_tokens=100, ephemeral_5m_input_tokens=1000), 7)
    bill = bill.plus(
        Usage(input_tokens=10, cache_read_input_tokens=1000, ephemeral_1h_input_tokens=40), 3
    )

    assert (bill.requests, bill.input_tokens, bill.output_tokens) == (2, 110, 10)
    assert bill.cache_creation_input_tokens == 1040
    assert bill.cache_read_input_tokens == 1000
    assert bill.largest_prompt == 1100
    assert bill.uncached_units == 2150
    assert bill.input_units == pytest.approx(110 + 1250 + 80 + 100)
    assert Bill().billed_fraction == 0.0


def test_usage_as_the_api_reports_it() -> None:
    usage = Usage(
        input_tokens=3,
        cache_read_input_tokens=5,
        ephemeral_5m_input_tokens=7,
        ephemeral_1h_input_tokens=11,
    )

    assert usage.as_api() == {
        "input_tokens": 3,
        "cache_creation_input_tokens": 18,
        "cache_read_input_tokens": 5,
        "cache_creation": {"ephemeral_5m_input_tokens": 7, "ephemeral_1h_input_tokens": 11},
    }
    assert usage.prompt_tokens == 26
