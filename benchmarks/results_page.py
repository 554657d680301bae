"""``benchmarks/RESULTS.md``: each target of issue 14 marked met or not, then the details."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .measure import Spread


@dataclass
class Row:
    """One line of the targets table."""

    what: str
    measured: str
    goal: str
    met: bool | None  # None: not measured

    @property
    def verdict(self) -> str:
        return "not measured" if self.met is None else ("**met**" if self.met else "not met")


@dataclass
class Page:
    """Everything one run of the harness found, rendered as Markdown."""

    header: list[str] = field(default_factory=list)
    rows: dict[str, Row] = field(default_factory=dict)  # by key, shown in ``order``
    order: list[str] = field(default_factory=list)
    sections: list[list[str]] = field(default_factory=list)
    peer_wins: list[str] = field(default_factory=list)
    not_measured: list[str] = field(default_factory=list)

    def render(self) -> str:
        rows = [self.rows[key] for key in self.order if key in self.rows]
        lines = [*self.header, "", "## Targets", ""]
        lines += ["| what | measured | goal | |", "|---|---|---|---|"]
        lines += [f"| {r.what} | {r.measured} | {r.goal} | {r.verdict} |" for r in rows]
        met = sum(1 for r in rows if r.met)
        measured = sum(1 for r in rows if r.met is not None)
        lines += [
            "",
            f"{met} of {measured} measured targets met; {len(rows) - measured} not measured.",
            "",
        ]
        if self.peer_wins:
            lines += ["## Where LangGraph wins or the comparison flatters us", ""]
            lines += [f"- {text}" for text in self.peer_wins] + [""]
        if self.not_measured:
            lines += ["## Not measured", ""]
            lines += [f"- {text}" for text in self.not_measured] + [""]
        for section in self.sections:
            lines += [*section, ""]
        return "\n".join(lines).rstrip() + "\n"


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
