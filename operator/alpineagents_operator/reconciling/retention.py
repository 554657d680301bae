"""Retention: finished AgentRuns deleted ``ttlSecondsAfterFinished`` after their end.

A run's ``spec.ttlSecondsAfterFinished`` (else the chart's ``retention.ttlSecondsAfterFinished``,
``ALPINEAGENTS_TTL_SECONDS_AFTER_FINISHED``; neither: kept, as before) counts from its
``status.completedAt``. A run whose end notification is still to be sent waits for it
(:func:`.notifications.settled`). Its saved State then goes as ``spec.onDelete`` says, as
for a deletion by hand: ``Keep`` leaves it in the store, ``Delete`` has the operator's
finalizer delete it first (:mod:`.handlers`), ``Expire`` has it tagged for the bucket's
lifecycle rule (:mod:`.state_expiry`). Where a daily spend cap may be in force, a run
is kept at least until the UTC day its ``status.dailySpend`` counts is over: that status is
where the day's spend is kept (:mod:`.daily_spend`).

Deleting is paced: one deleter task starts at most ``ALPINEAGENTS_DELETES_PER_SECOND`` a
second (four at most under way), on its own (the reconcile steps never wait for it), each
run read again first (its TTL or its end may have changed) and deleted only if it is
still the same object (its uid).
10,000 runs ending at once are a timer each and a line the deleter works through.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from alpineagents_operator.deciding import notifications
from alpineagents_operator.kube.cluster import Cluster
from alpineagents_operator.kube.config import OperatorConfig
from alpineagents_operator.kube.daily_spend import count_ends
from alpineagents_operator.kube.views import TERMINAL_PHASES, AgentRunView, parse_time
from alpineagents_operator.watching.watched import RunKey

_log = logging.getLogger(__name__)
_STATE_GOES = {
    "Keep": "its saved State is kept",
    "Delete": "its saved State too",
    "Expire": "its saved State left to the bucket's lifecycle rule",
}
"""What the log says of the State, by ``spec.onDelete``."""
_IN_FLIGHT = 4
"""Deletions under way at once (each a read and a delete): the pace, not the API's
latency, sets how many go a second."""


def ttl_of(run: AgentRunView, default: int | None) -> int | None:
    """The run's ``spec.ttlSecondsAfterFinished``, else ``default`` (None: kept)."""
    own = run.spec.get("ttlSecondsAfterFinished")
    if isinstance(own, int) and not isinstance(own, bool) and own >= 0:
        return own
    return default


def expires_at(
    run: AgentRunView, default_ttl: int | None, *, spend_cap: bool = False
) -> datetime | None:
    """When the finished run is to be deleted (None: never, or not finished, or its
    notification still to be settled; a run already being deleted: None). With a daily
    spend cap possible (``spend_cap``), not before the UTC day of its spend count ends:
    its status is where that day's spend is kept (:mod:`.daily_spend`)."""
    if run.deleting or run.status.phase not in TERMINAL_PHASES:
        return None
    ttl = ttl_of(run, default_ttl)
    completed = parse_time(run.status.raw.get("completedAt"))
    if ttl is None or completed is None or not notifications.settled(run):
        return None
    at = completed + timedelta(seconds=ttl)
    day_ends = count_ends(run.status.raw) if spend_cap else None
    return max(at, day_ends) if day_ends is not None else at


class Retention:
    """Deletes finished runs at their time, paced."""

    def __init__(
        self, config: OperatorConfig, cluster: Cluster, clock: Callable[[], datetime]
    ) -> None:
        self._enabled = config.retention
        self._default = config.ttl_seconds_after_finished
        self._spend_cap = config.spend_cap_possible
        """A daily spend cap may be in force: a run is kept until its spend day ends."""
        self._pause = 1.0 / config.deletes_per_second
        self._cluster = cluster
        self._clock = clock
        self._timers: dict[RunKey, asyncio.TimerHandle] = {}
        self._due: asyncio.Queue[tuple[RunKey, str]] = asyncio.Queue()
        self._queued: set[RunKey] = set()
        self._deleter: asyncio.Task[None] | None = None
        self._deleting: set[asyncio.Task[None]] = set()
        self.deleted = 0
        """Runs this operator deleted (for its tests and benchmarks)."""

    def run_seen(self, run: AgentRunView, *, gone: bool) -> None:
        """A watch event of ``run``: (re)set its deletion's timer."""
        key = (run.namespace, run.name)
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        when = None if gone or not self._enabled else self._expires_at(run)
        if when is None:
            return
        wait = (when - self._clock()).total_seconds()
        if wait <= 0:
            self._queue(key, run.uid)
            return
        loop = asyncio.get_running_loop()
        self._timers[key] = loop.call_later(
            wait, self._fire, key, run.uid, context=contextvars.Context()
        )

    def _expires_at(self, run: AgentRunView) -> datetime | None:
        return expires_at(run, self._default, spend_cap=self._spend_cap)

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        if self._deleter is not None:
            self._deleter.cancel()
        for task in self._deleting:
            task.cancel()

    def _fire(self, key: RunKey, uid: str) -> None:
        self._timers.pop(key, None)
        self._queue(key, uid)

    def _queue(self, key: RunKey, uid: str) -> None:
        if key in self._queued:
            return
        self._queued.add(key)
        self._due.put_nowait((key, uid))
        if self._deleter is None:
            self._deleter = asyncio.create_task(
                self._delete_forever(), context=contextvars.Context()
            )

    async def _delete_forever(self) -> None:
        # Paced by when each deletion starts (not by a pause after each, which would add
        # the API's latency to every one), with a few in flight so the latency does not
        # cap the pace either; after an idle spell the pace starts afresh, never a burst.
        loop = asyncio.get_running_loop()
        slots = asyncio.Semaphore(_IN_FLIGHT)
        next_at = loop.time()
        while True:
            key, uid = await self._due.get()
            self._queued.discard(key)
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            next_at = max(loop.time(), next_at) + self._pause
            await slots.acquire()
            task = asyncio.create_task(self._delete_logged(key, uid))
            self._deleting.add(task)
            task.add_done_callback(self._deleting.discard)
            task.add_done_callback(lambda _: slots.release())

    async def _delete_logged(self, key: RunKey, uid: str) -> None:
        try:
            await self._delete_if_due(key, uid)
        except Exception as error:  # the next event or the operator's restart retries
            _log.warning("%s/%s: not deleted after its TTL (%s)", *key, error)

    async def _delete_if_due(self, key: RunKey, uid: str) -> None:
        body = await asyncio.to_thread(self._cluster.get_run, *key)
        if body is None:
            return
        run = AgentRunView.from_body(body)
        when = self._expires_at(run)
        if run.uid != uid or when is None:
            return  # another run of that name, or no longer due (its next event says)
        if when > self._clock():
            self.run_seen(run, gone=False)  # its TTL grew
            return
        if await asyncio.to_thread(self._cluster.delete_run, *key, uid):
            self.deleted += 1
            ttl = ttl_of(run, self._default)
            state = _STATE_GOES.get(run.on_delete, _STATE_GOES["Keep"])
            _log.info("%s/%s: deleted %s s after it finished (%s)", *key, ttl, state)
