"""What every benchmark section takes: the targets' order on the page, and the sizes.

Here and not in :mod:`.sections`, which imports every section: the sections that need
them import this module, so no section imports :mod:`.sections` back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ORDER = [
    "bytes-sqlite",
    "bytes-delta",
    "file-save",
    "minio-save",
    "minio-slowest",
    "step-save",
    "load",
    "cli",
    "first-save",
    "agent-cost",
    "resume-latency",
    "operator-scale",
    "failover",
]


@dataclass
class Sizes:
    """Conversation lengths (in steps) the benchmarks use."""

    steps: int = 1_000  # bytes stored and save time per step
    loads: list[int] = field(default_factory=lambda: [100, 1_000, 3_000])
    cost: list[int] = field(default_factory=lambda: [100, 1_000, 3_000])
    slowest: int = 3_000  # MinioStore's slowest save
    cli_states: int = 20
    resume_singles: int = 10  # rounds of one pod lost on the real node
    resume_burst: int = 30  # pods lost at once
    operator_runs: int = 1_000  # AgentRuns existing for the operator-scale figures

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            steps=100,
            loads=[50, 200],
            cost=[50, 200],
            slowest=200,
            cli_states=3,
            resume_singles=2,
            resume_burst=3,
            operator_runs=50,
        )
