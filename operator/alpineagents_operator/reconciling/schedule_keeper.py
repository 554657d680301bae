"""Carries out :func:`.schedules.plan` for every AgentSchedule the operator watches.

One task steps the schedules, one at a time: a schedule whose next time has come, one
that changed (its generation), and one whose run ended or went (the watches tell it,
through :meth:`ScheduleKeeper.schedule_seen` and :meth:`ScheduleKeeper.run_seen`). Each
step reads the schedule and its runs afresh, so it gives the same answer after a restart
or a missed event; a run's name comes from its scheduled time, so a step repeated by a
retry or by a second operator creates nothing twice (the create answers 409).

Only the leader runs kopf (see :mod:`.leadership`), so only the leader steps schedules.
A plain task rather than ``@kopf.timer``, because kopf puts a finalizer on every object
with a timer, and a schedule should not need the operator running to be deleted.

It runs only with ``ALPINEAGENTS_SCHEDULES=true`` (the chart's ``schedules.enabled``,
which grants the permissions it needs). The clock is :func:`clock_from_env`: the real one, or (tests only) the time written in the
file ``ALPINEAGENTS_SCHEDULE_CLOCK_FILE``, so a test moves time on without waiting.
``ALPINEAGENTS_SCHEDULE_POLL_SECONDS`` (default 30) bounds how long the task sleeps
between looks (it also wakes at the next scheduled time and on every watch event).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from alpineagents_operator.deciding.cron import InvalidSchedule
from alpineagents_operator.deciding.schedules import (
    ScheduledRun,
    plan,
    read_schedule,
    ready_condition,
    run_manifest,
    run_reference,
    stamp,
    status_changes,
)
from alpineagents_operator.kube.cluster import Cluster, failure_text
from alpineagents_operator.kube.schedule_api import RunRefused, ScheduleApi
from alpineagents_operator.kube.schedule_names import SCHEDULE_LABEL
from alpineagents_operator.kube.views import JSON, TERMINAL_PHASES, RunEvent, parse_time

_log = logging.getLogger(__name__)
Clock = Callable[[], datetime]
_Key = tuple[str, str]


def clock_from_env(env: Mapping[str, str] | None = None) -> Clock:
    """The schedules' clock: ``datetime.now`` in UTC, or the RFC 3339 time held in the file
    named by ``ALPINEAGENTS_SCHEDULE_CLOCK_FILE`` (for tests), read at each call."""
    env = os.environ if env is None else env
    path = env.get("ALPINEAGENTS_SCHEDULE_CLOCK_FILE", "").strip()
    if not path:
        return lambda: datetime.now(UTC)

    def from_file() -> datetime:
        moment = parse_time(Path(path).read_text().strip())
        if moment is None:
            raise ValueError(f"ALPINEAGENTS_SCHEDULE_CLOCK_FILE {path} holds no RFC 3339 time")
        return moment

    return from_file


def schedules_enabled_from_env(env: Mapping[str, str] | None = None) -> bool:
    """``ALPINEAGENTS_SCHEDULES``: whether this operator acts on AgentSchedules (the
    chart's ``schedules.enabled``, which also grants what that needs; default false)."""
    env = os.environ if env is None else env
    text = env.get("ALPINEAGENTS_SCHEDULES", "").strip().lower()
    if text not in ("", "true", "false"):
        raise ValueError(f"ALPINEAGENTS_SCHEDULES must be true or false, got {text!r}")
    return text == "true"


def poll_seconds_from_env(env: Mapping[str, str] | None = None) -> float:
    """``ALPINEAGENTS_SCHEDULE_POLL_SECONDS`` (default 30)."""
    env = os.environ if env is None else env
    text = env.get("ALPINEAGENTS_SCHEDULE_POLL_SECONDS", "").strip()
    try:
        seconds = float(text) if text else 30.0
    except ValueError:
        raise ValueError(
            f"ALPINEAGENTS_SCHEDULE_POLL_SECONDS must be a number of seconds, got {text!r}"
        ) from None
    if seconds <= 0:
        raise ValueError(f"ALPINEAGENTS_SCHEDULE_POLL_SECONDS must be above 0, got {text!r}")
    return seconds


@dataclass
class _Known:
    generation: int = -1
    next_step_at: datetime | None = None
    dirty: bool = True


class ScheduleKeeper:
    """Steps the watched AgentSchedules (see the module's docstring)."""

    def __init__(
        self, api: ScheduleApi, cluster: Cluster, clock: Clock, poll_seconds: float
    ) -> None:
        self._api = api
        self._cluster = cluster
        self._clock = clock
        self._poll_seconds = poll_seconds
        self._known: dict[_Key, _Known] = {}
        self._wake = asyncio.Event()

    # ------------------------------------------------------------ what the watches tell
    def schedule_seen(self, body: Mapping[str, Any], *, gone: bool) -> None:
        """An event of an AgentSchedule: a new one or a changed spec is stepped now."""
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        if gone:
            self._known.pop(key, None)
            return
        generation = int(meta.get("generation") or 0)
        known = self._known.setdefault(key, _Known())
        if known.generation != generation:
            known.generation = generation
            self._mark(key)

    def run_seen(self, body: Mapping[str, Any], *, gone: bool) -> None:
        """An event of an AgentRun: its schedule is stepped if it ended or went."""
        meta = body.get("metadata") or {}
        schedule = (meta.get("labels") or {}).get(SCHEDULE_LABEL)
        if not schedule:
            return
        ended = (body.get("status") or {}).get("phase") in TERMINAL_PHASES
        if gone or ended:
            self._mark((str(meta.get("namespace") or ""), str(schedule)))

    def _mark(self, key: _Key) -> None:
        self._known.setdefault(key, _Known()).dirty = True
        self._wake.set()

    # ------------------------------------------------------------ the task
    async def run(self) -> None:
        """Step the schedules that need it, forever."""
        while True:
            self._wake.clear()
            try:
                await self._step_due()
            except Exception:  # the clock could not be read: look again, never stop
                _log.exception("stepping the AgentSchedules failed")
            await self._sleep()

    async def _step_due(self) -> None:
        now = self._clock()
        due = [
            key
            for key, known in self._known.items()
            if known.dirty or (known.next_step_at is not None and known.next_step_at <= now)
        ]
        for key in due:
            known = self._known.get(key)
            if known is None:
                continue
            known.dirty = False
            try:
                known.next_step_at = await asyncio.to_thread(self.step, *key, now)
            except Exception as error:  # tried again at the next look
                known.dirty = True
                _log.warning("AgentSchedule %s/%s: %s", *key, failure_text(error))

    async def _sleep(self) -> None:
        timeout = self._poll_seconds
        upcoming = [k.next_step_at for k in self._known.values() if k.next_step_at is not None]
        if upcoming:
            with contextlib.suppress(Exception):  # an unreadable clock: the poll bounds it
                until = (min(upcoming) - self._clock()).total_seconds()
                timeout = min(timeout, max(until, 0.05))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)

    # ------------------------------------------------------------ one step
    def step(self, namespace: str, name: str, now: datetime) -> datetime | None:
        """Read the schedule and its runs, carry out :func:`.schedules.plan` at ``now``;
        returns when the schedule next needs a step (None: only when something changes)."""
        body = self._api.get_schedule(namespace, name)
        if body is None:
            return None
        status: JSON = dict(body.get("status") or {})
        conditions = list(status.get("conditions") or [])
        try:
            schedule = read_schedule(body)
        except InvalidSchedule as invalid:
            changed = ready_condition(conditions, False, invalid.reason, invalid.message, now)
            if changed is not None:
                self._api.patch_status(namespace, name, {"conditions": changed})
                self._post(body, RunEvent("Warning", invalid.reason, invalid.message))
            return None
        runs = [
            ScheduledRun.from_body(run)
            for run in self._api.list_runs(namespace, name)
            if _owned_by(run, schedule.uid)
        ]
        decided = plan(schedule, runs, now)
        for run in decided.replace:
            self._api.delete_run(namespace, run)
        wanted = dict(decided.status)
        events = list(decided.events)
        ready = (True, "Valid", f"runs are created on the schedule {schedule.times.expression!r}")
        if decided.create_for is not None:
            manifest = run_manifest(schedule, decided.create_for)
            run_name = manifest["metadata"]["name"]
            try:
                created = self._api.create_run(manifest)
                if created is None:
                    created = self._already_there(body, schedule.uid, run_name)
                else:
                    events.insert(0, RunEvent("Normal", "Scheduled", f"created run {run_name}"))
                if created is not None and _active(created):
                    meta = created["metadata"]
                    listed = [r for r in wanted.get("active", []) if r["name"] != run_name]
                    reference = run_reference(namespace, run_name, str(meta.get("uid")))
                    wanted["active"] = [*listed, reference]
            except RunRefused as refused:
                message = f"could not create run {run_name}: {refused}"
                events.insert(0, RunEvent("Warning", "FailedCreate", message))
                ready = (False, "RunRefused", message)
            wanted["lastScheduleTime"] = stamp(decided.create_for)
        for run in decided.expired:
            self._api.delete_run(namespace, run)
        changed = ready_condition(conditions, *ready, now)
        if changed is not None:
            wanted["conditions"] = changed
        patch = status_changes(status, wanted)
        if patch:
            self._api.patch_status(namespace, name, patch)
        for event in events:
            self._post(body, event)
        return decided.next_step_at

    def _already_there(self, schedule: JSON, uid: str, run_name: str) -> JSON | None:
        """The run of that name (created by an earlier step, or another operator), if it is
        this schedule's; a run of someone else's in the way is said in an Event."""
        meta = schedule.get("metadata") or {}
        existing = self._api.get_run(str(meta.get("namespace")), run_name)
        if existing is None or _owned_by(existing, uid):
            return existing
        self._post(
            schedule,
            RunEvent(
                "Warning",
                "NameTaken",
                f"an AgentRun named {run_name} exists and is not this schedule's: that "
                f"scheduled time is skipped; delete or rename that run",
            ),
        )
        return None

    def _post(self, schedule: JSON, event: RunEvent) -> None:
        self._cluster.post_event(schedule, event)


def _owned_by(run: Mapping[str, Any], uid: str) -> bool:
    owners = (run.get("metadata") or {}).get("ownerReferences") or []
    return any(owner.get("uid") == uid for owner in owners)


def _active(run: Mapping[str, Any]) -> bool:
    return (run.get("status") or {}).get("phase") not in TERMINAL_PHASES
