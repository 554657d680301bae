"""What an AgentSchedule should do now: the decision, as plain functions of the schedule,
its runs and the time (no Kubernetes here; :mod:`.schedule_keeper` carries it out).

The semantics are CronJob's:

- The run of a scheduled time is named ``<schedule>-<minutes since the epoch>`` (UTC), so
  a second operator, a retry or a restarted operator that decides the same time names the
  same run, and its create answers 409: that time is done. A time whose run exists (in any
  phase, even being deleted) is never acted on again.
- Only the most recent scheduled time at or before now starts a run. The times before it
  that passed without one (the operator was down, or upgrading) are counted in an Event
  (MissedSchedule; past 100, TooManyMissedTimes) and not started. With
  ``startingDeadlineSeconds``, a time older than that is never started.
- ``concurrencyPolicy``: Allow starts the run beside active ones; Forbid skips the time
  while a run of the schedule is active (a skipped time starts later if its run may still
  start: the active run ended within ``startingDeadlineSeconds``, or there is no deadline,
  as CronJob does); Replace deletes the active runs, then starts the new one.
- ``suspend`` starts nothing; the history is still kept to its limits.
- History: the newest ``successfulRunsHistoryLimit`` succeeded and
  ``failedRunsHistoryLimit`` failed runs are kept, the older deleted (oldest first).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from alpineagents_operator.deciding.cron import CronTimes, InvalidSchedule, parse_cron
from alpineagents_operator.kube.schedule_names import (
    SCHEDULE_KIND,
    SCHEDULE_LABEL,
    SCHEDULED_AT_ANNOTATION,
    SCHEDULED_LABEL,
)
from alpineagents_operator.kube.views import (
    GROUP,
    JSON,
    KIND,
    VERSION,
    Phase,
    RunEvent,
    format_time,
    parse_time,
)

MAX_SCHEDULE_NAME = 54
"""A run's name is the schedule's, a dash and 8 digits of minutes: at most 63."""
TOO_MANY_MISSED = 100
"""CronJob's count of missed times past which it says so (TooManyMissedTimes)."""
DEFAULT_SUCCESSFUL_HISTORY = 3
DEFAULT_FAILED_HISTORY = 1


class Policy(StrEnum):
    """``spec.concurrencyPolicy``."""

    ALLOW = "Allow"
    FORBID = "Forbid"
    REPLACE = "Replace"


class Outcome(StrEnum):
    """Where a schedule's run is, as far as the schedule cares."""

    ACTIVE = "Active"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


@dataclass(frozen=True)
class ScheduleSpec:
    """An AgentSchedule, read and checked."""

    namespace: str
    name: str
    uid: str
    created: datetime
    times: CronTimes
    policy: Policy
    starting_deadline_seconds: int | None
    suspend: bool
    successful_history: int
    failed_history: int
    last_schedule: datetime | None
    last_skipped: datetime | None
    last_successful: datetime | None
    template: JSON


@dataclass(frozen=True)
class ScheduledRun:
    """One AgentRun a schedule created."""

    name: str
    uid: str
    scheduled_at: datetime | None
    outcome: Outcome
    completed_at: datetime | None
    deleting: bool

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> ScheduledRun:
        meta = body.get("metadata") or {}
        status = body.get("status") or {}
        phase = status.get("phase")
        outcome = (
            Outcome.SUCCEEDED
            if phase == Phase.SUCCEEDED
            else Outcome.FAILED
            if phase == Phase.FAILED
            else Outcome.ACTIVE
        )
        return cls(
            name=str(meta.get("name") or ""),
            uid=str(meta.get("uid") or ""),
            scheduled_at=parse_time((meta.get("annotations") or {}).get(SCHEDULED_AT_ANNOTATION)),
            outcome=outcome,
            completed_at=parse_time(status.get("completedAt")),
            deleting=bool(meta.get("deletionTimestamp")),
        )


@dataclass(frozen=True)
class SchedulePlan:
    """What to do now, in this order: delete ``replace`` (the active runs Replace ends),
    create the run of ``create_for``, delete ``expired`` (history past its limits), then
    merge-patch ``status`` and post ``events``."""

    create_for: datetime | None = None
    replace: tuple[str, ...] = ()
    expired: tuple[str, ...] = ()
    status: JSON = field(default_factory=dict)
    events: tuple[RunEvent, ...] = ()
    next_step_at: datetime | None = None
    """When the schedule next needs a step (its next time); None: only on a change."""


