"""The sections whose measuring lives in a script of its own: the warm pool on the real node
(one loss at a time, and bursts), ``helm upgrade`` under runs, and tracing's cost.

Each wraps its module's measuring in a section of ``python -m benchmarks``, so its rows are
written, and judged, by code like every other's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from .measure import percentile
from .results_page import Page, Row, table
from .sizes import Sizes

BURST_GOAL = 15.0
"""Seconds: p95 of a burst's whole resume (delete issued → first saved entry)."""
ONE_LOSS_GOAL = 1.0
"""Seconds: p50 of one loss resumed in a waiting standby."""
FAILOVER_GOAL = 5.0
"""Seconds: p95 from a leader's SIGKILL to the standby's next reconcile."""
TRACING_GOAL = 0.05
"""Tracing's CPU overhead per step, as a share of the step's CPU time."""


def _p50_p95(values: list[float]) -> str:
    return f"{percentile(values, 0.5):.2f} / {percentile(values, 0.95):.2f} s"


def warm_pool(page: Page, work: Path, repeats: int, sizes: Sizes, postgres: str | None) -> None:
    """One loss at a time, resumed in a waiting standby or in a pod of its own."""
    from . import warm_pool as pool
    from .resume_latency import NodeUnavailable

    del repeats, postgres
    what = (
        "real node, warm pool (issue 26): delete issued → the resumed run's first saved "
        "entry, one loss, p50 / p95"
    )
    goal = f"one loss p50 under {ONE_LOSS_GOAL:.0f} s with the pool"
    try:
        pooled, own, cost = pool.measure(work, sizes.warm_pool_rounds)
    except NodeUnavailable as error:
        page.rows["warm-pool"] = Row(what, "-", goal, None)
        page.not_measured.append(f"Warm pool: {error}")
        return
    whole = [x.total for x in pooled]
    page.rows["warm-pool"] = Row(
        what,
        f"in a waiting standby {_p50_p95(whole)}; in a pod of its own, alternated on the "
        f"same node, {_p50_p95([x.total for x in own])}; a waiting standby "
        f"{cost.rss_mib:.0f} MiB resident, {cost.cpu * 100:.1f} % of one CPU",
        goal,
        percentile(whole, 0.5) < ONE_LOSS_GOAL,
        f"{len(pooled)} losses each way",
        judged_over=len(pooled),
    )
    rows = [
        [
            label,
            _p50_p95([x.observed - x.issued for x in losses]),
            _p50_p95([x.operator for x in losses]),
            _p50_p95([x.rest for x in losses]),
            _p50_p95([x.total for x in losses]),
        ]
        for label, losses in (
            (f"a waiting standby ({len(pooled)} losses)", pooled),
            (f"a pod of its own ({len(own)} losses)", own),
        )
    ]
    page.sections.append(
        [
            "## The warm pool on the real node, one loss at a time (p50 / p95)",
            "",
            *table(
                [
                    "replacement",
                    "delete issued → loss observed",
                    "operator: loss observed → replacement",
                    "replacement → first saved entry",
                    "whole",
                ],
                rows,
            ),
            "",
            "The chart with `runs.warmPool: 1`; a graceful delete of the run's pod while its "
            "tool call is held, rounds with and without the pool alternated on the same "
            f"node. A waiting standby's runner: {cost.rss_mib:.0f} MiB resident, "
            f"{cost.cpu * 100:.1f} % of one CPU over {pool.IDLE_SECONDS:.0f} s; MinIO "
            f"meanwhile {cost.store_cpu * 100:.1f} %.",
        ]
    )


