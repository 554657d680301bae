"""The agent's own cost per step: no store, an instant model, a tool that returns at once.

A step is the time from one model request to the next: recording the reply, running the
tool call, recording its result and building the next request. Figures are p50 and p95
over the last tenth of the steps before each length (steps 900-999 for 1,000).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import langgraph_peer as peer
from .conversation import OurRun, run_ours
from .measure import Spread, percentile


@dataclass
class CostFigures:
    """Per length: p50 and p95 of a step in milliseconds, over repeats."""

    ours_p50: dict[int, Spread] = field(default_factory=dict)
    ours_p95: dict[int, Spread] = field(default_factory=dict)
    peer_p50: dict[int, Spread] = field(default_factory=dict)
    peer_p95: dict[int, Spread] = field(default_factory=dict)
    last_run: OurRun | None = None


def window(step_seconds: list[float], length: int) -> list[float]:
    """The step times of the last tenth of the steps before ``length``."""
    return step_seconds[length - max(10, length // 10) : length]


def agent_cost(lengths: list[int], repeats: int, peer_repeats: int) -> CostFigures:
    """Ours over ``repeats`` runs, LangGraph (no checkpointer) over ``peer_repeats``."""
    figures = CostFigures()
    longest = max(lengths)
    for repeat in range(max(repeats, peer_repeats)):
        if repeat < repeats:
            run = run_ours(f"cost-{repeat}", longest, None)
            figures.last_run = run
            steps = run.model.step_seconds()
            for length in lengths:
                times = window(steps, length)
                figures.ours_p50.setdefault(length, Spread()).add(percentile(times, 0.5) * 1000)
                figures.ours_p95.setdefault(length, Spread()).add(percentile(times, 0.95) * 1000)
        if repeat < peer_repeats:
            theirs = peer.run_peer(longest, delta=False, saver=None).step_seconds()
            for length in lengths:
                times = window(theirs, length)
                figures.peer_p50.setdefault(length, Spread()).add(percentile(times, 0.5) * 1000)
                figures.peer_p95.setdefault(length, Spread()).add(percentile(times, 0.95) * 1000)
    return figures
