"""The kopf handlers: each one a few lines that hand an AgentRun to the :class:`Reconciler`.

The operator's running parts (its :class:`Reconciler` and its tasks) live in kopf's
``memo``: the startup handler puts them in the operator-wide memo, and kopf hands each
handler a shallow copy of it, so every handler reaches the same Reconciler.

What triggers a reconcile step of a run:

- ``@kopf.on.create`` / ``on.update`` (spec changes: suspend, approvals) of the AgentRun.
- ``@kopf.on.resume`` (the operator started): the run is judged from the views once the
  run pods are all in them, and stepped only if that would change something
  (:mod:`.resumes`).
- ``@kopf.on.event`` of any pod labelled ``alpineagents.dev/run`` (the watch is filtered
  by that label on the server): the pod's run is reconciled, unless the pod looks to
  :func:`decide` as it did at its last event, or the views (this pod as the event shows
  it) say the step would change nothing. This is how a lost pod is noticed within one
  watch event. No kopf finalizers or annotations are put on pods.
- ``@kopf.on.event`` of a warm pool's waiting standby pod that ended or goes: the pool
  starts another (:mod:`.standby_pool`).
- The DELETED event of an AgentRun, so its pods stop even without a garbage collector.
- With ``ALPINEAGENTS_SCHEDULES=true``, every event of an AgentSchedule, and of an
  AgentRun one created: the schedule is stepped
  by the :class:`.ScheduleKeeper`'s task (:mod:`.schedule_keeper`), which also wakes at
  each schedule's next time.
- A resync loop every ``ALPINEAGENTS_RESYNC_SECONDS`` over all AgentRuns: the safety
  net for a missed event. It is a plain background task rather than ``@kopf.timer``
  because kopf puts a finalizer on every object that has a timer, and an AgentRun should
  not need the operator to be running to be deleted.

The event handlers do not wait for the steps they ask for: a step worker of the
operator's own takes each (:meth:`.Reconciler.reconcile_soon`), so kopf's worker for an
object lets go of its body at once. With thousands of runs created at once, handlers that
waited held every body and kopf's cause side by side (the operator's peak memory), and a
run's own status events queued behind its handler, so the resync saw it without the status
its step had written and stepped it again.

The event handlers keep what the watches deliver (every AgentRun, every run pod under
its run: :mod:`.watched`). The resync, the resumes and the pods of a watch's listing
step only the runs whose views say a step would change something, so an idle or a
restarted operator makes no requests per run: its API traffic is its watches, its
Lease and one paged listing of the run pods at its start, however many runs there are.

Deletion: ``@kopf.on.delete(optional=True)`` stops the pods gracefully when kopf sees
the deletion; only an AgentRun with ``spec.onDelete: Delete`` (or ``Expire``) gets a
finalizer (``alpineagents.dev/delete-saved-state``), held until its pods have stopped and
its saved State is deleted (or tagged for the bucket's lifecycle rule).

Several replicas elect one leader through a Lease before kopf starts (see
:mod:`.leadership`): only the leader runs these handlers. kopf's own peering
(``ALPINEAGENTS_PEERING``) is off by default.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import kopf

from alpineagents_operator.kube.cluster import CALL_THREADS, Cluster, api_client_from_environment
from alpineagents_operator.kube.config import OperatorConfig
from alpineagents_operator.kube.metrics import OperatorMetrics
from alpineagents_operator.kube.pods import MANAGED_BY, MANAGED_BY_LABEL
from alpineagents_operator.kube.schedule_api import ScheduleApi
from alpineagents_operator.kube.schedule_names import SCHEDULE_PLURAL
from alpineagents_operator.kube.views import GROUP, PLURAL, RUN_LABEL, STANDBY_LABEL, VERSION
from alpineagents_operator.reconciling.reconciler import Reconciler
from alpineagents_operator.reconciling.schedule_keeper import (
    ScheduleKeeper,
    clock_from_env,
    poll_seconds_from_env,
    schedules_enabled_from_env,
)
from alpineagents_operator.reconciling.throttling import ThrottleWatch
from alpineagents_operator.warm_pool.standby_pool import StandbyView
from alpineagents_operator.watching.resumes import PAGE
from alpineagents_operator.watching.watched import Watched

_log = logging.getLogger(__name__)
FINALIZER = f"{GROUP}/delete-saved-state"
_KOPF_PREFIX = f"kopf.{GROUP}"


_MEMO_KEY = "alpineagents"


@dataclass
class _Running:
    """What the startup handler starts, kept in kopf's memo until cleanup."""

    config: OperatorConfig
    reconciler: Reconciler
    tasks: list[asyncio.Task[None]]
    """The resync loop and the start's judging of resumed runs."""
    schedules: ScheduleKeeper | None
    """Steps the AgentSchedules (its task is among ``tasks``); None: schedules are off."""


