"""AgentSchedules, with the operator as its own process on a real kube-apiserver without a
node (a run's end is its pod's status written as its kubelet would), and the schedules'
clock a file the test moves on (``ALPINEAGENTS_SCHEDULE_CLOCK_FILE``): no test waits a
minute.

- Allow starts a run beside an active one, Forbid skips a time while one is active (and,
  past startingDeadlineSeconds, never runs it), Replace deletes the active run and starts
  the next.
- History limits keep exactly N succeeded and M failed runs, oldest deleted first;
  suspend creates nothing.
- Times missed while no operator ran are caught up once (the most recent only); a
  restarted operator and a second operator acting at once create nothing twice.
- With leader election, only the Lease's holder reads schedules and creates runs; the
  standby that takes over a killed leader creates the next time's run, once.
- A bad cron, an unknown time zone or a template the AgentRun schema refuses: an Event
  and the Ready condition say what is wrong, and no run is made.
- docs/schedules.md's manifest is examples/schedule.yaml, and it runs at 06:00 Berlin time.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import yaml

from alpineagents.pod_contract import termination_message_json
from alpineagents_operator.deciding.cron import parse_cron
from alpineagents_operator.deciding.schedules import run_name
from alpineagents_operator.kube.schedule_names import SCHEDULE_LABEL
from tests.bench.control_plane import ControlPlane
from tests.bench.operator_process import (
    WAIT_LIMIT,
    Event,
    EventLog,
    OperatorProcess,
    holder,
    operator_in_namespace,
    operator_kubeconfig,
)
from tests.paths import REPO


class Clock:
    """The schedules' clock: a file holding the time the operator reads as now."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # Minutes ahead of the real clock, so a schedule made now was made before them.
        self.base = datetime.now(UTC).replace(second=0, microsecond=0) + timedelta(minutes=1)
        self.set(datetime.now(UTC))

    def minute(self, k: int) -> datetime:
        return self.base + timedelta(minutes=k)

    def set(self, moment: datetime) -> None:
        partial = self.path.with_suffix(".partial")
        partial.write_text(moment.strftime("%Y-%m-%dT%H:%M:%SZ"))
        partial.replace(self.path)  # the operator never reads half a time

    def at_minute(self, k: int, seconds: int = 5) -> None:
        self.set(self.minute(k) + timedelta(seconds=seconds))


@dataclass
class Bench:
    plane: ControlPlane
    namespace: str
    operator: OperatorProcess
    clock: Clock
    directory: Path

    def kubectl(self, *args: str, **options: Any) -> Any:
        return self.plane.kubectl(*args, "-n", self.namespace, **options)

    def create_schedule(self, name: str, schedule: str = "* * * * *", **spec: Any) -> None:
        manifest = {
            "apiVersion": "alpineagents.dev/v1",
            "kind": "AgentSchedule",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {
                "schedule": schedule,
                "runTemplate": {
                    "metadata": {"labels": {"team": "triage"}},
                    "spec": {
                        "model": "claude-sonnet-5",
                        "prompt": f"job of {name}",
                        "restartPolicy": {"initialBackoffSeconds": 0},
                    },
                },
                **spec,
            },
        }
        self.kubectl("create", "-f", "-", input=json.dumps(manifest))

    def run_of(self, schedule: str, k: int) -> str:
        return run_name(schedule, self.clock.minute(k))

    def runs_of(self, schedule: str) -> dict[str, str]:
        """The schedule's runs now: name → phase."""
        listing = json.loads(
            self.kubectl(
                "get", "agentruns", "-l", f"{SCHEDULE_LABEL}={schedule}", "-o", "json"
            ).stdout
        )
        return {
            item["metadata"]["name"]: (item.get("status") or {}).get("phase", "")
            for item in listing["items"]
        }

    def schedule_status(self, name: str) -> dict[str, Any]:
        body = json.loads(self.kubectl("get", "agentschedule", name, "-o", "json").stdout)
        return dict(body.get("status") or {})

    def pod_exits(self, run: str, code: int) -> None:
        """Write the run's first pod's status as its kubelet would once the runner ended
        (exit 0: answered; 65: failed, not retryable)."""
        message = termination_message_json(
            outcome="answered" if code == 0 else "failed",
            state_id="",
            last_saved_seq=3,
            turns=1,
            usage={"input_tokens": 120, "output_tokens": 40},
            answer="done" if code == 0 else None,
            error=None if code == 0 else "the task cannot be done",
        )
        status = {
            "phase": "Succeeded" if code == 0 else "Failed",
            "containerStatuses": [
                {
                    "name": "agent",
                    "image": "alpineagents:schedule",
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": {
                        "terminated": {
                            "exitCode": code,
                            "reason": "Completed" if code == 0 else "Error",
                            "message": json.dumps(message),
                        }
                    },
                }
            ],
        }
        self.kubectl(
            "patch", "pod", f"{run}-1", "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": status}),
        )  # fmt: skip

    def requests(self, operator: OperatorProcess, verb: str, resource: str) -> int:
        """How many ``verb`` requests on ``resource`` ``operator`` made (the audit log)."""
        user = f"system:serviceaccount:{self.namespace}:{operator.name}"
        return sum(
            1
            for event in self.plane.audit_events(user)
            if event.get("verb") == verb
            and (event.get("objectRef") or {}).get("resource") == resource
        )

    def looked(self, operator: OperatorProcess, times: int) -> Callable[[], bool]:
        """Whether ``operator`` has read an AgentSchedule ``times`` times or more (each of
        its schedule steps starts with that read)."""
        return lambda: self.requests(operator, "get", "agentschedules") >= times


