"""spec.promptCache, contextWindow, compaction and budget, checked as the runner reads them."""

from __future__ import annotations

from typing import Any

import pytest

from alpineagents.context import Compaction
from alpineagents.runner.build import build_agent
from alpineagents.runner.spec import SpecError, parse_spec
from alpineagents.usage import Budget, Price


def plan(**fields: Any) -> Any:
    return parse_spec({"model": "claude-sonnet-5", "prompt": "hi", **fields})


def test_defaults_cache_for_5_minutes_and_compact() -> None:
    agent = build_agent(plan(), environ={})
    assert agent.prompt_cache == "5m"
    assert agent.compaction == Compaction()
    assert agent.budget is None and agent.context_window is None


def test_fields_reach_the_agent() -> None:
    agent = build_agent(
        plan(
            promptCache={"ttl": "1h"},
            contextWindow=1_000_000,
            compaction={"trigger": 0.8, "target": 0.4, "keepToolResults": 5},
            budget={"maxCostUSD": 2.5, "maxOutputTokens": 100_000},
        ),
        environ={"ALPINEAGENTS_PRICES": '{"claude-sonnet": {"input": 1, "output": 2}}'},
    )
    assert agent.prompt_cache == "1h"
    assert agent.context_window == 1_000_000
    assert agent.compaction == Compaction(trigger=0.8, target=0.4, keep_results=5)
    assert agent.budget == Budget(max_output_tokens=100_000, max_cost_usd=2.5)
    assert agent.prices == {"claude-sonnet": Price(1.0, 2.0)}


def test_off_switches() -> None:
    agent = build_agent(
        plan(promptCache={"ttl": False}, compaction={"enabled": False}), environ={}
    )
    assert agent.prompt_cache is None and agent.compaction is None


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"promptCache": {"ttl": "10m"}}, "spec.promptCache.ttl: must be 5m, 1h or off"),
        ({"promptCache": "1h"}, "spec.promptCache: must be a mapping of ttl"),
        ({"contextWindow": 10}, "spec.contextWindow: must be a whole number of at least 1024"),
        ({"compaction": {"trigger": 0.2, "target": 0.5}}, "spec.compaction: Compaction needs"),
        ({"compaction": {"keepTurn": 2}}, "spec.compaction.keepTurn: not a field here"),
        ({"budget": {"maxCostUSD": -1}}, "spec.budget.maxCostUSD: must be a number of dollars"),
        ({"budget": {"maxCost": 1}}, "spec.budget.maxCost: not a field here"),
    ],
)
def test_bad_fields_name_themselves(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message.replace("(", r"\(")):
        plan(**fields)


def test_a_bad_price_table_is_named() -> None:
    with pytest.raises(SpecError, match="ALPINEAGENTS_PRICES: not valid JSON"):
        build_agent(plan(), environ={"ALPINEAGENTS_PRICES": "{"})
