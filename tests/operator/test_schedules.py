"""An AgentSchedule's decision, without Kubernetes: (schedule, its runs, now) → the plan,
row by row as CronJob would act, and the cron reading with its clear errors."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from alpineagents_operator.deciding.cron import InvalidSchedule, parse_cron
from alpineagents_operator.deciding.schedules import (
    ScheduledRun,
    plan,
    read_schedule,
    ready_condition,
    run_manifest,
    run_name,
)
from alpineagents_operator.kube.schedule_names import SCHEDULE_LABEL, SCHEDULED_AT_ANNOTATION

CREATED = datetime(2026, 3, 1, 11, 57, 30, tzinfo=UTC)
NOW = datetime(2026, 3, 1, 12, 0, 20, tzinfo=UTC)
UID = "6f1d2c3b-0000-4000-8000-000000000001"


def schedule(
    cron: str = "* * * * *", last: datetime | None = None, zone: str | None = None, **spec: Any
) -> dict[str, Any]:
    status = {"lastScheduleTime": last.strftime("%Y-%m-%dT%H:%M:%SZ")} if last else {}
    return {
        "apiVersion": "alpineagents.dev/v1",
        "kind": "AgentSchedule",
        "metadata": {
            "name": "nightly",
            "namespace": "team",
            "uid": UID,
            "creationTimestamp": CREATED.strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
        "spec": {
            "schedule": cron,
            **({"timeZone": zone} if zone else {}),
            "runTemplate": {
                "metadata": {"labels": {"team": "triage"}},
                "spec": {"model": "claude-sonnet-5", "prompt": "triage", "notify": {"x": 1}},
            },
            **spec,
        },
        "status": status,
    }


def at(hour: int, minute: int) -> datetime:
    return datetime(2026, 3, 1, hour, minute, tzinfo=UTC)


def run(minute: int, phase: str | None = None, completed: int | None = None) -> ScheduledRun:
    scheduled = at(12, minute) if minute >= 0 else at(11, 60 + minute)
    return ScheduledRun.from_body(
        {
            "metadata": {
                "name": run_name("nightly", scheduled),
                "uid": f"uid-{minute}",
                "annotations": {SCHEDULED_AT_ANNOTATION: scheduled.isoformat()},
            },
            "status": {
                **({"phase": phase} if phase else {}),
                **(
                    {"completedAt": (scheduled + timedelta(seconds=completed)).isoformat()}
                    if completed is not None
                    else {}
                ),
            },
        }
    )


def reasons(decided: Any) -> list[str]:
    return [event.reason for event in decided.events]


def test_the_first_time_after_creation_starts_one_run_named_after_it() -> None:
    decided = plan(read_schedule(schedule()), [], NOW)
    assert decided.create_for == at(12, 0)
    # 11:58 and 11:59 also passed since creation: missed, said once, not started.
    assert reasons(decided) == ["MissedSchedule"]
    assert "2 scheduled time(s)" in decided.events[0].message
    assert decided.next_step_at == at(12, 1)
    assert run_name("nightly", at(12, 0)) == f"nightly-{int(at(12, 0).timestamp()) // 60}"


def test_a_time_whose_run_exists_is_done_whoever_created_it() -> None:
    decided = plan(read_schedule(schedule(last=at(11, 59))), [run(0)], NOW)
    assert decided.create_for is None and decided.replace == ()
    assert decided.status["lastScheduleTime"] == "2026-03-01T12:00:00Z"
    # Even one being deleted: its time is not run again.
    gone = ScheduledRun(**{**run(0).__dict__, "deleting": True})
    assert plan(read_schedule(schedule(last=at(11, 59))), [gone], NOW).create_for is None


def test_nothing_until_the_next_time() -> None:
    decided = plan(read_schedule(schedule(last=at(12, 0))), [run(0)], NOW)
    assert decided.create_for is None and not decided.events


def test_a_long_outage_starts_only_the_most_recent_time_and_says_too_many_were_missed() -> None:
    later = NOW + timedelta(hours=3)
    decided = plan(read_schedule(schedule(last=at(11, 0))), [], later)
    assert decided.create_for == at(15, 0)
    assert reasons(decided) == ["TooManyMissedTimes"]


def test_a_starting_deadline_drops_times_older_than_it() -> None:
    body = schedule("0 * * * *", last=at(11, 0), startingDeadlineSeconds=60)
    assert plan(read_schedule(body), [], at(12, 0) + timedelta(seconds=30)).create_for == at(12, 0)
    assert plan(read_schedule(body), [], at(12, 2)).create_for is None


def test_forbid_skips_while_a_run_is_active_and_says_so_once() -> None:
    body = schedule(last=at(11, 59), concurrencyPolicy="Forbid")
    decided = plan(read_schedule(body), [run(-1, "Running")], NOW)
    assert decided.create_for is None
    assert reasons(decided) == ["Skipped"]
    assert decided.status["lastSkippedTime"] == "2026-03-01T12:00:00Z"
    body["status"]["lastSkippedTime"] = "2026-03-01T12:00:00Z"
    assert not plan(read_schedule(body), [run(-1, "Running")], NOW).events
    # The active run ended: the skipped time, still the most recent, starts (as CronJob).
    ended = plan(read_schedule(body), [run(-1, "Succeeded", 70)], NOW)
    assert ended.create_for == at(12, 0)
    # A later time after a skipped one: the skipped one was told already, not "missed".
    later = plan(read_schedule(body), [run(-1, "Succeeded", 70)], NOW + timedelta(minutes=1))
    assert later.create_for == at(12, 1) and reasons(later) == []


def test_allow_starts_beside_an_active_run() -> None:
    decided = plan(read_schedule(schedule(last=at(11, 59))), [run(-1, "Running")], NOW)
    assert decided.create_for == at(12, 0) and decided.replace == ()
    assert [r["name"] for r in decided.status["active"]] == [run(-1).name]


def test_replace_deletes_the_active_runs_then_creates() -> None:
    body = schedule(last=at(11, 59), concurrencyPolicy="Replace")
    decided = plan(read_schedule(body), [run(-1, "Running"), run(-2, "Pending")], NOW)
    assert decided.replace == (run(-2).name, run(-1).name)
    assert decided.create_for == at(12, 0)
    assert reasons(decided) == ["Replaced"]


def test_suspend_creates_nothing_but_keeps_the_history_to_its_limits() -> None:
    runs = [run(-m, "Succeeded", 10) for m in range(1, 6)]
    decided = plan(read_schedule(schedule(suspend=True)), runs, NOW)
    assert decided.create_for is None and decided.next_step_at is None
    assert decided.expired == (run(-5).name, run(-4).name)


def test_history_keeps_exactly_n_of_each_kind_oldest_deleted_first() -> None:
    runs = [
        *(run(-m, "Succeeded", 10) for m in range(1, 6)),
        *(run(-m, "Failed", 10) for m in range(6, 9)),
        run(-9, "Running"),
    ]
    body = schedule(last=at(12, 0), successfulRunsHistoryLimit=2, failedRunsHistoryLimit=0)
    decided = plan(read_schedule(body), runs, NOW)
    assert decided.expired == tuple(
        r.name for r in (run(-5), run(-4), run(-3), run(-8), run(-7), run(-6))
    )
    assert reasons(decided) == ["DeletedRun"] * 6
    assert decided.status["lastSuccessfulTime"] == "2026-03-01T11:59:10Z"
    # Runs already being deleted do not count toward the limit again.
    deleting = [ScheduledRun(**{**r.__dict__, "deleting": r.name in decided.expired}) for r in runs]
    assert plan(read_schedule(body), deleting, NOW).expired == ()


def test_the_default_limits_are_cronjobs() -> None:
    spec = read_schedule(schedule())
    assert (spec.successful_history, spec.failed_history) == (3, 1)


def test_a_time_zone_moves_the_times() -> None:
    body = schedule("0 13 * * *", zone="Europe/Berlin", last=at(0, 0))
    assert plan(read_schedule(body), [], at(12, 0) + timedelta(minutes=5)).create_for == at(12, 0)


def test_daylight_saving_is_crossed_as_cron_does() -> None:
    times = parse_cron("30 2 * * *", "Europe/Berlin")
    # 2026-03-29 02:30 does not exist in Berlin (02:00 jumps to 03:00): it runs once, as
    # the clock jumps (03:00 CEST), as cronie does; not skipped, not twice.
    after = datetime(2026, 3, 28, 2, 0, tzinfo=UTC)
    assert times.next_after(after) == datetime(2026, 3, 29, 1, 0, tzinfo=UTC)
    assert times.next_after(datetime(2026, 3, 29, 1, 0, tzinfo=UTC)) == datetime(
        2026, 3, 30, 0, 30, tzinfo=UTC
    )


def test_the_run_carries_the_whole_template_spec_its_labels_and_the_schedule_as_owner() -> None:
    manifest = run_manifest(read_schedule(schedule()), at(12, 0))
    assert manifest["spec"]["notify"] == {"x": 1}  # fields the schedule does not know pass
    labels = manifest["metadata"]["labels"]
    assert labels["team"] == "triage" and labels[SCHEDULE_LABEL] == "nightly"
    assert labels["alpineagents.dev/scheduled-time"] == "20260301T1200Z"
    assert manifest["metadata"]["annotations"][SCHEDULED_AT_ANNOTATION] == "2026-03-01T12:00:00Z"
    (owner,) = manifest["metadata"]["ownerReferences"]
    assert owner["uid"] == UID and owner["kind"] == "AgentSchedule" and owner["controller"]


@pytest.mark.parametrize(
    ("cron", "zone", "reason", "says"),
    [
        ("61 * * * *", None, "InvalidSchedule", "minute 0-59"),
        ("* * *", None, "InvalidSchedule", "give five fields"),
        ("every day", None, "InvalidSchedule", "give five fields"),
        ("CRON_TZ=UTC * * * * *", None, "InvalidSchedule", "spec.timeZone"),
        ("* * * * *", "Mars/Olympus", "UnknownTimeZone", "IANA name"),
        ("* * * * *", "../../etc/passwd", "UnknownTimeZone", "IANA name"),
    ],
)
def test_a_bad_schedule_or_zone_is_refused_saying_what_to_write(
    cron: str, zone: str | None, reason: str, says: str
) -> None:
    with pytest.raises(InvalidSchedule) as refused:
        read_schedule(schedule(cron, zone=zone))
    assert refused.value.reason == reason and says in refused.value.message, refused.value.message


def test_macros_are_read_as_cronjob_reads_them() -> None:
    assert parse_cron("@hourly", None).most_recent(NOW) == at(12, 0)
    assert parse_cron("@daily", None).most_recent(NOW) == datetime(2026, 3, 1, tzinfo=UTC)


def test_the_ready_condition_changes_only_when_it_says_something_new() -> None:
    first = ready_condition([], False, "InvalidSchedule", "bad", NOW)
    assert first is not None and first[0]["status"] == "False"
    assert ready_condition(first, False, "InvalidSchedule", "bad", NOW) is None
    fixed = ready_condition(first, True, "Valid", "ok", NOW + timedelta(minutes=1))
    assert fixed is not None and fixed[0]["lastTransitionTime"] != first[0]["lastTransitionTime"]