def _running(memo: kopf.Memo) -> _Running | None:
    running = memo.get(_MEMO_KEY)
    return running if isinstance(running, _Running) else None


def _reconciler(memo: kopf.Memo) -> Reconciler:
    running = _running(memo)
    if running is None:
        raise kopf.TemporaryError("the operator is still starting", delay=1)
    return running.reconciler


def _schedules(memo: kopf.Memo) -> ScheduleKeeper | None:
    running = _running(memo)
    if running is None:
        raise kopf.TemporaryError("the operator is still starting", delay=1)
    return running.schedules


def _namespaced(namespace: str | None) -> str:
    if not namespace:  # AgentRuns and pods are namespaced: kopf always passes one
        raise kopf.PermanentError("a namespaced object arrived without a namespace")
    return namespace


def apply_settings(settings: kopf.OperatorSettings, config: OperatorConfig) -> None:
    """Put the operator's kopf settings in place (called at startup)."""
    # kopf posts its own log lines as Events from this level up; ours are posted explicitly.
    settings.posting.level = logging.WARNING
    # Watches end server-side before the client gives up on them, so a quiet watch is
    # renewed cleanly instead of timing out as an error.
    settings.watching.server_timeout = 270
    settings.watching.client_timeout = 300
    settings.watching.connect_timeout = 10
    # Run pods only; with a warm pool its waiting standbys too (they have no run yet).
    settings.watching.label_selectors["v1", "pods"] = (
        f"{MANAGED_BY_LABEL}={MANAGED_BY}" if config.warm_pool > 0 else RUN_LABEL
    )
    # At the start kopf lists every run and run pod and hands each to a worker task of
    # its own, which keeps the object's body until it has idled this long: with 10,000
    # runs, kopf's default 5 s kept about every body (the operator's peak memory), and
    # its listing came in one response. In pages, each body let go half a second after
    # its handlers, the start holds a few thousand at most.
    settings.watching.chunk_size = PAGE
    settings.queueing.idle_timeout = 0.5
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=_KOPF_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=_KOPF_PREFIX, key="last-handled-configuration"
    )
    # With exact namespace names there is nothing to discover: scanning would list
    # namespaces and CRDs cluster-wide, which the chart's namespaced RBAC refuses.
    exact = bool(config.namespaces) and config.named_namespaces == config.namespaces
    settings.scanning.disabled = exact
    settings.peering.standalone = not config.peering
    if config.peering:
        settings.peering.name = config.peering
        settings.peering.clusterwide = not config.namespaces


@kopf.on.startup()
async def start(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    config = OperatorConfig.from_env()
    apply_settings(settings, config)
    # Every reconcile step's API and store calls run on the loop's default executor,
    # whose own size (CPUs + 4: 6 on a 2-CPU node) would queue a burst of runs that lost
    # their pods behind a few threads; each call mostly waits on the network.
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(max_workers=CALL_THREADS, thread_name_prefix="reconcile")
    )
    metrics = OperatorMetrics()
    if config.metrics_port:
        metrics.serve(config.metrics_port)
    api_client = await asyncio.to_thread(api_client_from_environment)
    cluster = Cluster(api_client)
    reconciler = Reconciler(config, cluster, metrics, watched=Watched())
    tasks = [asyncio.create_task(_resync_forever(reconciler, config.resync_seconds))]
    schedules = None
    if _SCHEDULES:
        schedules = ScheduleKeeper(
            ScheduleApi(api_client), cluster, clock_from_env(), poll_seconds_from_env()
        )
        tasks.append(asyncio.create_task(schedules.run()))
    if reconciler.resumes is not None:
        tasks.append(asyncio.create_task(reconciler.resumes.run()))
    if config.store_retention_days is not None:
        tasks.append(asyncio.create_task(reconciler.keep_expiry_rule(config.store_retention_days)))
    if config.pacer_url and reconciler.watched is not None:
        throttles = ThrottleWatch(config.pacer_url, cluster, reconciler.watched)
        tasks.append(asyncio.create_task(throttles.run()))
    memo[_MEMO_KEY] = _Running(config, reconciler, tasks, schedules)


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    running = _running(memo)
    memo.pop(_MEMO_KEY, None)
    if running is None:
        return
    for task in running.tasks:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await running.reconciler.notifier.drain()  # a try cut short could not be sent again
    running.reconciler.close()
    running.reconciler.cluster.close()


