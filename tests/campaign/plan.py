"""Seeded plans of campaign runs, and how their messages look.

A run has 2-3 rounds. Each round is one user message whose lines ``use work {...}`` make
the scripted echo model call the tool ``work`` 2-3 times at once; when the results are
in, the echo model answers, and the next round is sent. Every call has a job name unique
in the whole campaign, so marker files tell how often each call really started.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

ROUND_PREFIX = "Round "
NOTE_PREFIX = "note "


@dataclass(frozen=True)
class RunPlan:
    """One run: its State id and, per round, the inputs of its concurrent ``work`` calls."""

    state_id: str
    rounds: tuple[tuple[dict[str, Any], ...], ...]

    def round_text(self, index: int) -> str:
        lines = [f"{ROUND_PREFIX}{index + 1} of {self.state_id}:"]
        lines += [f"use work {json.dumps(call, sort_keys=True)}" for call in self.rounds[index]]
        return "\n".join(lines)

    @property
    def jobs(self) -> list[str]:
        return [call["job"] for calls in self.rounds for call in calls]

    def to_dict(self) -> dict[str, Any]:
        return {"state_id": self.state_id, "rounds": [list(calls) for calls in self.rounds]}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> RunPlan:
        return cls(raw["state_id"], tuple(tuple(calls) for calls in raw["rounds"]))


def plan_run(rng: random.Random, name: str) -> RunPlan:
    """2-3 rounds of 2-3 calls; a call works 0-150 ms, and one in four sends a note."""
    rounds = []
    for round_index in range(rng.randint(2, 3)):
        calls = []
        for call_index in range(rng.randint(2, 3)):
            call: dict[str, Any] = {
                "job": f"{name}-r{round_index + 1}-c{call_index + 1}",
                "ms": rng.choice((0, 5, 20, 50, 150)),
            }
            if rng.random() < 0.25:
                call["note"] = f"{name}-r{round_index + 1}-n{call_index + 1}"
            calls.append(call)
        rounds.append(tuple(calls))
    return RunPlan(name, tuple(rounds))