def wait_until(condition: Callable[[], bool], what: str) -> None:
    """For what has no watch event: the audit log is a file."""
    deadline = time.monotonic() + WAIT_LIMIT
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {WAIT_LIMIT} s")
        time.sleep(0.1)


def added(name: str) -> Callable[[Event], bool]:
    return lambda event: event.type == "ADDED" and event.name == name


def deleted(name: str) -> Callable[[Event], bool]:
    return lambda event: event.type == "DELETED" and event.name == name


def in_phase(name: str, phase: str) -> Callable[[Event], bool]:
    return lambda event: (
        event.name == name and (event.object.get("status") or {}).get("phase") == phase
    )


def reported(schedule: str, reason: str) -> Callable[[Event], bool]:
    """Matches a core Event about AgentSchedule ``schedule`` with ``reason``."""

    def matches(event: Event) -> bool:
        involved = event.object.get("involvedObject") or {}
        return (
            involved.get("kind") == "AgentSchedule"
            and involved.get("name") == schedule
            and event.object.get("reason") == reason
        )

    return matches


def added_names(runs: EventLog) -> list[str]:
    return sorted(event.name for event in runs.events if event.type == "ADDED")


@pytest.fixture
def bench(control_plane: ControlPlane, tmp_path: Path) -> Iterator[Bench]:
    with operator_in_namespace(control_plane, tmp_path, "sched") as (namespace, _, operator):
        clock = Clock(tmp_path / "clock")
        operator.env["ALPINEAGENTS_SCHEDULES"] = "true"
        operator.env["ALPINEAGENTS_SCHEDULE_CLOCK_FILE"] = str(clock.path)
        operator.env["ALPINEAGENTS_SCHEDULE_POLL_SECONDS"] = "0.5"
        yield Bench(control_plane, namespace, operator, clock, tmp_path)


