"""A section's findings: its target rows, each judged by code, and its detail tables."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .measure import Spread

LATENCY_SAMPLES = 20
"""A latency goal (a p50 or p95) is judged over at least this many samples."""


@dataclass
class Row:
    """One line of the targets table: the figures, the goal, and the verdict, computed.

    ``met`` is what the section's code found comparing its figures with the goal (None: not
    measured). ``samples`` says what the figures are over (``"20 trials"``, ``"3 of 5
    passes"``); ``judged_over`` is the count a latency goal is judged over, and the verdict
    of one judged over fewer than :data:`LATENCY_SAMPLES` is "too few samples", whatever
    the figures. ``setting`` names a setting that differs from the chart's and why.
    """

    what: str
    measured: str
    goal: str
    met: bool | None  # None: not measured
    samples: str = ""
    judged_over: int | None = None
    setting: str = ""

    @property
    def verdict(self) -> str:
        if self.met is None:
            return "not measured"
        if self.judged_over is not None and self.judged_over < LATENCY_SAMPLES:
            return f"too few samples ({self.judged_over} of {LATENCY_SAMPLES})"
        return "**met**" if self.met else "not met"

    @property
    def counts_as_met(self) -> bool:
        return self.verdict == "**met**"


@dataclass
class Page:
    """What one section found: its target rows (by key), its detail sections, notes."""

    rows: dict[str, Row] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)  # kept for the sections that set it
    sections: list[list[str]] = field(default_factory=list)
    peer_wins: list[str] = field(default_factory=list)
    not_measured: list[str] = field(default_factory=list)


def table(head: list[str], rows: list[list[Any]]) -> list[str]:
    """A Markdown table, first column left-aligned, the others right-aligned."""
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return lines


def ratio(spread: Spread, digits: int = 2) -> str:
    return spread.text("x", digits)


def ms(spread: Spread, digits: int = 2) -> str:
    return spread.text(" ms", digits)


def fewer(spread: Spread) -> str:
    return f"{spread.text('x', 0)} fewer"


def kb(spread: Spread) -> str:
    return Spread([v / 1024 for v in spread.values]).text(" KiB", 0)
