"""A namespace's daily spend cap: the dollars its runs may spend per UTC day.

The cap is the chart's ``admission.dailySpendUSDPerNamespace``, over which the
Namespace's own annotation :data:`SPEND_ANNOTATION` (the platform team's, not the run's
author's) wins. A namespace's spend on a day is the sum of its runs' ``status.costUSD``
increments made that day (UTC).

Where the day's spend is kept: in each run's own status. The step that first changes a
run's ``costUSD`` on a day also writes ``status.dailySpend`` = ``{day, fromUSD}``, the
run's cost when that day's count began (:func:`spend_mark`); the run spent
``costUSD - fromUSD`` that day (:func:`spent_on`). It costs no request of its own (it
rides on the status patch that writes the cost), and a restarted operator learns the
day's spend again from its watch's first listing, as it learns everything else, with no
store or ConfigMap of its own to keep in step. The operator's own deletions after a
run's TTL wait for the day of its count to end (:mod:`.retention`); what a restarted
operator cannot know is the spend of a run deleted by hand earlier that day
(:class:`DailySpend` keeps it while the operator that saw it runs).

At the cap a run may not start or resume (:func:`spend_verdict`: ``Queued``, reason
:data:`SPEND_REASON`), and a run that holds a pod has it taken back: its pod is deleted
gracefully (SIGTERM: it stops at its next step and saves, as for a suspension or a Kueue
eviction) and it waits ``Queued`` until the day rolls or the cap is raised, then resumes
from its saved State.

Everything here is plain and typed; the reconciler's side is :mod:`.places`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from alpineagents_operator.kube.admission import Verdict
from alpineagents_operator.kube.views import AgentRunView, Phase

__all__ = [
    "SPEND_ANNOTATION",
    "SPEND_REASON",
    "DailySpend",
    "SpendCap",
    "at_cap",
    "count_ends",
    "held_by_spend",
    "parse_spend_cap",
    "spend_mark",
    "spend_verdict",
    "spent_on",
    "utc_day",
]

SPEND_ANNOTATION = "alpineagents.dev/daily-spend-usd"
"""The Namespace annotation that sets its own daily spend cap in USD (over the chart's)."""
SPEND_REASON = "DailySpendCap"
"""``status.reason`` of a run held by the spend cap (``NamespaceCap`` is the runs cap)."""
CHART_VALUE = "admission.dailySpendUSDPerNamespace"
_TOLERANCE_USD = 1e-6
"""A spend this close to its cap is at it (costs in status have 4 decimals; a sum of
floats may land a hair under)."""
_MICRO = 1_000_000
"""The ledger counts micro-dollars, whole numbers: no float drift however many updates."""

RunKey = tuple[str, str]


def utc_day(now: datetime) -> str:
    """The UTC day ``now`` falls on, as ``status.dailySpend.day`` holds it."""
    return now.astimezone(UTC).date().isoformat()


def parse_spend_cap(value: object, where: str) -> float | None:
    """A daily spend cap from a chart value or an annotation: USD, 0 or more (None or
    "": no cap). Raises ``ValueError`` naming ``where`` for anything else."""
    if value is None or value == "":
        return None
    try:
        cap = float(str(value).strip().removeprefix("$"))
    except ValueError:
        cap = math.nan
    if isinstance(value, bool) or not math.isfinite(cap) or cap < 0:
        raise ValueError(
            f"{where} must be a number of US dollars per day, 0 or more (such as 25 or "
            f"12.50), not {value!r}"
        )
    return cap


def _cost(value: object) -> float:
    try:
        cost = float(str(value)) if value is not None else 0.0
    except ValueError:
        return 0.0
    return cost if math.isfinite(cost) else 0.0


def spend_mark(
    status: Mapping[str, Any], patch: Mapping[str, Any], day: str
) -> dict[str, str] | None:
    """The ``status.dailySpend`` a status ``patch`` needs: when it changes ``costUSD`` and
    the run's count of ``day`` has not begun, the count begins at the cost before the
    patch (for a fork that has spent nothing yet, the cost its copied entries carry:
    inherited, not spent). None: nothing to add."""
    if "costUSD" not in patch:
        return None
    mark = status.get("dailySpend")
    if isinstance(mark, Mapping) and mark.get("day") == day:
        return None
    if "costUSD" in status:
        start = _cost(status.get("costUSD"))
    else:
        forked = patch.get("forkedFrom") or status.get("forkedFrom")
        start = _cost(forked.get("costUSD")) if isinstance(forked, Mapping) else 0.0
    return {"day": day, "fromUSD": f"{start:.4f}"}


def count_ends(status: Mapping[str, Any]) -> datetime | None:
    """When the day of the run's count ends (midnight UTC after it; None: no count): a
    run deleted before then would take its part of that day's spend with it."""
    mark = status.get("dailySpend")
    try:
        day = date.fromisoformat(str(mark.get("day"))) if isinstance(mark, Mapping) else None
    except ValueError:
        return None
    if day is None:
        return None
    return datetime.combine(day + timedelta(days=1), time(), tzinfo=UTC)


def spent_on(status: Mapping[str, Any], day: str) -> float:
    """What the run whose status this is spent on ``day`` (0 when its count is of
    another day, or it has none)."""
    mark = status.get("dailySpend")
    if not isinstance(mark, Mapping) or mark.get("day") != day:
        return 0.0
    return max(0.0, _cost(status.get("costUSD")) - _cost(mark.get("fromUSD")))


@dataclass(frozen=True)
class SpendCap:
    """A namespace's cap in force and where it comes from."""

    usd: float
    source: str
    """The chart value or the annotation, as the message names it."""


def at_cap(spent: float, cap: SpendCap | None) -> bool:
    """Whether a namespace that spent ``spent`` today is at its cap (None: no cap)."""
    return cap is not None and spent + _TOLERANCE_USD >= cap.usd


def spend_verdict(
    run: AgentRunView, spent: float, cap: SpendCap | None, day: str
) -> Verdict | None:
    """The verdict of the spend cap on ``run``, whose namespace spent ``spent`` on
    ``day``: None when under its cap (or none), so the other caps judge it. At the cap,
    a run holding a pod or a place has it taken back (``withdrawn``)."""
    if cap is None or not at_cap(spent, cap):
        return None
    holds = run.status.admitted or run.status.phase in (Phase.PENDING, Phase.RUNNING)
    message = (
        f"daily spend cap: namespace {run.namespace} spent ${spent:.2f} of its "
        f"${cap.usd:.2f} on {day} (UTC) ({cap.source}); "
        + ("its pod stops at its next step and it resumes from there" if holds else "it starts")
        + " when the day rolls over or the cap is raised"
    )
    return Verdict(False, SPEND_REASON, message, withdrawn=holds)


def held_by_spend(run: AgentRunView) -> bool:
    """Whether ``run`` waits for the spend cap (Queued, its reason the cap's)."""
    return run.status.phase == Phase.QUEUED and run.status.raw.get("reason") == SPEND_REASON


@dataclass
class _Seen:
    spent: int
    """Its spend today, in micro-dollars."""
    active: bool
    """It has a pod to take back (Pending, Running)."""
    held: bool
    """It waits for the spend cap."""


class DailySpend:
    """Each namespace's spend today, from the AgentRuns the watch delivers (their
    ``status.dailySpend``), and the runs the cap holds or would take a pod from.

    Changed only from the event loop. ``clock`` says what day it is (UTC); totals are
    kept for the current day and counted again once when the day rolls.
    """

    def __init__(self, clock: Callable[[], datetime]) -> None:
        self._clock = clock
        self._runs: dict[RunKey, _Seen] = {}
        self._day = utc_day(clock())
        self._totals: dict[str, int] = {}
        """Spend today by namespace in micro-dollars, deleted runs' included (while this
        operator runs)."""

    @property
    def day(self) -> str:
        """Today (UTC), the totals brought up to it."""
        self._roll()
        return self._day

    def run_seen(self, run: AgentRunView, *, gone: bool) -> bool:
        """An AgentRun as the watch delivered it (or its deletion); returns whether its
        namespace's spend today changed. A deleted run's spend stays counted today."""
        day = self.day
        key = (run.namespace, run.name)
        before = self._runs.pop(key, None)
        spent = round(spent_on(run.status.raw, day) * _MICRO)
        change = spent - (before.spent if before is not None else 0)
        if change:
            self._totals[run.namespace] = self._totals.get(run.namespace, 0) + change
        if not gone:
            active = run.status.phase in (Phase.PENDING, Phase.RUNNING) and not run.deleting
            self._runs[key] = _Seen(spent, active, held_by_spend(run))
        return change != 0

    def spent(self, namespace: str) -> float:
        """The namespace's spend today, in USD."""
        self._roll()
        return max(0, self._totals.get(namespace, 0)) / _MICRO

    def active_in(self, namespace: str) -> list[RunKey]:
        """Runs of ``namespace`` with a pod the cap would take back."""
        return [k for k, seen in self._runs.items() if k[0] == namespace and seen.active]

    def held(self) -> list[RunKey]:
        """Runs waiting for the spend cap, in every namespace."""
        return [k for k, seen in self._runs.items() if seen.held]

    def namespaces(self) -> Iterable[str]:
        """Namespaces with runs seen."""
        return {namespace for namespace, _ in self._runs}

    def figures(self) -> dict[str, float]:
        """Spend today by namespace (for the metrics), namespaces with runs or spend.
        Only reads (the metrics server's thread calls it): past midnight, all 0."""
        rolled = utc_day(self._clock()) != self._day
        totals = dict(self._totals)
        namespaces = {*self.namespaces(), *totals}
        return {n: 0.0 if rolled else max(0, totals.get(n, 0)) / _MICRO for n in namespaces}

    def _roll(self) -> None:
        day = utc_day(self._clock())
        if day == self._day:
            return
        # A new day: every count starts again from the runs' own marks (a run that spent
        # nothing yet today counts 0 until its next cost change writes the day's mark).
        self._day, self._totals = day, {}
        for seen in self._runs.values():
            seen.spent = 0