def test_allow_overlaps_forbid_skips_and_replace_replaces(bench: Bench) -> None:
    client = bench.plane.api_client()
    with (
        EventLog(client, bench.namespace, "agentruns") as runs,
        EventLog(client, bench.namespace, "pods") as pods,
        EventLog(client, bench.namespace, "events") as events,
    ):
        bench.create_schedule("allow")
        bench.create_schedule("forbid", concurrencyPolicy="Forbid", startingDeadlineSeconds=30)
        bench.create_schedule("replace", concurrencyPolicy="Replace")
        bench.operator.start()

        bench.clock.at_minute(0)
        for schedule in ("allow", "forbid", "replace"):
            pods.wait_for(added(f"{bench.run_of(schedule, 0)}-1"))

        bench.clock.at_minute(1)
        # Allow: the second run beside the first, both active.
        pods.wait_for(added(f"{bench.run_of('allow', 1)}-1"))
        # Replace: the first run deleted, the second started.
        runs.wait_for(deleted(bench.run_of("replace", 0)))
        pods.wait_for(added(f"{bench.run_of('replace', 1)}-1"))
        events.wait_for(reported("replace", "Replaced"))
        # Forbid: skipped while the first is active, and said so.
        skipped = events.wait_for(reported("forbid", "Skipped"))
        assert bench.run_of("forbid", 0) in skipped.object["message"]

        # The first run ends after the skipped time's deadline (30 s): that time never runs.
        bench.clock.at_minute(1, seconds=40)
        bench.pod_exits(bench.run_of("forbid", 0), 0)
        runs.wait_for(in_phase(bench.run_of("forbid", 0), "Succeeded"))
        bench.clock.at_minute(2)
        pods.wait_for(added(f"{bench.run_of('forbid', 2)}-1"))
        pods.wait_for(added(f"{bench.run_of('allow', 2)}-1"))
        pods.wait_for(added(f"{bench.run_of('replace', 2)}-1"))

        assert bench.runs_of("forbid") == {
            bench.run_of("forbid", 0): "Succeeded",
            bench.run_of("forbid", 2): "Pending",
        }
        assert set(bench.runs_of("allow")) == {bench.run_of("allow", k) for k in range(3)}
        assert set(bench.runs_of("replace")) == {bench.run_of("replace", 2)}
        active = [ref["name"] for ref in bench.schedule_status("allow")["active"]]
        assert sorted(active) == sorted(bench.run_of("allow", k) for k in range(3))
        status = bench.schedule_status("forbid")
        assert status["lastScheduleTime"] == bench.clock.minute(2).strftime("%Y-%m-%dT%H:%M:%SZ")
        assert [ref["name"] for ref in status["active"]] == [bench.run_of("forbid", 2)]
        assert "lastSuccessfulTime" in status
        # Each run carries the template's labels and its schedule as its owner.
        body = json.loads(
            bench.kubectl("get", "agentrun", bench.run_of("allow", 0), "-o", "json").stdout
        )
        assert body["metadata"]["labels"]["team"] == "triage"
        assert body["metadata"]["ownerReferences"][0]["kind"] == "AgentSchedule"
        # Nothing was created but those: 3 + 2 + 3 runs, each once.
        assert len(added_names(runs)) == 8, added_names(runs)
        scheduled = [e for e in events.events if e.object.get("reason") == "Scheduled"]
        assert len(scheduled) == 8


def test_history_limits_keep_exactly_n_and_suspend_creates_nothing(bench: Bench) -> None:
    client = bench.plane.api_client()
    with (
        EventLog(client, bench.namespace, "agentruns") as runs,
        EventLog(client, bench.namespace, "pods") as pods,
    ):
        bench.create_schedule("kept", successfulRunsHistoryLimit=2, failedRunsHistoryLimit=1)
        bench.create_schedule("witness")
        bench.operator.start()
        outcomes = [0, 0, 0, 65, 0, 65]  # exit codes of the runs of minutes 0..5
        for k, code in enumerate(outcomes):
            bench.clock.at_minute(k)
            name = bench.run_of("kept", k)
            pods.wait_for(added(f"{name}-1"))
            bench.pod_exits(name, code)
            runs.wait_for(in_phase(name, "Succeeded" if code == 0 else "Failed"))
        # Succeeded 0, 1, 2, 4: the two newest kept; failed 3, 5: the newest kept.
        expected = {
            bench.run_of("kept", 2): "Succeeded",
            bench.run_of("kept", 4): "Succeeded",
            bench.run_of("kept", 5): "Failed",
        }
        for k in (0, 1, 3):
            runs.wait_for(deleted(bench.run_of("kept", k)))
        assert bench.runs_of("kept") == expected

        bench.kubectl(
            "patch", "agentschedule", "kept", "--type=merge", "-p", '{"spec":{"suspend":true}}'
        )
        bench.clock.at_minute(6)
        # The witness's run of minute 6 shows the operator has reached that minute.
        pods.wait_for(added(f"{bench.run_of('witness', 6)}-1"))
        bench.clock.at_minute(7)
        pods.wait_for(added(f"{bench.run_of('witness', 7)}-1"))
        assert bench.runs_of("kept") == expected
        # Unsuspended, the most recent time runs (as a CronJob's would).
        bench.kubectl(
            "patch", "agentschedule", "kept", "--type=merge", "-p", '{"spec":{"suspend":false}}'
        )
        pods.wait_for(added(f"{bench.run_of('kept', 7)}-1"))
        assert bench.run_of("kept", 6) not in added_names(runs)


