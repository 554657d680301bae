"""The spec fields of a long run: ``promptCache``, ``contextWindow``, ``compaction``,
``budget`` (and the price table a pod is given in ``ALPINEAGENTS_PRICES``).

Checked into :class:`LongRunPlan`; :func:`~alpineagents.runner.build.build_agent` sets the
fields a spec gives on its Agent (a factory's Agent keeps its own for the others).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from ..context import Compaction
from ..pod_contract import ENV_PRICES
from ..usage import Budget, CacheTTL, Price

__all__ = ["FIELDS", "LongRunPlan", "parse_long_run", "prices_from"]

FIELDS = ("promptCache", "contextWindow", "compaction", "budget")

_T = TypeVar("_T")


@dataclass(frozen=True)
class LongRunPlan:
    """What a spec asks of a long run (the Agent's defaults where it asks nothing)."""

    prompt_cache: CacheTTL | None = "5m"
    context_window: int | None = None
    compaction: Compaction | None = Compaction()  # noqa: RUF009 - frozen, shared safely
    budget: Budget | None = None


def parse_long_run(
    spec: Mapping[str, Any], where: str, error: Callable[[str, str], Exception]
) -> LongRunPlan:
    """Check the long-run fields of ``spec``; ``error(field, problem)`` makes what is raised."""
    return LongRunPlan(
        prompt_cache=_prompt_cache(spec.get("promptCache"), f"{where}.promptCache", error),
        context_window=_whole(spec.get("contextWindow"), f"{where}.contextWindow", error, 1024),
        compaction=_compaction(spec.get("compaction"), f"{where}.compaction", error),
        budget=_budget(spec.get("budget"), f"{where}.budget", error),
    )


def _prompt_cache(
    value: object, where: str, error: Callable[[str, str], Exception]
) -> CacheTTL | None:
    if value is None:
        return "5m"
    fields = _mapping(value, where, error, ("ttl",))
    ttl = fields.get("ttl", "5m")
    if ttl is False or ttl == "off":  # YAML reads a bare off as false
        return None
    if ttl not in ("5m", "1h"):
        raise error(f"{where}.ttl", f"must be 5m, 1h or off, not {ttl!r}")
    return ttl  # type: ignore[no-any-return]


def _compaction(
    value: object, where: str, error: Callable[[str, str], Exception]
) -> Compaction | None:
    if value is None:
        return Compaction()
    names = {
        "enabled": "enabled",
        "trigger": "trigger",
        "target": "target",
        "keepToolResults": "keep_results",
        "keepTurns": "keep_turns",
        "clearToolResults": "clear_results",
        "summarize": "summarize",
    }
    fields = _mapping(value, where, error, tuple(names))
    for key in ("enabled", "clearToolResults", "summarize"):
        if key in fields and not isinstance(fields[key], bool):
            raise error(f"{where}.{key}", f"must be true or false, not {fields[key]!r}")
    if fields.get("enabled") is False:
        return None
    for key in ("trigger", "target"):
        number = fields.get(key)
        if number is not None and (isinstance(number, bool) or not isinstance(number, int | float)):
            raise error(f"{where}.{key}", f"must be a fraction of the window, not {number!r}")
    for key in ("keepToolResults", "keepTurns"):
        _whole(fields.get(key), f"{where}.{key}", error, 0)
    given = {names[k]: v for k, v in fields.items() if k != "enabled"}
    try:
        return Compaction(**given)
    except ValueError as problem:
        raise error(where, str(problem)) from None


def _budget(value: object, where: str, error: Callable[[str, str], Exception]) -> Budget | None:
    if value is None:
        return None
    fields = _mapping(value, where, error, ("maxInputTokens", "maxOutputTokens", "maxCostUSD"))
    cost = fields.get("maxCostUSD")
    if cost is not None and (
        isinstance(cost, bool) or not isinstance(cost, int | float) or cost < 0
    ):
        raise error(f"{where}.maxCostUSD", f"must be a number of dollars, at least 0, not {cost!r}")
    return Budget(
        max_input_tokens=_whole(fields.get("maxInputTokens"), f"{where}.maxInputTokens", error, 0),
        max_output_tokens=_whole(
            fields.get("maxOutputTokens"), f"{where}.maxOutputTokens", error, 0
        ),
        max_cost_usd=float(cost) if cost is not None else None,
    )


def _mapping(
    value: object, where: str, error: Callable[[str, str], Exception], known: tuple[str, ...]
) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise error(where, f"must be a mapping of {', '.join(known)}")
    for key in value:
        if key not in known:
            raise error(f"{where}.{key}", f"not a field here; the fields are {', '.join(known)}")
    return value


def _whole(
    value: _T | None, where: str, error: Callable[[str, str], Exception], least: int
) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise error(where, f"must be a whole number of at least {least}, not {value!r}")
    return value


def prices_from(
    environ: Mapping[str, str], error: Callable[[str, str], Exception]
) -> dict[str, Price] | None:
    """The price table in ``ALPINEAGENTS_PRICES``, checked; ``None`` when it is not set."""
    raw = environ.get(ENV_PRICES)
    if not raw:
        return None
    try:
        table = json.loads(raw)
    except json.JSONDecodeError as problem:
        raise error(ENV_PRICES, f"not valid JSON: {problem}") from None
    if not isinstance(table, dict):
        raise error(ENV_PRICES, 'must be {"model id prefix": {"input": USD, "output": USD}}')
    prices = {}
    for model, price in table.items():
        if not (
            isinstance(price, dict)
            and all(isinstance(price.get(k), int | float) for k in ("input", "output"))
        ):
            raise error(f"{ENV_PRICES}: {model}", "needs input and output, USD per million tokens")
        prices[model] = Price(float(price["input"]), float(price["output"]))
    return prices
