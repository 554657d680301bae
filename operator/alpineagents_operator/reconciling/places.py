"""The reconciler's side of admission (:mod:`.admission`): a verdict for each step, the
place taken as the step is carried out, and the next in line stepped when one frees.

Without caps (no ``admission.*`` chart value) every call here does nothing and
:meth:`Places.verdict` is None, so :func:`~.decide.decide` never queues a run. A run
labelled with a Kueue LocalQueue is judged by Kueue instead (:mod:`.kueue_admission`),
where it is enabled and served, and holds no place under the caps. The daily spend
cap (:mod:`.spend_cap`) judges every run first, Kueue's too: a namespace at its cap
starts nothing and takes its runs' pods back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime

from alpineagents_operator.deciding.decide import Decision
from alpineagents_operator.kube.admission import NO_PLACE, Admission, Caps, NamespaceCaps, Verdict
from alpineagents_operator.kube.cluster import Cluster
from alpineagents_operator.kube.config import OperatorConfig
from alpineagents_operator.kube.metrics import OperatorMetrics
from alpineagents_operator.kube.views import AgentRunView
from alpineagents_operator.reconciling.kueue_admission import KueueAdmission, WorkloadApi
from alpineagents_operator.reconciling.spend_cap import SpendCaps
from alpineagents_operator.watching.watched import RunKey

__all__ = ["Places"]


class Places:
    """Places under the admission caps, for one operator (the leader)."""

    def __init__(
        self,
        config: OperatorConfig,
        cluster: Cluster,
        requeue: Callable[[str, str, float], None],
        metrics: OperatorMetrics | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._requeue = requeue
        self.kueue: KueueAdmission | None = None
        """None: Kueue does not admit runs here (``admission.kueue.enabled`` off)."""
        if config.kueue:
            api = WorkloadApi(cluster.api_client)
            self.kueue = KueueAdmission(config, api, requeue, cluster.list_pods)
        self._namespace_caps: NamespaceCaps | None = None
        self.ledger: Admission | None = None
        """None: no caps in force."""
        if config.namespace_caps:
            self._namespace_caps = NamespaceCaps(cluster.namespace_annotations)
        self.spend_caps: SpendCaps | None = None
        """None: no daily spend cap can be in force (no chart value, no annotations read)."""
        if config.spend_cap_possible:
            self.spend_caps = SpendCaps(
                config.daily_spend_usd_per_namespace,
                cluster,
                self._namespace_caps,
                requeue,
                clock,
                metrics,
            )
        caps = Caps(config.max_running, config.max_running_per_namespace)
        # With a spend cap alone the ledger keeps the line too (the queue's metric).
        if caps.any or self._namespace_caps is not None or self.spend_caps is not None:
            own = self._namespace_caps
            self.ledger = Admission(caps, own.cap if own is not None else lambda _: None)
            if metrics is not None:
                metrics.watch_admission(self._figures)

    async def refresh(self, run: AgentRunView) -> None:
        """Read the run's namespace's own cap if it is due (off the event loop), and
        bring its Kueue Workload in line with it."""
        namespace = run.namespace
        if self._namespace_caps is not None and self._namespace_caps.due(namespace):
            await asyncio.to_thread(self._namespace_caps.read, namespace)
        if self.spend_caps is not None:
            await self.spend_caps.refresh(run)
        if self.kueue is not None:
            held = self.spend_caps is not None and self.spend_caps.verdict(run) is not None
            await self.kueue.refresh(run, spend_held=held)

    def verdict(self, run: AgentRunView) -> Verdict | None:
        """Whether ``run`` may start a pod now (None: no caps); takes nothing."""
        if self.spend_caps is not None:
            spend = self.spend_caps.verdict(run)
            if spend is not None:
                return spend
        if self._by_kueue(run):
            assert self.kueue is not None
            return self.kueue.verdict(run)
        if self.ledger is None:
            return None
        if run.status.admitted or self.ledger.holds((run.namespace, run.name)):
            return Verdict(True)
        return self.ledger.admit(run, take=False)

    def take(
        self, run: AgentRunView, decision: Decision, redecide: Callable[[Verdict], Decision]
    ) -> Decision:
        """Take the place ``decision`` gives ``run`` (``status.admitted``); if it went
        meanwhile, the decision made again with the verdict that says so."""
        if self.ledger is None or decision.status.get("admitted") is not True:
            return decision
        if self._by_kueue(run):
            return decision
        verdict = self.ledger.admit(run)
        return decision if verdict.admitted else redecide(verdict)

    def applied(self, run: AgentRunView, decision: Decision) -> None:
        """After a step: a place given up (``admitted`` cleared, or a phase that holds
        none, as a run that found its answer saved once it had a place) goes to the next."""
        given_up = "admitted" in decision.status and decision.status["admitted"] is None
        if given_up or decision.status.get("phase") in NO_PLACE:
            self._released((run.namespace, run.name))

    def gone(self, key: RunKey) -> None:
        """``key`` is gone (deleted): its Workload goes, and the next in line is stepped."""
        if self.kueue is not None:
            self.kueue.forget(key)
        self._released(key)

    def _released(self, key: RunKey) -> None:
        if self.ledger is None:
            return
        self.ledger.release(key)
        for namespace, name in self.ledger.next_in_line():
            self._requeue(namespace, name, 0.0)

    def _figures(self) -> tuple[dict[str, int], dict[str, int]]:
        assert self.ledger is not None
        return dict(self.ledger.in_use()), dict(self.ledger.queued())

    def run_seen(self, run: AgentRunView, *, gone: bool) -> None:
        """An AgentRun as the watch delivered it."""
        if self.spend_caps is not None:
            self.spend_caps.run_seen(run, gone=gone)
        if self.ledger is None or self._by_kueue(run):
            return
        self.ledger.run_seen(run, gone=gone)

    async def look(self) -> None:
        """At each resync: the runs the daily spend cap holds, judged again (see
        :meth:`.SpendCaps.look`)."""
        if self.spend_caps is not None:
            await self.spend_caps.look()

    def close(self) -> None:
        """Stop what runs beside the steps (Kueue's Workload watches)."""
        if self.kueue is not None:
            self.kueue.close()

    def _by_kueue(self, run: AgentRunView) -> bool:
        return self.kueue is not None and self.kueue.governs(run)