def test_missed_times_are_caught_up_once_by_a_restarted_and_a_second_operator(
    bench: Bench,
) -> None:
    client = bench.plane.api_client()
    second = OperatorProcess(
        "second",
        operator_kubeconfig(bench.plane, bench.namespace, "second", bench.directory),
        bench.namespace,
        bench.directory / "runs",
        bench.directory / "second.log",
    )
    second.env.update(
        {k: v for k, v in bench.operator.env.items() if k.startswith("ALPINEAGENTS_SCHEDULE")}
    )
    try:
        with (
            EventLog(client, bench.namespace, "agentruns") as runs,
            EventLog(client, bench.namespace, "events") as events,
        ):
            # Made while no operator runs; minutes 0..3 pass.
            bench.create_schedule("nightly", startingDeadlineSeconds=600)
            bench.clock.at_minute(3)
            bench.operator.start()
            runs.wait_for(added(bench.run_of("nightly", 3)))
            missed = events.wait_for(reported("nightly", "MissedSchedule"))
            # The minutes between the schedule's creation and minute 3 (3, or fewer if a
            # minute began while the test set up).
            body = json.loads(bench.kubectl("get", "agentschedule", "nightly", "-o", "json").stdout)
            created = datetime.fromisoformat(body["metadata"]["creationTimestamp"])
            passed = (bench.clock.minute(3) - created.replace(second=0)) // timedelta(minutes=1) - 1
            assert f"{passed} scheduled time(s)" in missed.object["message"], (
                passed,
                missed.object["message"],
            )

            # Restarted at the same moment: it looks, and creates nothing.
            looks = bench.requests(bench.operator, "get", "agentschedules")
            bench.operator.stop()
            bench.operator.start()
            # A second operator too (no election here: both act, as two leaders would).
            second.start()
            before = {bench.operator.name: looks, second.name: 0}
            for operator in (bench.operator, second):
                wait_until(
                    bench.looked(operator, before[operator.name] + 1),
                    f"{operator.name} steps the schedule",
                )
            # A spec change makes each step it again: that look starts once its first step
            # (at minute 3) has ended.
            bench.kubectl(
                "patch", "agentschedule", "nightly", "--type=merge",
                "-p", '{"spec":{"successfulRunsHistoryLimit":5}}',
            )  # fmt: skip
            for operator in (bench.operator, second):
                wait_until(
                    bench.looked(operator, before[operator.name] + 2),
                    f"{operator.name} steps the schedule again",
                )
            assert added_names(runs) == [bench.run_of("nightly", 3)]

            # The next minute, with both acting: one run.
            bench.clock.at_minute(4)
            runs.wait_for(added(bench.run_of("nightly", 4)))
            bench.clock.at_minute(5)
            runs.wait_for(added(bench.run_of("nightly", 5)))
            assert added_names(runs) == sorted(bench.run_of("nightly", k) for k in (3, 4, 5))
    finally:
        second.stop()


def test_only_the_leader_creates_runs_and_its_successor_catches_up_once(bench: Bench) -> None:
    client = bench.plane.api_client()
    lease = f"{bench.namespace}/alpineagents-operator"
    replicas = [
        OperatorProcess(
            name,
            operator_kubeconfig(bench.plane, bench.namespace, name, bench.directory),
            bench.namespace,
            bench.directory / "runs",
            bench.directory / f"{name}.log",
            lease=lease,
        )
        for name in ("leader", "standby")
    ]
    settings = {
        k: v for k, v in bench.operator.env.items() if k.startswith("ALPINEAGENTS_SCHEDULE")
    }
    leader, standby = replicas
    try:
        with (
            EventLog(client, bench.namespace, "agentruns") as runs,
            EventLog(client, bench.namespace, "leases") as leases,
        ):
            bench.create_schedule("hourly-ish")
            for replica in replicas:
                replica.env.update(settings)
            leader.start()
            leases.wait_for(lambda e: holder(e).startswith("leader_"))
            standby.start()
            wait_until(lambda: bench.requests(standby, "get", "leases") > 0, "the standby looks")
            bench.clock.at_minute(0)
            runs.wait_for(added(bench.run_of("hourly-ish", 0)))
            # The standby read no schedule and created nothing.
            assert bench.requests(standby, "get", "agentschedules") == 0
            assert bench.requests(standby, "create", "agentruns") == 0

            leader.kill()  # no goodbye: the standby waits the lease out
            bench.clock.at_minute(1, seconds=20)
            leases.wait_for(lambda e: holder(e).startswith("standby_"))
            runs.wait_for(added(bench.run_of("hourly-ish", 1)))
            assert added_names(runs) == sorted(bench.run_of("hourly-ish", k) for k in (0, 1))
            assert bench.requests(leader, "create", "agentruns") == 1
    finally:
        for replica in replicas:
            replica.stop()


