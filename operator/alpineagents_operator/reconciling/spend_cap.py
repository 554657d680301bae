"""The reconciler's side of the daily spend cap (:mod:`.daily_spend`): the verdict for a
step, the runs to step when a namespace reaches its cap, and those to step again when
the day rolls over or the cap is raised.

Each namespace's cap is its annotation :data:`~.daily_spend.SPEND_ANNOTATION` where
``admission.namespaceAnnotations`` lets the operator read it (a value that is not a
number of dollars is a Warning Event on the runs it judges, once, and the chart's cap
holds), else the chart's ``admission.dailySpendUSDPerNamespace``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime

from alpineagents_operator.kube.admission import NamespaceCaps, Verdict
from alpineagents_operator.kube.cluster import Cluster
from alpineagents_operator.kube.daily_spend import (
    CHART_VALUE,
    SPEND_ANNOTATION,
    DailySpend,
    SpendCap,
    at_cap,
    parse_spend_cap,
    spend_verdict,
)
from alpineagents_operator.kube.metrics import OperatorMetrics
from alpineagents_operator.kube.views import GROUP, VERSION, AgentRunView, RunEvent

__all__ = ["SpendCaps"]

_log = logging.getLogger(__name__)


class SpendCaps:
    """The daily spend cap of every namespace, for one operator (the leader)."""

    def __init__(
        self,
        chart_cap: float | None,
        cluster: Cluster,
        namespace_caps: NamespaceCaps | None,
        requeue: Callable[[str, str, float], None],
        clock: Callable[[], datetime],
        metrics: OperatorMetrics | None = None,
    ) -> None:
        self._chart_cap = chart_cap
        self._cluster = cluster
        self._annotations = namespace_caps
        self._requeue = requeue
        self.spend = DailySpend(clock)
        """Each namespace's spend today."""
        self._told: set[tuple[str, str]] = set()
        """(namespace, bad annotation value) pairs already said in an Event."""
        if metrics is not None:
            metrics.watch_spend(self.spend.figures)

    def cap(self, namespace: str) -> SpendCap | None:
        """The namespace's cap in force (None: none)."""
        own, _ = self._annotated(namespace)
        if own is not None:
            return SpendCap(own, f"its annotation {SPEND_ANNOTATION}")
        if self._chart_cap is not None:
            return SpendCap(self._chart_cap, CHART_VALUE)
        return None

    def verdict(self, run: AgentRunView) -> Verdict | None:
        """The cap's verdict on ``run`` (None: under the cap, the other caps judge it)."""
        namespace = run.namespace
        return spend_verdict(run, self.spend.spent(namespace), self.cap(namespace), self.spend.day)

    def run_seen(self, run: AgentRunView, *, gone: bool) -> None:
        """An AgentRun as the watch delivered it: when its namespace's spend grew to its
        cap, the runs there with a pod are stepped (each stops at its next step)."""
        if self.spend.run_seen(run, gone=gone) and self._at_cap(run.namespace):
            for namespace, name in self.spend.active_in(run.namespace):
                self._requeue(namespace, name, 0.0)

    async def refresh(self, run: AgentRunView) -> None:
        """Before a step: a bad annotation on the run's namespace is said once, as a
        Warning Event on the run (the namespace's annotations are read by :mod:`.places`)."""
        _, problem = self._annotated(run.namespace)
        if problem is None or (run.namespace, problem) in self._told:
            return
        self._told.add((run.namespace, problem))
        _log.warning("%s", problem)
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "metadata": {"name": run.name, "namespace": run.namespace, "uid": run.uid},
        }
        event = RunEvent("Warning", "InvalidSpendCap", problem)
        await asyncio.to_thread(self._cluster.post_event, body, event)

    async def look(self) -> None:
        """At each resync: read the annotations of the namespaces the cap holds runs in
        (a raised cap shows here), then step the held runs the cap now lets go (the day
        rolled over, or the cap was raised) and the runs with a pod in a namespace now
        at its cap (the cap was lowered)."""
        held = self.spend.held()
        if self._annotations is not None:
            for namespace in sorted({namespace for namespace, _ in held}):
                await asyncio.to_thread(self._annotations.read, namespace)
        for namespace, name in held:
            if not self._at_cap(namespace):
                self._requeue(namespace, name, 0.0)
        for namespace in self.spend.namespaces():
            if self._at_cap(namespace):
                for key in self.spend.active_in(namespace):
                    self._requeue(*key, 0.0)

    # ------------------------------------------------------------------ internals
    def _at_cap(self, namespace: str) -> bool:
        return at_cap(self.spend.spent(namespace), self.cap(namespace))

    def _annotated(self, namespace: str) -> tuple[float | None, str | None]:
        """The namespace's own cap from its annotation, or what is wrong with it."""
        if self._annotations is None:
            return None, None
        value = self._annotations.annotation(namespace, SPEND_ANNOTATION)
        try:
            where = f"annotation {SPEND_ANNOTATION} of Namespace {namespace}"
            return parse_spend_cap(value, where), None
        except ValueError as error:
            holds = (
                f"{CHART_VALUE} (${self._chart_cap:.2f}) holds"
                if self._chart_cap is not None
                else "no daily spend cap holds"
            )
            return None, f"{error}: ignored, {holds}; fix or remove the annotation"