def warm_pool_burst(
    page: Page, work: Path, repeats: int, sizes: Sizes, postgres: str | None
) -> None:
    """Bursts of graceful stops at once with a warm pool of as many, each pass on a fresh
    node; every pass counts, a failed one as not met."""
    from . import warm_pool as pool
    from .resume_latency import NodeUnavailable

    del repeats, postgres
    n, passes = sizes.burst_size, sizes.burst_passes
    what = (
        f"real node, warm pool of {n} (issue 26): {n} graceful stops at once, delete issued → "
        "each resumed run's first saved entry, p95 per pass"
    )
    lead_what = f"the operator's leadership through a burst of {n} lost pods on this node"
    goal = f"p95 under {BURST_GOAL:.0f} s in every pass, every run resumed, each call once"
    lead_goal = "no leadership lost (no operator restart) in any pass"
    results: list[pool.BurstResult | None] = []
    failures: list[str] = []
    began = time.monotonic()
    for number in range(passes):
        if sizes.burst_minutes and time.monotonic() - began > sizes.burst_minutes * 60:
            break  # the time given is up: the rows count the passes that ran
        folder = work / f"pass-{number}"
        folder.mkdir()
        try:
            results.append(pool.measure_burst(folder, n))
        except NodeUnavailable as error:
            if not results:
                page.rows["warm-pool-burst"] = Row(what, "-", goal, None)
                page.rows["burst-leadership"] = Row(lead_what, "-", lead_goal, None)
                page.not_measured.append(f"Warm pool bursts: {error}")
                return
            raise
        except Exception as error:  # a failed pass counts, as not met
            results.append(None)
            failures.append(f"pass {number + 1}: {type(error).__name__}: {error}"[:300])

    def met(result: pool.BurstResult | None) -> bool:
        if result is None:
            return False
        whole = [x.total for x in result.losses]
        once = all(count == 1 for count in result.call_starts.values())
        return len(whole) == n and percentile(whole, 0.95) < BURST_GOAL and once

    p95s = [
        f"{percentile([x.total for x in r.losses], 0.95):.2f}" if r else "failed" for r in results
    ]
    good = sum(1 for r in results if met(r))
    page.rows["warm-pool-burst"] = Row(
        what,
        f"{good} of {len(results)} passes met; p95 per pass: {', '.join(p95s)} s",
        goal,
        good == len(results),
        f"{len(results)} passes of {n} runs"
        + (f" ({passes} asked, {sizes.burst_minutes} min given)" if len(results) < passes else ""),
        judged_over=min(len(r.losses) if r else n for r in results),
    )
    restarts = [r.operator_restarts if r else None for r in results]
    kept = sum(1 for count in restarts if count == 0)
    page.rows["burst-leadership"] = Row(
        lead_what,
        f"kept in {kept} of {len(results)} passes; operator restarts per pass: "
        + ", ".join("failed" if c is None else str(c) for c in restarts),
        lead_goal,
        kept == len(results),
        f"{len(results)} passes",
    )
    details = [
        f"## {n} graceful stops at once with a warm pool of {n}, {len(results)} passes",
        "",
        *table(
            ["pass", "whole p50", "whole p95", "operator's part p95", "in a standby", "restarts"],
            [
                [
                    str(i + 1),
                    *(
                        [
                            f"{percentile([x.total for x in r.losses], 0.5):.2f} s",
                            f"{percentile([x.total for x in r.losses], 0.95):.2f} s",
                            f"{percentile([x.operator for x in r.losses], 0.95):.2f} s",
                            f"{r.to_standby} of {n}",
                            str(r.operator_restarts),
                        ]
                        if r
                        else ["failed", "-", "-", "-", "-"]
                    ),
                ]
                for i, r in enumerate(results)
            ],
        ),
        "",
        f"Each pass on a fresh real node, the chart with its defaults and "
        f"`runs.warmPool: {n}`: {n} runs held in their tool call, all their pods deleted in "
        "one `kubectl delete pod --wait=false` once the pool's standbys wait and the machine "
        "has settled; times from that command to the first entry saved after the run's next "
        "attempt's pod appeared. Restarts: the operator replicas' containers restarted "
        "during the burst (a leader that could not renew its Lease in time exits).",
    ]
    details += [f"\n- Failed {text}" for text in failures]
    page.sections.append(details)


def rolling_upgrade(
    page: Page, work: Path, repeats: int, sizes: Sizes, postgres: str | None
) -> None:
    """``helm upgrade`` to a new operator and runner image while runs are going (the
    suite's ``tests/e2e/test_rolling_upgrade.py`` at this size: its assertions are the
    goal)."""
    from . import rolling_upgrade as upgrade

    del work, repeats, postgres
    n = sizes.upgrade_runs
    what = f"real node: `helm upgrade` to a new operator and runner image while {n} runs are going"
    goal = "no run lost, no call re-run (every assertion of the upgrade test holds)"
    passed, seconds, load, tail = upgrade.measure(n)
    if not passed and ("skipped" in tail or "SKIP" in tail) and "failed" not in tail:
        page.rows["rolling-upgrade"] = Row(what, "-", goal, None)
        page.not_measured.append(f"Rolling upgrade: the test did not run ({tail})")
        return
    page.rows["rolling-upgrade"] = Row(
        what,
        (
            f"all {n} finished: {n // 2} ran on through the upgrade on the old image, "
            f"{n - n // 2} resumed on the new one; no call started twice"
            if passed
            else "failed (the test's last lines are in the section)"
        )
        + f"; {seconds:.0f} s for the whole scenario",
        goal,
        passed,
        f"1 pass of {n} runs",
    )
    page.sections.append(
        [
            f"## Rolling upgrade under {n} runs",
            "",
            f"`{upgrade.TEST}` with `ALPINEAGENTS_UPGRADE_RUNS={n}`: the cluster and the chart "
            "set up, the runs started and held in their tool call, `helm upgrade --wait` to "
            "the second image, half the runs' pods deleted, every run waited for, and the "
            f"release upgraded back, in {seconds:.0f} s; load average "
            f"{' / '.join(f'{v:.1f}' for v in load)} at the end.",
            "",
            "```",
            tail,
            "```",
        ]
    )