def test_a_bad_schedule_zone_or_template_is_refused_saying_why(bench: Bench) -> None:
    client = bench.plane.api_client()
    with (
        EventLog(client, bench.namespace, "events") as events,
        EventLog(client, bench.namespace, "agentschedules") as schedules,
        EventLog(client, bench.namespace, "agentruns") as runs,
    ):
        bench.create_schedule("typo", "61 * * * *")
        bench.create_schedule("zone", timeZone="Mars/Olympus")
        bench.create_schedule("half", runTemplate={"spec": {"model": "claude-sonnet-5"}})
        bench.operator.start()
        typo = events.wait_for(reported("typo", "InvalidSchedule"))
        assert "minute 0-59" in typo.object["message"] and typo.object["type"] == "Warning"
        zone = events.wait_for(reported("zone", "UnknownTimeZone"))
        assert "Mars/Olympus" in zone.object["message"]

        def ready(name: str, reason: str) -> Callable[[Event], bool]:
            def matches(event: Event) -> bool:
                conditions = (event.object.get("status") or {}).get("conditions") or []
                return event.name == name and any(
                    c["type"] == "Ready" and c["reason"] == reason for c in conditions
                )

            return matches

        schedules.wait_for(ready("typo", "InvalidSchedule"))
        bench.clock.at_minute(0)
        refused = events.wait_for(reported("half", "FailedCreate"))
        assert "spec.prompt" in refused.object["message"], refused.object["message"]
        schedules.wait_for(ready("half", "RunRefused"))

        # Fixed, the schedule runs at its next time.
        bench.kubectl(
            "patch",
            "agentschedule",
            "typo",
            "--type=merge",
            "-p",
            '{"spec":{"schedule":"* * * * *"}}',
        )
        schedules.wait_for(ready("typo", "Valid"))
        bench.clock.at_minute(1)
        runs.wait_for(added(bench.run_of("typo", 1)))
        assert not [e for e in runs.events if e.name.startswith(("zone-", "half-"))]

    # A name too long for its runs' names is refused by the API server.
    too_long = "x" * 55
    answer = bench.plane.kubectl(
        "create", "-n", bench.namespace, "-f", "-", check=False,
        input=json.dumps(
            {
                "apiVersion": "alpineagents.dev/v1",
                "kind": "AgentSchedule",
                "metadata": {"name": too_long},
                "spec": {"schedule": "* * * * *", "runTemplate": {"spec": {"model": "m"}}},
            }
        ),
    )  # fmt: skip
    assert answer.returncode != 0 and "at most 54 characters" in answer.stderr


def test_the_example_is_the_docs_and_runs_at_its_time(bench: Bench) -> None:
    example = (REPO / "examples" / "schedule.yaml").read_text()
    page = (REPO / "docs" / "schedules.md").read_text()
    (shown,) = [b for b in re.findall(r"```yaml\n(.*?)```", page, re.S) if "AgentSchedule" in b]
    assert yaml.safe_load(shown) == yaml.safe_load(example)
    manifest = yaml.safe_load(example)
    spec = manifest["spec"]
    due = parse_cron(spec["schedule"], spec["timeZone"]).next_after(datetime.now(UTC))
    client = bench.plane.api_client()
    with EventLog(client, bench.namespace, "agentruns") as runs:
        bench.kubectl("apply", "-f", "-", input=example)
        bench.operator.start()
        bench.clock.set(due + timedelta(minutes=30))  # within its startingDeadlineSeconds
        name = run_name(manifest["metadata"]["name"], due)
        created = runs.wait_for(added(name)).object
        assert created["metadata"]["labels"]["team"] == "platform"
        assert created["spec"]["prompt"] == spec["runTemplate"]["spec"]["prompt"]
        # 06:00 in Berlin.
        assert due.astimezone(ZoneInfo("Europe/Berlin")).strftime("%H:%M") == "06:00"
