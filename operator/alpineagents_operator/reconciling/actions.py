"""Carries out a :class:`~.step.Decision` on the cluster and the store.

:meth:`Actions.apply` does what one step decided, in the order that keeps one writer per
State: the pods to stop deleted first; for a pod to create, a fork's entries copied, then
the State claimed (fenced), the pod's credentials and its spec Secret written at once, and
the pod created (or the run handed to a waiting standby of the warm pool); then the
status patch, the Events (posted while the next step goes on), the metrics and the
requeue. When the API server refuses the pod, the claim fails or the State changed
before the claim, the step carried out is another one (:func:`~.pod_refusals.refused`, or
the decision made again from the State as the claim fenced it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime

from alpineagents_operator.credentials.credential_issuer import RunCredentialIssuer
from alpineagents_operator.credentials.run_stores import RunStores
from alpineagents_operator.deciding.pod_refusals import claim_refusal, pod_refusal, refused
from alpineagents_operator.deciding.step import Decision
from alpineagents_operator.kube.cluster import Cluster, PodRefused
from alpineagents_operator.kube.config import OperatorConfig
from alpineagents_operator.kube.metrics import OperatorMetrics
from alpineagents_operator.kube.pods import (
    pod_manifest,
    spec_secret,
    store_url,
    uses_run_credentials,
)
from alpineagents_operator.kube.views import JSON, AgentRunView, Refusal, RunEvent, SavedView
from alpineagents_operator.reconciling.forks import ForkFrom, copy_for_fork
from alpineagents_operator.warm_pool.handover import NotHanded, Redo, hand_over, pick_standby
from alpineagents_operator.warm_pool.standby_pool import StandbyPool
from alpineagents_operator.watching.watched import RunKey

_log = logging.getLogger(__name__)


async def _nothing() -> None:
    return None


class Actions:
    """Carries out the Reconciler's decisions; keeps what it needs between steps of a run
    (when its replacement became due, its failed claims in a row, Events being posted)."""

    def __init__(
        self,
        config: OperatorConfig,
        cluster: Cluster,
        metrics: OperatorMetrics,
        stores: RunStores,
        credentials: RunCredentialIssuer,
        pool: StandbyPool,
        requeue: Callable[[str, str, float], None],
        *,
        clock: Callable[[], datetime],
    ) -> None:
        self.config = config
        self.cluster = cluster
        self.metrics = metrics
        self.stores = stores
        self.credentials = credentials
        self.pool = pool
        self.requeue = requeue
        self._clock = clock
        self._posting: dict[RunKey, list[asyncio.Task[None]]] = {}
        """Events being posted for a run's running reconcile call."""
        self._due_at: dict[RunKey, float] = {}
        """Monotonic time a replacement pod became due (for the resume-latency metric)."""
        self._claim_failures: dict[RunKey, int] = {}

    async def posted(self, key: RunKey) -> None:
        """Return once the Events of the run's steps so far are posted."""
        posting = self._posting.pop(key, [])
        if posting:
            await asyncio.gather(*posting)

    def forget(self, key: RunKey) -> None:
        """The run is gone: drop what was kept for it."""
        self._due_at.pop(key, None)
        self._claim_failures.pop(key, None)

    async def apply(
        self,
        run: AgentRunView,
        body: JSON,
        decision: Decision,
        redecide: Callable[[SavedView], Decision] | None = None,
        *,
        pool: bool = True,
    ) -> tuple[Decision, JSON | None]:
        """Carry out a decision; returns the one carried out (another one if the API
        server refused the pod it asked for, or if the State changed before its claim),
        and the run as the API server answered its status patch (None: no patch).

        ``redecide`` makes the decision again from another read of the saved State: the
        one after the claim of a decision that claims it."""
        key = (run.namespace, run.name)
        if decision.note and decision.acts:
            _log.info("%s/%s: %s", run.namespace, run.name, decision.note)
        for pod_name in decision.delete_pods:
            await asyncio.to_thread(self.cluster.delete_pod, run.namespace, pod_name)
        if decision.create_pod == 1 and ForkFrom.of(run) and "forkedFrom" not in run.status.raw:
            forked = await self._fork(run)
            if isinstance(forked, Refusal):
                return await self.apply(run, body, refused(run, 1, forked, self._clock()))
            decision = replace(decision, status={**decision.status, "forkedFrom": forked})
        if decision.create_pod is not None:
            standby = await pick_standby(self.pool, run, decision, self.config) if pool else None
            if standby is not None:
                handed = await hand_over(
                    run,
                    decision,
                    standby,
                    pool=self.pool,
                    credentials=self.credentials,
                    fence=lambda: self.stores.fence(run),
                    after_claim=(
                        (lambda: self._decide_after_claim(run, redecide)) if redecide else None
                    ),
                    claim_counted=lambda now, fenced: self._claim_counted(run, now, fenced),
                )
                if isinstance(handed, Redo):
                    return await self.apply(run, body, replace(handed.decision, claim_state=False))
                if isinstance(handed, NotHanded):
                    if handed.refusal is None:  # taken or gone since: a pod of its own
                        return await self.apply(
                            run, body, replace(decision, claim_state=False), pool=False
                        )
                    _log.warning("%s/%s: %s", *key, handed.refusal.message)
                    step = refused(run, decision.create_pod, handed.refusal, self._clock())
                    return await self.apply(run, body, step)
                decision = handed.decision
                self.pool.keep_soon(run.namespace)  # a new standby behind it
                self._replaced(key)
            else:
                applied = await self._create_pod(run, body, decision, redecide)
                if isinstance(applied, tuple):
                    return applied
                decision = applied
        answered = None
        if decision.status:
            answered = await asyncio.to_thread(
                self.cluster.patch_status, run.namespace, run.name, decision.status
            )
        if decision.events:
            # Posted while the next step goes on; the call waits for them before it ends.
            task = asyncio.create_task(self._post_events(body, decision.events))
            self._posting.setdefault(key, []).append(task)
        if decision.lost_reason is not None:
            self.metrics.record_loss(decision.lost_reason, key)
            self._due_at[key] = time.monotonic() + (decision.requeue_after or 0.0)
        phase = decision.status.get("phase", run.status.phase)
        self.metrics.record_phase(run.namespace, run.name, str(phase) if phase else None)
        self.metrics.record_run(*key, run.spec, {**run.status.raw, **decision.status})
        if decision.requeue_after is not None and decision.requeue_after > 0:
            self.requeue(run.namespace, run.name, decision.requeue_after)
        return decision, answered

    async def _fork(self, run: AgentRunView) -> JSON | Refusal:
        """Copy the entries ``spec.forkFrom`` names into the run's State (see :mod:`.forks`)."""
        wanted = ForkFrom.of(run)
        assert wanted is not None
        body = await asyncio.to_thread(self.cluster.get_run, run.namespace, wanted.run)
        source = AgentRunView.from_body(body) if body is not None else None
        store = self.stores.store(store_url(run, self.config))
        return await asyncio.to_thread(copy_for_fork, run, source, store, self.config)

    async def _create_pod(
        self,
        run: AgentRunView,
        body: JSON,
        decision: Decision,
        redecide: Callable[[SavedView], Decision] | None,
    ) -> Decision | tuple[Decision, JSON | None]:
        """Create the decision's pod (its claim, credentials and spec Secret first);
        returns the decision carried out, or what :meth:`_apply` returned for another."""
        key = (run.namespace, run.name)
        assert decision.create_pod is not None
        if uses_run_credentials(run, self.config):
            await self.stores.make_bucket_exist(run)
        # Independent calls to the store and the API server, at once: after a pod's
        # loss they are most of the time until its replacement exists.
        fenced, blocked, secret_refused = await asyncio.gather(
            self.stores.fence(run) if decision.claim_state else _nothing(),
            self.credentials.before_pod(run, body, decision.create_pod),
            self._write_spec_secret(run, decision.create_pod),
        )
        if decision.claim_state and fenced is None and redecide is not None:
            again = await self._decide_after_claim(run, redecide)
            if again is not None and again.create_pod != decision.create_pod:
                # The lost pod saved its answer (or a stop) before it was fenced.
                return await self.apply(run, body, replace(again, claim_state=False))
            decision = again or decision
        assert decision.create_pod is not None
        manifest = pod_manifest(run, decision.create_pod, self.config)
        not_started = await self._not_started(
            run, decision, manifest, fenced, blocked, secret_refused
        )
        if isinstance(not_started, Refusal):
            _log.warning("%s/%s: %s", *key, not_started.message)
            step = refused(run, decision.create_pod, not_started, self._clock())
            return await self.apply(run, body, step)
        created = not_started
        if not created:
            _log.info(
                "%s/%s: pod %s exists already: adopting it",
                *key,
                manifest["metadata"]["name"],
            )
        due = self._due_at.pop(key, None)
        if due is not None and decision.create_pod > 1:
            self.metrics.resume_latency.observe(max(0.0, time.monotonic() - due))
        self.metrics.record_replaced(key)
        return decision

    def _replaced(self, key: RunKey) -> None:
        """A run's replacement pod exists (the resume-latency clock stops)."""
        due = self._due_at.pop(key, None)
        if due is not None:
            self.metrics.resume_latency.observe(max(0.0, time.monotonic() - due))
        self.metrics.record_replaced(key)

    async def _decide_after_claim(
        self, run: AgentRunView, redecide: Callable[[SavedView], Decision]
    ) -> Decision | None:
        """The decision made again from the State as the claim fenced it (None: it could
        not be read; the first decision stands).

        A lost pod still running may save between the operator's read and its claim (a
        call's result that read saw open): what was read then would name that call in
        ``status.abortedCalls`` though its result is saved. Nobody writes after the claim,
        so this read is what the next pod loads.
        """
        after = await self.stores.read_saved(run)
        if after.error is not None:
            return None
        return redecide(after)

    async def _not_started(
        self,
        run: AgentRunView,
        decision: Decision,
        manifest: JSON,
        fenced: str | None,
        blocked: str | None,
        refusal: PodRefused | None,
    ) -> bool | Refusal:
        """Create the decision's pod unless its State could not be claimed, its
        credentials minted or its spec Secret written; returns why it was not started,
        else whether the pod was created (False: it existed already)."""
        attempt = decision.create_pod
        assert attempt is not None
        failed_claim = self._claim_counted(run, decision, fenced)
        if failed_claim is not None:
            return failed_claim
        if blocked is not None:
            return Refusal("CredentialsUnavailable", blocked, final=False)
        if refusal is None:
            try:
                created: bool = await asyncio.to_thread(self.cluster.create_pod, manifest)
                return created
            except PodRefused as error:
                refusal = error
        return pod_refusal(run, attempt, refusal.status, refusal.message)

    def _claim_counted(
        self, run: AgentRunView, decision: Decision, fenced: str | None
    ) -> Refusal | None:
        """The refusal of a failed claim (``fenced``: why), its backoff growing with each
        failure in a row of the run's; None: claimed (the count starts again), or no claim."""
        key = (run.namespace, run.name)
        if fenced is not None:
            assert decision.create_pod is not None
            failures = self._claim_failures[key] = self._claim_failures.get(key, 0) + 1
            return claim_refusal(run, decision.create_pod, fenced, failures)
        if decision.claim_state:
            self._claim_failures.pop(key, None)
        return None

    async def _post_events(self, body: JSON, events: Sequence[RunEvent]) -> None:
        for event in events:
            await asyncio.to_thread(self.cluster.post_event, body, event)

    async def _write_spec_secret(self, run: AgentRunView, attempt: int) -> PodRefused | None:
        """Write the Secret the pod reads its spec from; returns the API server's refusal
        of it (the pod is then refused too)."""
        try:
            await asyncio.to_thread(self.cluster.apply_pod_secret, spec_secret(run, attempt))
        except PodRefused as refusal:
            return refusal
        return None