def tracing(page: Page, work: Path, repeats: int, sizes: Sizes, postgres: str | None) -> None:
    """Tracing on (OTLP/HTTP to a real collector) against off, per agent step."""
    import os

    from . import tracing_overhead as traced

    del work, repeats, postgres
    rounds, turns = sizes.tracing_rounds, sizes.tracing_turns
    before = dict(os.environ)
    try:
        figures, spans = traced.measure(rounds, turns)
    finally:  # the measuring sets the model server's and the exporter's variables
        os.environ.clear()
        os.environ.update(before)
    wall_off, wall_on = traced.overhead(figures, "wall")
    cpu_off, cpu_on = traced.overhead(figures, "cpu")
    share = cpu_on / cpu_off - 1
    page.rows["tracing"] = Row(
        "tracing on (OTLP/HTTP to a real collector) vs off, CPU per agent step (issue 27)",
        f"CPU {cpu_on - cpu_off:+.2f} ms, {share:+.1%} ({cpu_off:.2f} → {cpu_on:.2f} ms); "
        f"wall {wall_on - wall_off:+.2f} ms, {wall_on / wall_off - 1:+.1%} "
        f"({wall_off:.2f} → {wall_on:.2f} ms); {spans} spans received",
        f"under {TRACING_GOAL:.0%} of a step's CPU on, against the scripted model's ~1 ms "
        "answers (a real model's seconds make any share far smaller); nothing of the SDK "
        "imported off",
        share < TRACING_GOAL,
        f"{rounds} rounds of {turns} steps each way, medians",
    )
    page.sections.append(
        [
            "## Tracing overhead per agent step",
            "",
            *table(
                ["per step", "off (ms)", "on (ms)", "difference (ms)", "overhead"],
                [
                    [kind, f"{off:.2f}", f"{on:.2f}", f"{on - off:+.2f}", f"{on / off - 1:+.1%}"]
                    for kind, (off, on) in (
                        ("wall", (wall_off, wall_on)),
                        ("cpu", (cpu_off, cpu_on)),
                    )
                ],
            ),
            "",
            "A step: one model call (the scripted server, about a millisecond) and one tool "
            "call, each saved before and after to a FileStore; off and on runs alternate; CPU "
            "is this process's (the model server's thread and the exporter's included). On: "
            "the SDK's batch processor and OTLP/HTTP exporter to a real OpenTelemetry "
            "Collector.",
        ]
    )


def node_failover(page: Page, work: Path, repeats: int, sizes: Sizes, postgres: str | None) -> None:
    """The operator's leader SIGKILLed on the real node, the chart's defaults."""
    from . import node_failover as failover
    from .resume_latency import NodeUnavailable

    del repeats, postgres
    what = (
        "operator failover on the real node: the leader's process SIGKILLed → the standby's "
        "next reconcile (a new run's pod), p50 / p95"
    )
    goal = f"p95 under {FAILOVER_GOAL:.0f} s"
    try:
        result = failover.measure(work, sizes.failover_trials)
    except NodeUnavailable as error:
        page.rows["failover-node"] = Row(what, "-", goal, None)
        page.not_measured.append(f"Operator failover on the real node: {error}")
        return
    times = result.next_reconcile
    early = sum(1 for reason in result.reasons if reason)
    lease, deadline, retry = result.timing
    page.rows["failover-node"] = Row(
        what,
        f"{_p50_p95(times)} (Lease taken {_p50_p95(result.lease_taken)}); the new leader "
        f"saw the holder dead in {early} of {len(times)} trials (the standby took over in "
        f"{result.takers.count('the standby')}, the killed pod's restart in "
        f"{result.takers.count('its restart')}, another pod in "
        f"{result.takers.count('another pod')}); the Lease changed hands {result.lost_between} "
        f"times between trials with nobody killed; {result.pods} pods for {result.runs} runs",
        goal,
        percentile(times, 0.95) < FAILOVER_GOAL,
        f"{len(times)} kills",
        judged_over=len(times),
        setting=f"the chart's defaults: two replicas, Lease {lease} / {deadline:g} / {retry:g} s",
    )
    page.sections.append(failover.report(result))


SECTIONS: dict[str, Callable[[Page, Path, int, Sizes, str | None], None]] = {
    "failover-node": node_failover,
    "rolling-upgrade": rolling_upgrade,
    "warm-pool": warm_pool,
    "warm-pool-burst": warm_pool_burst,
    "tracing": tracing,
}
