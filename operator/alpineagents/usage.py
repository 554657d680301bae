"""What a run's model requests cost: token counts, prices, budgets.

``usage`` everywhere (a State, a termination message, an AgentRun's status) holds the four
numbers the Messages API reports, :data:`USAGE_KEYS`. The estimated cost in USD of one
reply is :func:`cost_usd` of its usage at the price of its model (:data:`PRICES`, or a
table of your own) and is saved with the reply, so a budget judged on a resumed run
counts exactly what the run before it counted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from .model_ids import anthropic_model_id

__all__ = ["PRICES", "USAGE_KEYS", "Budget", "Price", "cost_usd", "price_for", "prompt_tokens"]

USAGE_KEYS = (
    "input_tokens",
    "output_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
)
"""The numbers a ``usage`` dict holds: uncached input, output, cache writes, cache reads."""

CacheTTL = Literal["5m", "1h"]

# What the API bills a cached token, as a multiple of the model's input price.
_WRITE_5M, _WRITE_1H, _READ = 1.25, 2.0, 0.1


@dataclass(frozen=True)
class Price:
    """A model's price in USD per million tokens (cache writes and reads follow from
    ``input``: 1.25x for 5-minute writes, 2x for 1-hour writes, 0.1x for reads)."""

    input: float
    output: float


PRICES: tuple[tuple[str, Price], ...] = (
    ("claude-opus-4-0", Price(15.0, 75.0)),
    ("claude-opus-4-1", Price(15.0, 75.0)),
    ("claude-opus-4-2025", Price(15.0, 75.0)),
    ("claude-3-opus", Price(15.0, 75.0)),
    ("claude-opus", Price(5.0, 25.0)),
    ("claude-sonnet", Price(3.0, 15.0)),
    ("claude-3-7-sonnet", Price(3.0, 15.0)),
    ("claude-3-5-sonnet", Price(3.0, 15.0)),
    ("claude-3-5-haiku", Price(0.8, 4.0)),
    ("claude-3-haiku", Price(0.25, 1.25)),
    ("claude-haiku", Price(1.0, 5.0)),
)
"""Known models' list prices, by model id prefix: the first prefix that matches wins.
Overridden by a table of your own (``Agent(prices=...)``, the chart's ``prices``)."""
_FALLBACK = Price(3.0, 15.0)


def price_for(model: str, prices: Mapping[str, Price] | None = None) -> tuple[Price, bool]:
    """The price of ``model`` and whether a table knew it (else a Sonnet-class guess).

    ``prices`` (model id or id prefix → Price) is looked at before :data:`PRICES`; the
    longest matching prefix wins. A provider's spelling of the id (Bedrock's
    ``us.anthropic.claude-...-v1:0``, Vertex AI's ``claude-...@date``) matches as it is in
    ``prices``, and as the Anthropic id in both tables."""
    ids = {model, anthropic_model_id(model)}
    for table in ((prices or {}).items(), PRICES):
        matches = [
            (prefix, price) for prefix, price in table if any(i.startswith(prefix) for i in ids)
        ]
        if matches:
            return max(matches, key=lambda match: len(match[0]))[1], True
    return _FALLBACK, False


def cost_usd(
    model: str,
    usage: Mapping[str, int],
    *,
    cache_ttl: CacheTTL = "5m",
    prices: Mapping[str, Price] | None = None,
) -> float:
    """The estimated cost in USD of one reply's ``usage`` (cache writes at ``cache_ttl``'s
    rate, unless ``usage`` says how many tokens went to each TTL)."""
    price, _ = price_for(model, prices)
    written = usage.get("cache_creation_input_tokens", 0)
    written_1h = usage.get("ephemeral_1h_input_tokens", written if cache_ttl == "1h" else 0)
    units = (
        usage.get("input_tokens", 0)
        + _WRITE_5M * (written - written_1h)
        + _WRITE_1H * written_1h
        + _READ * usage.get("cache_read_input_tokens", 0)
    )
    return (units * price.input + usage.get("output_tokens", 0) * price.output) / 1e6


def prompt_tokens(usage: Mapping[str, int]) -> int:
    """Every input token of a request: uncached, written to the cache and read from it."""
    return (
        usage.get("input_tokens", 0)
        + usage.get("cache_creation_input_tokens", 0)
        + usage.get("cache_read_input_tokens", 0)
    )


@dataclass(frozen=True)
class Budget:
    """Limits of one run (and its resumes). A run at a limit stops ``budget_exceeded``
    before its next model request; raise the limit and run it again to go on.

    ``max_input_tokens`` counts every input token the API processed, cached or not;
    ``max_cost_usd`` is the estimated cost (:func:`cost_usd`) of every reply so far.
    """

    max_input_tokens: int | None = None
    max_output_tokens: int | None = None
    max_cost_usd: float | None = None

    def __post_init__(self) -> None:
        for name in ("max_input_tokens", "max_output_tokens", "max_cost_usd"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or value < 0):
                raise ValueError(f"Budget.{name} must be a number of at least 0, not {value!r}")

    def exceeded(self, usage: Mapping[str, int], cost: float) -> str | None:
        """What limit ``usage`` and ``cost`` have reached, as a sentence; ``None`` if none."""
        spent_input = prompt_tokens(usage)
        if self.max_input_tokens is not None and spent_input >= self.max_input_tokens:
            return f"{spent_input} input tokens reached the budget of {self.max_input_tokens}"
        spent_output = usage.get("output_tokens", 0)
        if self.max_output_tokens is not None and spent_output >= self.max_output_tokens:
            return f"{spent_output} output tokens reached the budget of {self.max_output_tokens}"
        if self.max_cost_usd is not None and cost >= self.max_cost_usd:
            return f"an estimated ${cost:.4f} reached the budget of ${self.max_cost_usd:.4f}"
        return None
