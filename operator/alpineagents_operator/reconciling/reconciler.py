"""Carries out reconcile steps: read what is, :func:`decide`, do what it says.

One :class:`Reconciler` serves the whole operator. Steps of one AgentRun never overlap
(a lock per run), a request that arrives while another is already queued for the same
run is dropped (the queued one reads everything afresh when it starts), and after a
step that changed something the next step follows at once, so "pod lost" →
"Interrupted" → (zero backoff) → "replacement created" happens within one call; that
next step starts from what the one before read and was answered (the saved State, the
run as its status patch returned it, the pods) instead of reading them again. What a
step decided is carried out by :class:`~.actions.Actions`. Nothing here is the truth
about a run: that is the AgentRun's status and the store. What this class keeps in
memory (locks, timers, each pod's last view; when a loss was seen, in its Actions) only
makes it faster.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from alpineagents import Store, open_store
from alpineagents_operator.credentials import saved_state, state_expiry
from alpineagents_operator.credentials.credential_issuer import RunCredentialIssuer
from alpineagents_operator.credentials.run_stores import RunStores
from alpineagents_operator.credentials.store_policy import guarded_opener, store_refusal
from alpineagents_operator.deciding.decide import Decision, decide, refused
from alpineagents_operator.kube.cluster import CALL_THREADS, Cluster, failure_text
from alpineagents_operator.kube.config import OperatorConfig
from alpineagents_operator.kube.metrics import OperatorMetrics
from alpineagents_operator.kube.pods import store_url
from alpineagents_operator.kube.views import (
    JSON,
    AgentRunView,
    PodView,
    SavedView,
    labels_pods,
)
from alpineagents_operator.reconciling.actions import Actions
from alpineagents_operator.reconciling.notifier import Notifier
from alpineagents_operator.reconciling.places import Places
from alpineagents_operator.reconciling.retention import Retention
from alpineagents_operator.warm_pool.standby_pool import StandbyPool
from alpineagents_operator.watching.refusals import run_refusal
from alpineagents_operator.watching.resumes import Resumes
from alpineagents_operator.watching.triage import Triage
from alpineagents_operator.watching.watched import RunKey, Watched

_log = logging.getLogger(__name__)
_MAX_STEPS = 8  # per call; a healthy run converges in 3 (lost → Interrupted → resumed)

_MAX_POD_VIEWS = 20_000
_CHECKS_PER_YIELD = 200
"""Runs the resync checks between two yields to the event loop (a watch event waits at
most that many :func:`decide` calls)."""
_SOON_RETRY_SECONDS = 2.0
"""A failed step of a watch event is taken again after this, doubling with each failure in
a row up to the resync period (kopf's own retry of a handler was 2 s)."""


@dataclass(frozen=True)
class _Seen:
    """What one step of a reconcile call read or was answered, for the next step of the
    same call: the saved State, and (when the step changed no pod) the run as its status
    patch was answered and the pods it listed."""

    saved: SavedView | None = None
    body: JSON | None = None
    pods: list[JSON] | None = None


def _utc_now() -> datetime:
    return datetime.now(UTC)


class Reconciler:
    """Reconciles AgentRuns by key (namespace, name); safe to call from any handler."""

    def __init__(
        self,
        config: OperatorConfig,
        cluster: Cluster,
        metrics: OperatorMetrics | None = None,
        *,
        clock: Callable[[], datetime] = _utc_now,
        open_store: Callable[[str], Store] = open_store,
        watched: Watched | None = None,
        pool: StandbyPool | None = None,
    ) -> None:
        self.config = config
        self.watched = watched
        """What the watches last delivered (None: every resync and resume reads each run
        from the API server and steps it)."""
        self.cluster = cluster
        self.metrics = metrics or OperatorMetrics()
        self._clock = clock
        # Every store the operator opens passes the policy first: its key goes nowhere else.
        self.stores = RunStores(config, self.metrics, guarded_opener(open_store, config))
        """Reads and claims the runs' States."""
        self._locks: dict[RunKey, asyncio.Lock] = {}
        self._queued: set[RunKey] = set()
        self._soon: dict[RunKey, bool] = {}
        """Runs whose step a watch event asked for, waiting for one of the step workers,
        and whether it is taken whatever the views say (False: only if they say a step
        would change something, judged when a worker takes it)."""
        self._soon_keys: asyncio.Queue[RunKey] = asyncio.Queue()
        self._soon_workers: list[asyncio.Task[None]] = []
        self._soon_failures: dict[RunKey, int] = {}
        self._timers: dict[RunKey, tuple[float, asyncio.TimerHandle]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._resync_errors: dict[RunKey, str] = {}
        """The last error each run's resync step logged (so it is logged once)."""
        self._pod_views: dict[str, PodView] = {}
        """Each pod's view at its last watch event, by uid (see :meth:`pod_changed`)."""
        self._runless_before: set[RunKey] = set()
        """Runs with pods but no AgentRun in the views at the last resync round."""
        self.credentials = RunCredentialIssuer(
            config, cluster, clock=clock, open_store=self.stores.store
        )
        """Gives each pod its own short-lived store credentials (see its module)."""
        self.places = Places(config, cluster, self.requeue, self.metrics, clock)
        """Places under the admission caps (see :mod:`.admission`)."""
        self.triage = Triage(
            watched,
            config,
            self.metrics,
            self.credentials,
            clock=clock,
            failing=lambda key: key in self._resync_errors,
            requeue=self.requeue,
            admission=self.places.verdict,
        )
        """Which watch events and runs need a step, judged from :attr:`watched`."""
        self.pool = pool or StandbyPool(config, cluster)
        """The warm pool's standbys (none unless ``config.warm_pool``)."""
        self.actions = Actions(
            config,
            cluster,
            self.metrics,
            self.stores,
            self.credentials,
            self.pool,
            self.requeue,
            clock=clock,
        )
        """Carries out the decisions (see :mod:`.actions`)."""
        self.notifier = Notifier(config, cluster, clock)
        """Sends runs' end notifications (``spec.notify``), with tasks of its own."""
        self.retention = Retention(config, cluster, clock)
        """Deletes finished runs after their TTL, paced, with a task of its own."""
        self.last_step_at = 0.0
        """Monotonic time of the last finished step (the liveness probe reports it)."""
        self.resumes: Resumes | None = None
        """The runs kopf resumes at the start, judged from :attr:`watched` (its task is
        :meth:`Resumes.run`); None without :attr:`watched`: each is stepped."""
        if watched is not None:
            self.resumes = Resumes(
                watched,
                cluster.list_run_pods_page,
                self._listed_namespaces(),
                config.watches_namespace,
                lambda key: self.triage.step_needed_by_key(key, "resume"),
                self.step_logged,
                steps_at_once=CALL_THREADS,
            )

    # ------------------------------------------------------------------ entry points
    async def reconcile(self, namespace: str, name: str) -> None:
        """Bring one AgentRun a few steps closer to what it asks for."""
        key = (namespace, name)
        if key in self._queued:
            return  # a queued call will read the newest state anyway
        lock = self._locks.setdefault(key, asyncio.Lock())
        self._queued.add(key)
        try:
            await lock.acquire()
        finally:
            self._queued.discard(key)
        try:
            seen = _Seen()
            for _ in range(_MAX_STEPS):
                decision, seen = await self._step(namespace, name, seen)
                if decision is None or not decision.acts:
                    break
                if decision.requeue_after is not None and decision.requeue_after > 0:
                    break
            else:
                _log.warning("%s/%s: still changing after %d steps", namespace, name, _MAX_STEPS)
                self.requeue(namespace, name, 1.0)
        finally:
            try:
                await self.actions.posted(key)
            finally:
                lock.release()
                if key not in self._queued:  # nobody waits for it (waiters are queued)
                    self._locks.pop(key, None)
                self.last_step_at = time.monotonic()

    async def pod_changed(
        self, namespace: str, run_name: str, pod: JSON, *, gone: bool, listed: bool = False
    ) -> None:
        """A watch event of one of a run's pods: reconcile the run, unless the pod looks
        as it did at its last event (a new IP or a readiness probe changes nothing that
        :func:`decide` reads; skipping those keeps a burst of lost pods from queueing
        steps that find nothing to do). A ``listed`` pod (from a watch's initial list,
        not a change) is stepped only if :meth:`.Triage.listed_pod_needs_step` says so;
        nor is a replaced pod's end (see :meth:`.Triage.replaced_pod_ending`)."""
        news = self._pod_news(namespace, run_name, pod, gone=gone, listed=listed)
        if news is None:
            return
        view, stepped = news
        if stepped:
            await self.reconcile(namespace, run_name)
        self._remember_pod(view, gone)  # after the step: a failed one is not skipped

    def pod_event(
        self, namespace: str, run_name: str, pod: JSON, *, gone: bool, listed: bool = False
    ) -> None:
        """:meth:`pod_changed` for kopf's pod handler: the step, if one is needed, is
        taken by a step worker (:meth:`reconcile_soon`), so kopf's worker lets go of the
        pod's body at once instead of holding it until the step is done. The worker takes
        it only if the views (this event's pod among them) then say it would change
        something: the ADDED event of a pod the run's own step just created asked for a
        step that found nothing to do, and with 10,000 runs created at once those steps
        (a read of the run and a listing of its pods each) were still queued minutes after
        every run had its pod."""
        news = self._pod_news(namespace, run_name, pod, gone=gone, listed=listed)
        if news is None:
            return
        view, stepped = news
        if stepped:
            self.reconcile_soon(namespace, run_name, if_needed=True)
        self._remember_pod(view, gone)  # a failed step is taken again by reconcile_soon

    def _pod_news(
        self, namespace: str, run_name: str, pod: JSON, *, gone: bool, listed: bool
    ) -> tuple[PodView, bool] | None:
        """The pod's view and whether its run needs a step for this event (the views
        updated); None when the pod looks as it did at its last event."""
        view = PodView.from_pod(pod)
        if not gone and view.uid and self._pod_views.get(view.uid) == view:
            return None
        if self.watched is not None:
            self.watched.pod_seen((namespace, run_name), view, gone=gone)
        if listed:
            stepped = self.triage.listed_pod_needs_step((namespace, run_name))
        else:
            stepped = not self.triage.replaced_pod_ending((namespace, run_name), view, gone)
        return view, stepped

    def _remember_pod(self, view: PodView, gone: bool) -> None:
        if gone:
            self._pod_views.pop(view.uid, None)
        elif view.uid:
            if len(self._pod_views) >= _MAX_POD_VIEWS:
                # Pods whose deletion the watch missed: forgetting all costs one step each.
                self._pod_views.clear()
            self._pod_views[view.uid] = view

    def reconcile_soon(self, namespace: str, name: str, *, if_needed: bool = False) -> None:
        """Reconcile the run from one of :data:`CALL_THREADS` step workers of the
        operator's own, instead of in the caller (a kopf handler).

        A kopf handler that awaited its step kept kopf's worker for that object, and
        with it the object's body and kopf's cause (its diff, patch and logger), until
        the step was done: with thousands of runs created at once, thousands of those
        waited side by side for the operator's API threads, and the AgentRun's own
        status events queued behind them, so its view stayed without the status its
        step had written and the resync stepped it again. Here a run waiting for its
        step is only its key (once, however many events asked), and at most
        :data:`CALL_THREADS` steps hold a body at a time. A step that fails is taken
        again after :data:`_SOON_RETRY_SECONDS`, doubling, as kopf retried the handler.

        ``if_needed``: the step is taken only if, when a worker takes it, the views say
        it would change something (:meth:`.Triage.step_needed`, as the resync judges).
        """
        key = (namespace, name)
        if key in self._soon:
            # Its step has not started: it will read whatever changed since.
            self._soon[key] = self._soon[key] or not if_needed
            return
        self._soon[key] = not if_needed
        self._soon_keys.put_nowait(key)
        if not self._soon_workers:
            # In a context of their own: one made in a kopf handler would keep that
            # handler's cause (the body among it) for as long as the worker lives.
            self._soon_workers = [
                asyncio.create_task(self._step_soon(), context=contextvars.Context())
                for _ in range(CALL_THREADS)
            ]

    async def _step_soon(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            key = await self._soon_keys.get()
            forced = self._soon.pop(key, True)  # an event from now on asks for another step
            try:
                if not forced and not self.triage.step_needed_by_key(key, "event"):
                    continue
                await self.step_logged(key)  # logs a failure once while it stays the same
            finally:
                self._soon_keys.task_done()
            if key in self._resync_errors:
                failures = self._soon_failures[key] = self._soon_failures.get(key, 0) + 1
                delay = min(
                    _SOON_RETRY_SECONDS * 2.0 ** (failures - 1),
                    max(_SOON_RETRY_SECONDS, self.config.resync_seconds),
                )
                loop.call_later(delay, self.reconcile_soon, *key, context=contextvars.Context())
            else:
                self._soon_failures.pop(key, None)

    async def steps_taken(self) -> None:
        """Return once every step :meth:`reconcile_soon` was asked for has been taken
        (failed ones included; their retries are asked for later)."""
        await self._soon_keys.join()

    def requeue(self, namespace: str, name: str, delay: float) -> None:
        """Reconcile the run again after ``delay`` seconds (keeps the soonest request)."""
        key = (namespace, name)
        loop = asyncio.get_running_loop()
        when = loop.time() + max(0.0, delay)
        pending = self._timers.get(key)
        if pending is not None:
            if pending[0] <= when:
                return
            pending[1].cancel()

        def fire() -> None:
            self._timers.pop(key, None)
            task = loop.create_task(self.reconcile(namespace, name))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        # In a context of its own: a timer set in a kopf handler would otherwise keep that
        # handler's cause (the run's body, kopf's patch and diff) until it fires.
        self._timers[key] = (when, loop.call_at(when, fire, context=contextvars.Context()))

    async def resync(self) -> None:
        """Reconcile every AgentRun in the watched namespaces that needs it (the safety net
        for a step that failed, a timer lost, an event that never came).

        With :attr:`watched` the runs and their pods are the watches' views, and only the
        runs :meth:`.Triage.step_needed` picks are stepped (each step reading afresh); without,
        every run is listed from the API server and stepped."""
        seen: set[RunKey] = set()
        await self.places.look()  # runs held by the daily spend cap: the day, the cap
        if self.watched is not None:
            # From the watches, and a step only where one would change something: no
            # request for a run that is as it should be.
            for count, run in enumerate(self.watched.all_runs(), 1):
                key = (run.namespace, run.name)
                seen.add(key)
                if key in self._soon:
                    # Its step is asked for and reads afresh when it comes: runs created by
                    # the thousand wait there, and the round would step each twice.
                    continue
                if self.triage.step_needed(run, self.watched.pods_of(key), "resync"):
                    await self.step_logged(key)
                elif count % _CHECKS_PER_YIELD == 0:
                    await asyncio.sleep(0)  # let the watches' events in between
            # A run whose pods the views hold but not the run itself, at this round and
            # the one before: stepped (it finds the run, or stops the pods of none). One
            # round alone may be a run kopf's listing has not shown yet.
            runless = set(self.watched.runless_pods())
            for key in sorted(runless & self._runless_before):
                if self.watched.run(key) is None:
                    seen.add(key)
                    await self.step_logged(key)
            self._runless_before = runless
        else:
            for namespace in self._listed_namespaces():
                bodies = await asyncio.to_thread(self.cluster.list_runs, namespace)
                for body in bodies:
                    meta = body.get("metadata") or {}
                    key = (str(meta.get("namespace")), str(meta.get("name")))
                    seen.add(key)
                    await self.step_logged(key)
        for gone in set(self._resync_errors) - seen:
            del self._resync_errors[gone]
        await self.pool.keep_namespaces({namespace for namespace, _ in seen})

    def _listed_namespaces(self) -> list[str | None]:
        """Named namespaces are listed one by one (a namespaced Role allows no more); only
        when there are none (cluster-wide, or glob patterns only) is the whole cluster."""
        named: list[str | None] = list(self.config.named_namespaces)
        return named or [None]

    async def step_logged(self, key: RunKey) -> None:
        """One run's step for the resync (or the start, or a watch event's step worker).
        Its failure is that run's alone: it is logged (once while it stays the same), the
        caller goes on with the next run, and the next resync steps this one again."""
        try:
            await self.reconcile(*key)
        except Exception as error:  # any failure: one bad run must not end the net for all
            text = failure_text(error)
            if self._resync_errors.get(key) != text:
                _log.warning("%s/%s: resync step failed (%s); other runs go on", *key, text)
            self._resync_errors[key] = text
        else:
            self._resync_errors.pop(key, None)

    async def resumed(self, namespace: str, name: str) -> None:
        """kopf met the run in its first listing (the operator started): with
        :attr:`watched`, queue it for :attr:`resumes` (judged from the views once the
        pods are listed); without, step it."""
        if self.resumes is not None:
            self.resumes.add((namespace, name))
            return
        await self.reconcile(namespace, name)
        self.metrics.checks.labels(source="resume", stepped="true").inc()  # once it is done

    def run_seen(self, body: JSON, *, gone: bool) -> None:
        """A watch event of an AgentRun: keep its view for the resync and the places."""
        view = AgentRunView.from_body(body)
        if self.watched is not None:
            self.watched.run_seen(view, gone=gone)
        if gone:
            self.triage.run_gone((view.namespace, view.name))
        self.places.run_seen(view, gone=gone)
        self.notifier.run_seen(view, gone=gone)
        self.retention.run_seen(view, gone=gone)

    def close(self) -> None:
        for _, handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        for task in [*self._tasks, *self._soon_workers]:
            task.cancel()
        self.pool.close()
        self.notifier.close()
        self.retention.close()
        self.places.close()

    async def stop_run(self, namespace: str, name: str) -> int:
        """Delete a deleted run's live pods gracefully; returns how many pods still
        exist (the onDelete=Delete handler waits for 0 before deleting the State)."""
        if not labels_pods(name):
            return 0  # no pod can carry its name (and a selector by it is refused)
        pods = await asyncio.to_thread(self.cluster.list_pods, namespace, name)
        remaining = 0
        for raw in pods:
            pod = PodView.from_pod(raw)
            if pod.alive:
                remaining += 1
                if not pod.deleting:
                    await asyncio.to_thread(self.cluster.delete_pod, namespace, pod.name)
        return remaining

    async def delete_saved_state(self, body: JSON) -> None:
        """Delete the saved State of a deleted AgentRun (``onDelete: Delete``), or leave
        it to the bucket's lifecycle rule (``onDelete: Expire``)."""
        run = AgentRunView.from_body(body)
        url = store_url(run, self.config)
        refused = store_refusal(url, self.config)
        if refused is not None:
            # The operator never wrote there: there is nothing of this run's to delete.
            _log.warning("%s/%s: saved State not deleted: %s", run.namespace, run.name, refused)
            return
        store = self.stores.store(url)
        if run.on_delete == "Expire":
            days = self.config.store_retention_days
            what = await asyncio.to_thread(state_expiry.leave_to_rule, store, run.state_id, days)
            _log.info("%s/%s: saved State %s %s", run.namespace, run.name, run.state_id, what)
            return
        await asyncio.to_thread(saved_state.delete_state, store, run.state_id)
        _log.info("%s/%s: deleted saved State %s", run.namespace, run.name, run.state_id)

    async def keep_expiry_rule(self, days: int) -> None:
        """Put the configured store's lifecycle rule for ``onDelete: Expire`` on its
        bucket, trying again until the store answers (:mod:`.state_expiry`)."""
        await state_expiry.keep_expiry_rule(self.stores.store(self.config.store), days)

    # ------------------------------------------------------------------ one step
    async def _step(self, namespace: str, name: str, seen: _Seen) -> tuple[Decision | None, _Seen]:
        """One step, reading what ``seen`` (from the previous step of the same call) does
        not already hold; returns the decision carried out and what the next step may
        take from this one."""
        body = seen.body
        if body is None:
            body = await asyncio.to_thread(self.cluster.get_run, namespace, name)
        if body is None:
            # The AgentRun is gone: its pods must not run on (garbage collection does
            # this too, where there is a controller-manager; this is quicker).
            await self.stop_run(namespace, name)
            self.places.gone((namespace, name))
            self.metrics.record_phase(namespace, name, None)
            self.actions.forget((namespace, name))
            return None, _Seen()
        run = AgentRunView.from_body(body)
        refusal = run_refusal(run, self.config)
        if refusal is not None:
            # Before anything reads a store or a pod: a refused run costs one status patch.
            _log.warning(
                "%s/%s: refused (%s): %s", namespace, name, refusal.reason, refusal.message
            )
            decision = refused(run, run.status.attempt + 1, refusal, self._clock())
            applied, answered = await self.actions.apply(run, body, decision)
            return applied, _Seen(body=answered)
        raw_pods = seen.pods
        if raw_pods is None:
            raw_pods = []
            if labels_pods(name):  # else no pod can exist, and a selector by it is refused
                raw_pods = await asyncio.to_thread(self.cluster.list_pods, namespace, name)
        pods = [PodView.from_pod(p) for p in raw_pods]
        saved = seen.saved
        await self.places.refresh(run)
        verdict = self.places.verdict(run)
        decision = decide(run, pods, None, self._clock(), verdict)
        if decision.needs_saved:
            if saved is None or saved.error is not None:
                saved = await self.stores.read_saved(run)
            decision = decide(run, pods, saved, self._clock(), verdict)
        # Taken with nothing awaited since the verdict: two runs never take one place.
        decision = self.places.take(
            run, decision, lambda given: decide(run, pods, saved, self._clock(), given)
        )
        applied, answered = await self.actions.apply(
            run, body, decision, lambda after: decide(run, pods, after, self._clock(), verdict)
        )
        self.places.applied(run, applied)
        renew_in = await self.credentials.renew_if_due(run, pods)
        if renew_in is not None:
            self.requeue(namespace, name, renew_in)
        if applied.create_pod is not None or applied.delete_pods:
            return applied, _Seen()  # the pods changed, and a new one may write: read afresh
        return applied, _Seen(saved=saved, body=answered, pods=raw_pods)