@kopf.on.probe(id="secondsSinceLastStep")
def last_step(memo: kopf.Memo, **_: Any) -> float | None:
    """For the liveness endpoint: seconds since a reconcile step last finished."""
    running = _running(memo)
    if running is None or not running.reconciler.last_step_at:
        return None
    return round(time.monotonic() - running.reconciler.last_step_at, 3)


@kopf.on.resume(GROUP, VERSION, PLURAL, backoff=2.0)
async def run_resumed(namespace: str | None, name: str, memo: kopf.Memo, **_: Any) -> None:
    await _reconciler(memo).resumed(_namespaced(namespace), name)


@kopf.on.create(GROUP, VERSION, PLURAL, backoff=2.0)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec", backoff=2.0)
async def run_changed(namespace: str | None, name: str, memo: kopf.Memo, **_: Any) -> None:
    _reconciler(memo).reconcile_soon(_namespaced(namespace), name)


@kopf.on.event(GROUP, VERSION, PLURAL)
async def run_event(
    event: kopf.RawEvent, namespace: str | None, name: str | None, memo: kopf.Memo, **_: Any
) -> None:
    gone = event.get("type") == "DELETED"
    reconciler = _reconciler(memo)
    reconciler.run_seen(dict(event.get("object") or {}), gone=gone)
    schedules = _schedules(memo)
    if schedules is not None:
        schedules.run_seen(dict(event.get("object") or {}), gone=gone)
    if gone and name:
        reconciler.reconcile_soon(_namespaced(namespace), name)


async def schedule_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    schedules = _schedules(memo)
    if schedules is not None:
        body = dict(event.get("object") or {})
        schedules.schedule_seen(body, gone=event.get("type") == "DELETED")


# Watched only when on: without schedules.enabled the chart grants nothing on them.
_SCHEDULES = schedules_enabled_from_env()
if _SCHEDULES:
    kopf.on.event(GROUP, VERSION, SCHEDULE_PLURAL)(schedule_event)


@kopf.on.event("v1", "pods", labels={RUN_LABEL: kopf.PRESENT})
async def pod_changed(
    event: kopf.RawEvent,
    body: kopf.Body,
    namespace: str | None,
    labels: kopf.Labels,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    kind = event.get("type")
    _reconciler(memo).pod_event(
        _namespaced(namespace),
        labels[RUN_LABEL],
        dict(body),
        gone=kind == "DELETED",
        listed=kind is None,  # kopf's type for an object of a watch's (re)listing
    )


@kopf.on.event("v1", "pods", labels={STANDBY_LABEL: "true"})
async def standby_changed(
    event: kopf.RawEvent, body: kopf.Body, namespace: str | None, memo: kopf.Memo, **_: Any
) -> None:
    # A waiting standby that ended or goes is replaced (the pool keeps its size).
    if event.get("type") == "DELETED" or StandbyView.from_pod(dict(body)).gone:
        _reconciler(memo).pool.keep_soon(_namespaced(namespace))


@kopf.on.delete(GROUP, VERSION, PLURAL, optional=True)
async def run_deleted(namespace: str | None, name: str, memo: kopf.Memo, **_: Any) -> None:
    await _reconciler(memo).stop_run(_namespaced(namespace), name)


def _deletes_state(spec: kopf.Spec, **_: Any) -> bool:
    """Whether a deletion does something to the saved State (the finalizer's runs)."""
    return spec.get("onDelete") in ("Delete", "Expire")


@kopf.on.delete(GROUP, VERSION, PLURAL, when=_deletes_state, backoff=1.0)
async def delete_saved_state(
    body: kopf.Body, namespace: str | None, name: str, memo: kopf.Memo, **_: Any
) -> None:
    reconciler = _reconciler(memo)
    remaining = await reconciler.stop_run(_namespaced(namespace), name)
    if remaining:
        # Its SIGTERM handler is saving; deleting the State under it would race that save.
        raise kopf.TemporaryError(f"waiting for {remaining} pod(s) to stop", delay=1)
    await reconciler.delete_saved_state(dict(body))


async def _resync_forever(reconciler: Reconciler, period: float) -> None:
    while True:
        await asyncio.sleep(period)
        try:
            await reconciler.resync()
        except Exception:  # the next round tries again; a crash here would end the net
            _log.exception("resync failed")