def read_schedule(body: Mapping[str, Any]) -> ScheduleSpec:
    """The AgentSchedule ``body`` as a :class:`ScheduleSpec`, or :class:`InvalidSchedule`."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    times = parse_cron(str(spec.get("schedule") or ""), spec.get("timeZone"))
    try:
        policy = Policy(spec.get("concurrencyPolicy") or Policy.ALLOW)
    except ValueError:
        raise InvalidSchedule(
            "InvalidSchedule",
            f"spec.concurrencyPolicy {spec.get('concurrencyPolicy')!r} is not one of "
            f"Allow, Forbid, Replace",
        ) from None
    deadline = spec.get("startingDeadlineSeconds")
    return ScheduleSpec(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        created=parse_time(meta.get("creationTimestamp")) or datetime.now(UTC),
        times=times,
        policy=policy,
        starting_deadline_seconds=int(deadline) if isinstance(deadline, int) else None,
        suspend=bool(spec.get("suspend")),
        successful_history=_limit(
            spec.get("successfulRunsHistoryLimit"), DEFAULT_SUCCESSFUL_HISTORY
        ),
        failed_history=_limit(spec.get("failedRunsHistoryLimit"), DEFAULT_FAILED_HISTORY),
        last_schedule=parse_time(status.get("lastScheduleTime")),
        last_skipped=parse_time(status.get("lastSkippedTime")),
        last_successful=parse_time(status.get("lastSuccessfulTime")),
        template=dict(spec.get("runTemplate") or {}),
    )


def _limit(value: Any, default: int) -> int:
    return value if isinstance(value, int) and value >= 0 else default


def run_name(schedule: str, scheduled_at: datetime) -> str:
    """The name of the run of ``scheduled_at`` (CronJob's ``<name>-<minutes>``)."""
    return f"{schedule}-{int(scheduled_at.timestamp()) // 60}"


def run_manifest(schedule: ScheduleSpec, scheduled_at: datetime) -> JSON:
    """The AgentRun of ``scheduled_at``: the template's spec, labels and annotations, with
    the schedule's label and time on it and the schedule as its controlling owner (it goes
    with the schedule)."""
    template_meta = schedule.template.get("metadata") or {}
    labels = {
        **(template_meta.get("labels") or {}),
        SCHEDULE_LABEL: schedule.name,
        SCHEDULED_LABEL: scheduled_at.astimezone(UTC).strftime("%Y%m%dT%H%MZ"),
    }
    annotations = {
        **(template_meta.get("annotations") or {}),
        SCHEDULED_AT_ANNOTATION: stamp(scheduled_at),
    }
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {
            "name": run_name(schedule.name, scheduled_at),
            "namespace": schedule.namespace,
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": SCHEDULE_KIND,
                    "name": schedule.name,
                    "uid": schedule.uid,
                    "controller": True,
                }
            ],
        },
        "spec": dict(schedule.template.get("spec") or {}),
    }


def stamp(moment: datetime) -> str:
    """``moment`` as the status writes times (RFC 3339, UTC, whole seconds)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def run_reference(namespace: str, name: str, uid: str) -> JSON:
    """An entry of ``status.active``: a reference to one AgentRun."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "name": name,
        "namespace": namespace,
        "uid": uid,
    }


