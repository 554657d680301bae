"""What every benchmark section takes: the targets' order on the page, and the sizes.

Here and not in :mod:`.sections`, which imports every section: the sections that need
them import this module, so no section imports :mod:`.sections` back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

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
    "resume-whole",  # issue 26
    "resume-stop-record",  # issue 39
    "operator-scale",
    "operator-runs",
    "operator-runs-live",  # issue 47
    "queued-runs",  # issue 41
    "retention-pace",  # issue 42
    "retention-losses",
    "retention-states",
    # issue 22: long runs, billed (benchmarks/long_runs.py)
    "long-cache",
    "long-flat",
    "long-window",
    "long-largest",
    "long-resume",
    "failover-node",
    "failover",
    "drain",
    "rolling-upgrade",
    "warm-pool",
    "warm-pool-burst",
    "burst-leadership",
    "tracing",
]

SECTION_ROWS = {
    "langgraph": ["bytes-sqlite", "bytes-delta", "step-save"],
    "floors": ["file-save"],
    "minio": ["minio-save", "minio-slowest"],
    "loads": ["load"],
    "startup": ["cli", "first-save"],
    "agent": ["agent-cost"],
    "resume": ["resume-latency", "resume-whole", "resume-stop-record"],
    "operator": ["operator-scale"],
    "operator-runs": ["operator-runs", "operator-runs-live"],
    "queued-runs": ["queued-runs"],
    "retention": ["retention-pace", "retention-losses", "retention-states"],
    "long-runs": ["long-cache", "long-flat", "long-window", "long-largest", "long-resume"],
    "failover-node": ["failover-node"],
    "failover": ["failover"],
    "drain": ["drain"],
    "rolling-upgrade": ["rolling-upgrade"],
    "warm-pool": ["warm-pool"],
    "warm-pool-burst": ["warm-pool-burst", "burst-leadership"],
    "tracing": ["tracing"],
}
"""The rows each section writes, by the section's name (``python -m benchmarks NAME``)."""

EARLIER_PAGES = {
    "resume": "results/resume_latency.md",
    "operator-runs": "results/operator_runs.md",
    "long-runs": "results/long_runs.md",
    "failover": "results/failover.md",
    "drain": "results/drain.md",
    "rolling-upgrade": "results/rolling_upgrade.md",
    "warm-pool": "results/warm_pool.md",
    "warm-pool-burst": "results/warm_pool_burst.md",
    "tracing": "results/tracing_overhead.md",
}
"""Pages, relative to ``RESULTS.md``, of what a section's own script measured before the
section had a record: a row with no record points there."""


@dataclass
class LongRunSizes:
    """The lengths the billed long runs are measured at, and the window they run against."""

    lengths: list[int] = field(default_factory=lambda: [100, 500, 2_000])
    langchain_max: int = 500  # LangChain's runs stop here: 2,000 turns would take too long
    cache_turns: int = 120  # the length of the caching target (issue 22)
    window: int = 200_000  # the Messages API's context window, in tokens
    kill_at: int = 60
    resume_turns: int = 80
    plot: Path | None = REPO / "docs" / "long-runs-billing.png"

    @classmethod
    def quick(cls) -> LongRunSizes:
        """A window of 12k tokens, so 60 turns of 2 KB results pass it."""
        return cls(
            lengths=[20, 60],
            langchain_max=60,
            cache_turns=20,
            window=12_000,
            kill_at=10,
            resume_turns=20,
            plot=None,
        )


@dataclass
class Sizes:
    """Conversation lengths (in steps) the benchmarks use."""

    steps: int = 1_000  # bytes stored and save time per step
    loads: list[int] = field(default_factory=lambda: [100, 1_000, 3_000])
    cost: list[int] = field(default_factory=lambda: [100, 1_000, 3_000])
    slowest: int = 3_000  # MinioStore's slowest save
    cli_states: int = 20
    cli_runs: int = 20  # runs of each command started, a latency goal's samples
    resume_singles: int = 20  # rounds of one pod lost on the real node: a latency goal's samples
    resume_burst: int = 30  # pods lost at once
    resume_bursts: int = 1  # rounds of a burst
    operator_runs: int = 1_000  # AgentRuns existing for the operator-scale figures
    operator_steady: list[int] = field(default_factory=lambda: [100, 1_000, 10_000])
    """Running AgentRuns the operator starts with and idles over (benchmarks.operator_runs)."""
    operator_live: list[int] = field(default_factory=lambda: [100, 1_000, 3_000, 10_000])
    """AgentRuns created while the operator runs, up to each size in turn (the same)."""
    operator_losses: int = 20  # one lost pod at a time, at each size
    queued_runs: int = 10_000  # AgentRuns the operator holds, all but queued_cap queued
    queued_cap: int = 10  # admission.maxRunningPerNamespace for them
    operator_idle: float = 0.0  # seconds of idle measured; 0: three resync periods
    retention_runs: int = 10_000  # finished runs past their TTL, deleted at the chart's pace
    retention_losses: int = 20  # lost pods replaced during those deletions (and after)
    retention_ttl: int = 60  # their ttlSecondsAfterFinished (issue 42's)
    long_runs: LongRunSizes = field(default_factory=LongRunSizes)
    failover_trials: int = 20  # leaders SIGKILLed, and as many SIGTERMed
    failover_runs: int = 20  # AgentRuns around, each new leader resumes them all
    drain_runs: int = 20
    upgrade_runs: int = 20
    warm_pool_rounds: int = 20  # one loss with the pool, one without, per round
    burst_size: int = 30  # graceful stops at once, with a warm pool of as many
    burst_passes: int = 20  # bursts, each on a fresh node: every pass counts
    burst_minutes: int = 0  # 0: every pass; else no pass starts after this many minutes
    tracing_rounds: int = 7
    tracing_turns: int = 40

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            steps=50,
            loads=[20, 100],
            cost=[20, 100],
            slowest=100,
            cli_states=3,
            cli_runs=3,
            resume_singles=2,
            resume_burst=3,
            operator_runs=50,
            operator_steady=[20],
            operator_live=[20],
            operator_losses=2,
            queued_runs=50,
            queued_cap=5,
            operator_idle=5.0,
            retention_runs=100,
            retention_losses=2,
            retention_ttl=5,
            long_runs=LongRunSizes.quick(),
            failover_trials=1,
            failover_runs=3,
            drain_runs=2,
            upgrade_runs=2,
            warm_pool_rounds=2,
            burst_size=3,
            burst_passes=1,
            tracing_rounds=2,
            tracing_turns=5,
        )