def _clock(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def plan(schedule: ScheduleSpec, runs: Sequence[ScheduledRun], now: datetime) -> SchedulePlan:
    """What ``schedule`` should do at ``now``, given ``runs`` (the AgentRuns it owns)."""
    live = [run for run in runs if not run.deleting]
    active = sorted((run for run in live if run.outcome is Outcome.ACTIVE), key=_order)
    expired = [
        *_past_limit(live, Outcome.SUCCEEDED, schedule.successful_history),
        *_past_limit(live, Outcome.FAILED, schedule.failed_history),
    ]
    events = [
        RunEvent("Normal", "DeletedRun", f"deleted finished run {run.name} (history limit)")
        for run in expired
    ]
    status = _observed_status(schedule, runs, active)
    if schedule.suspend:
        return SchedulePlan(expired=_names(expired), status=status, events=tuple(events))

    next_step_at = schedule.times.next_after(now)
    due = schedule.times.most_recent(now)
    since = schedule.last_schedule or schedule.created
    earliest = since
    if schedule.starting_deadline_seconds is not None:
        earliest = max(earliest, now - timedelta(seconds=schedule.starting_deadline_seconds))
    if due <= earliest:
        return _done(expired, status, events, next_step_at)
    if any(run.scheduled_at == due for run in runs):  # created by us earlier, or another
        status["lastScheduleTime"] = stamp(due)
        return _done(expired, status, events, next_step_at)

    name = run_name(schedule.name, due)
    if schedule.policy is Policy.FORBID and active:
        if schedule.last_skipped != due:
            status["lastSkippedTime"] = stamp(due)
            events.append(
                RunEvent(
                    "Normal",
                    "Skipped",
                    f"not starting the run of {_clock(due)}: {_listed(active)} still "
                    f"active and concurrencyPolicy is Forbid",
                )
            )
        return _done(expired, status, events, next_step_at)

    # Times skipped under Forbid were told then (Skipped); only the others are missed.
    told = max(since, schedule.last_skipped) if schedule.last_skipped else since
    missed = schedule.times.count_between(told, due, TOO_MANY_MISSED)
    if missed > TOO_MANY_MISSED:
        events.append(
            RunEvent(
                "Warning",
                "TooManyMissedTimes",
                f"more than {TOO_MANY_MISSED} scheduled times passed without a run; only "
                f"the most recent, {_clock(due)}, starts. Set or decrease "
                f"spec.startingDeadlineSeconds or check clock skew",
            )
        )
    elif missed:
        events.append(
            RunEvent(
                "Warning",
                "MissedSchedule",
                f"{missed} scheduled time(s) before {_clock(due)} passed without a run (no "
                f"operator was acting, or past spec.startingDeadlineSeconds); only the most "
                f"recent starts",
            )
        )
    replace: list[ScheduledRun] = []
    if schedule.policy is Policy.REPLACE and active:
        replace = active
        events.append(
            RunEvent("Normal", "Replaced", f"deleted active {_listed(active)} to start {name}")
        )
        status["active"] = []
    return SchedulePlan(
        create_for=due,
        replace=_names(replace),
        expired=_names(expired),
        status=status,
        events=tuple(events),
        next_step_at=next_step_at,
    )


def _done(
    expired: list[ScheduledRun], status: JSON, events: list[RunEvent], next_step_at: datetime
) -> SchedulePlan:
    return SchedulePlan(
        expired=_names(expired), status=status, events=tuple(events), next_step_at=next_step_at
    )


def _order(run: ScheduledRun) -> tuple[datetime, str]:
    return (run.scheduled_at or datetime.min.replace(tzinfo=UTC), run.name)


def _past_limit(runs: Sequence[ScheduledRun], outcome: Outcome, keep: int) -> list[ScheduledRun]:
    """The runs of ``outcome`` beyond the newest ``keep``, oldest first."""
    finished = sorted((run for run in runs if run.outcome is outcome), key=_order)
    return finished[: max(len(finished) - keep, 0)]


def _names(runs: Sequence[ScheduledRun]) -> tuple[str, ...]:
    return tuple(run.name for run in runs)


def _listed(runs: Sequence[ScheduledRun]) -> str:
    names = ", ".join(run.name for run in runs[:5])
    more = f" and {len(runs) - 5} more" if len(runs) > 5 else ""
    return f"run{'s' if len(runs) > 1 else ''} {names}{more}"


def _observed_status(
    schedule: ScheduleSpec, runs: Sequence[ScheduledRun], active: Sequence[ScheduledRun]
) -> JSON:
    """The status fields the runs alone say: the active ones and the last success."""
    status: JSON = {
        "active": [run_reference(schedule.namespace, run.name, run.uid) for run in active]
    }
    successes = [
        run.completed_at or run.scheduled_at
        for run in runs
        if run.outcome is Outcome.SUCCEEDED and (run.completed_at or run.scheduled_at)
    ]
    if schedule.last_successful is not None:
        successes.append(schedule.last_successful)
    latest = max((moment for moment in successes if moment is not None), default=None)
    if latest is not None:
        status["lastSuccessfulTime"] = stamp(latest)
    return status


def status_changes(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> JSON:
    """The fields of ``wanted`` that differ from ``current`` (a merge patch, maybe empty)."""
    return {key: value for key, value in wanted.items() if current.get(key) != value}


def ready_condition(
    current: Sequence[Mapping[str, Any]], ok: bool, reason: str, message: str, now: datetime
) -> list[JSON] | None:
    """``status.conditions`` with its Ready condition saying ``ok``/``reason``/``message``;
    None if it says so already (nothing to patch, no Event to post again)."""
    wanted = {"type": "Ready", "status": "True" if ok else "False", "reason": reason}
    others = [dict(c) for c in current if c.get("type") != "Ready"]
    mine = next((dict(c) for c in current if c.get("type") == "Ready"), None)
    same = mine is not None and all(mine.get(k) == v for k, v in wanted.items())
    if same and mine is not None and mine.get("message") == message:
        return None
    since = (
        mine["lastTransitionTime"]
        if mine is not None and mine.get("status") == wanted["status"]
        else format_time(now)
    )
    return [*others, {**wanted, "message": message[:1024], "lastTransitionTime": since}]
