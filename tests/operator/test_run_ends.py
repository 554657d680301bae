"""What happens at a run's end, judged without an operator: when a notification is due
and what it says (:mod:`alpineagents_operator.deciding.notifications`), when a finished run is to
be deleted (:mod:`alpineagents_operator.reconciling.retention`), their settings, and the CRD refusing
a ``spec.notify`` or TTL that cannot work (on a real kube-apiserver)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from alpineagents_operator.deciding import notifications
from alpineagents_operator.deciding.notifications import Due, cloud_event, due, end_id, settled
from alpineagents_operator.kube.config import OperatorConfig
from alpineagents_operator.kube.views import AgentRunView
from alpineagents_operator.reconciling.retention import expires_at
from tests.bench.control_plane import ControlPlane
from tests.operator.test_crd import manifest, refusal

NOW = datetime(2026, 12, 7, 6, 0, tzinfo=UTC)
ENDED = "2026-12-07T05:00:00Z"
END_ID = "uid-1-succeeded-20261207T050000Z"


def run(status: dict[str, Any] | None = None, **spec: Any) -> AgentRunView:
    return AgentRunView.from_body(
        {
            "metadata": {"name": "triage", "namespace": "agents", "uid": "uid-1"},
            "spec": {"model": "m", "prompt": "go", **spec},
            "status": status or {},
        }
    )


def ended(**more: Any) -> dict[str, Any]:
    return {"phase": "Succeeded", "reason": "Answered", "completedAt": ENDED, **more}


NOTIFY = {"url": "https://hooks.example.com/runs"}


def test_a_notification_is_due_once_a_run_with_notify_ends() -> None:
    assert due(run(), NOW) is None
    assert due(run(ended()), NOW) is None  # no spec.notify
    assert due(run({"phase": "Running"}, notify=NOTIFY), NOW) is None
    assert due(run(ended(savedStateUnread=True), notify=NOTIFY), NOW) is None  # cost to come
    assert due(run(ended(), notify=NOTIFY), NOW) == Due(END_ID, 1)


@pytest.mark.parametrize(
    ("mark", "expected"),
    [
        ({"state": "Retrying", "attempts": 2, "nextAttemptAt": "2026-12-07T06:00:08Z"},
         Due(END_ID, 3, at=NOW + timedelta(seconds=8))),
        ({"state": "Sending", "attempts": 2}, Due(END_ID, 2, abandoned=True)),
        ({"state": "Delivered", "attempts": 1}, None),
        ({"state": "Failed", "attempts": 8}, None),
        ({"state": "Unknown", "attempts": 1}, None),
    ],
)  # fmt: skip
def test_the_mark_of_this_end_says_what_is_left_to_do(
    mark: dict[str, Any], expected: Due | None
) -> None:
    marked = run(ended(notification={"id": END_ID, **mark}), notify=NOTIFY)
    assert due(marked, NOW) == expected
    assert settled(marked) is (mark["state"] in ("Delivered", "Failed", "Unknown"))


def test_another_end_of_the_same_run_is_told_again_under_its_own_id() -> None:
    # Failed, its budget raised, resumed and answered: the first end's mark is another id.
    again = run(
        ended(
            completedAt="2026-12-07T05:30:00Z", notification={"id": END_ID, "state": "Delivered"}
        ),
        notify=NOTIFY,
    )
    wanted = due(again, NOW)
    assert wanted is not None and wanted.attempt == 1 and wanted.id != END_ID
    assert wanted.id == end_id(again) == "uid-1-succeeded-20261207T053000Z"
    assert not settled(again)


def test_the_event_is_a_cloudevent_with_the_runs_end_and_the_answers_first_lines() -> None:
    answer = "\n".join(f"line {n}" for n in range(1, 15))
    finished = run(
        ended(
            answer=answer,
            costUSD="0.0412",
            usage={"inputTokens": 9120, "outputTokens": 840},
            turns=4,
            attempt=2,
        ),
        notify=NOTIFY,
    )
    event = cloud_event(finished, END_ID, NOW, "https://runs.example.com")
    assert {k: event[k] for k in ("specversion", "id", "type", "subject", "time")} == {
        "specversion": "1.0",
        "id": END_ID,
        "type": "dev.alpineagents.run.finished",
        "subject": "triage",
        "time": "2026-12-07T06:00:00.000Z",
    }
    assert event["source"] == "/apis/alpineagents.dev/v1/namespaces/agents/agentruns"
    data = event["data"]
    assert (data["phase"], data["reason"], data["costUSD"], data["turns"]) == (
        "Succeeded",
        "Answered",
        "0.0412",
        4,
    )
    assert data["answer"].splitlines() == [f"line {n}" for n in range(1, 11)] + ["…"]
    assert data["viewerUrl"] == f"https://runs.example.com/runs/{finished.state_id}"
    assert "viewerUrl" not in cloud_event(finished, END_ID, NOW)["data"]
    assert json.loads(notifications.encoded(event)) == event
    long = notifications.answer_start("x" * 2000)
    assert long is not None and len(long) == 500 and long.endswith("…")


def test_tries_back_off_doubling_up_to_five_minutes() -> None:
    assert [notifications.backoff(n, 2.0) for n in (1, 2, 3, 4)] == [2.0, 4.0, 8.0, 16.0]
    assert notifications.backoff(20, 2.0) == 300.0


def test_a_finished_run_expires_after_its_ttl_once_its_notification_is_settled() -> None:
    completed = datetime(2026, 12, 7, 5, 0, tzinfo=UTC)
    assert expires_at(run(ended(), ttlSecondsAfterFinished=60), None) == completed + timedelta(
        seconds=60
    )
    assert expires_at(run(ended()), 3600) == completed + timedelta(hours=1)  # the default
    assert expires_at(run(ended(), ttlSecondsAfterFinished=0), 3600) == completed  # its own
    assert expires_at(run(ended()), None) is None  # no TTL: kept
    assert expires_at(run({"phase": "Running"}, ttlSecondsAfterFinished=0), None) is None
    waiting = run(ended(), notify=NOTIFY, ttlSecondsAfterFinished=0)
    assert expires_at(waiting, None) is None  # its end is still to be told
    told = run(
        ended(notification={"id": END_ID, "state": "Delivered"}),
        notify=NOTIFY,
        ttlSecondsAfterFinished=0,
    )
    assert expires_at(told, None) == completed


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"ALPINEAGENTS_NOTIFY_ATTEMPTS": "0"}, "ALPINEAGENTS_NOTIFY_ATTEMPTS must be a whole number, 1 or more"),
        ({"ALPINEAGENTS_NOTIFY_BACKOFF_SECONDS": "soon"}, "ALPINEAGENTS_NOTIFY_BACKOFF_SECONDS must be a number"),
        ({"ALPINEAGENTS_TTL_SECONDS_AFTER_FINISHED": "1d"}, "ALPINEAGENTS_TTL_SECONDS_AFTER_FINISHED must be whole seconds"),
        ({"ALPINEAGENTS_DELETES_PER_SECOND": "0"}, "ALPINEAGENTS_DELETES_PER_SECOND must be a number, more than 0"),
        ({"ALPINEAGENTS_NOTIFICATIONS": "maybe"}, "ALPINEAGENTS_NOTIFICATIONS must be true or false"),
    ],
)  # fmt: skip
def test_bad_settings_stop_the_operator_naming_the_variable(
    env: dict[str, str], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        OperatorConfig.from_env(env)


def test_settings_are_read() -> None:
    config = OperatorConfig.from_env(
        {
            "ALPINEAGENTS_NOTIFICATIONS": "false",
            "ALPINEAGENTS_RETENTION": "true",
            "ALPINEAGENTS_TTL_SECONDS_AFTER_FINISHED": "86400",
            "ALPINEAGENTS_VIEWER_URL": "https://runs.example.com/",
        }
    )
    assert (config.notifications, config.retention) == (False, True)
    assert config.ttl_seconds_after_finished == 86400
    assert config.viewer_url == "https://runs.example.com"
    assert OperatorConfig.from_env({}).ttl_seconds_after_finished is None


# --------------------------------------------------------------------------- the CRD
@pytest.fixture(scope="module")
def plane(control_plane: ControlPlane) -> ControlPlane:
    assert "agentruns.alpineagents.dev" in control_plane.apply_crds()
    return control_plane


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"notify": {"url": "ftp://hooks.example.com"}}, "spec.notify.url must be an http:// or https:// URL"),
        ({"notify": {"url": "https://bob:hunter2@hooks.example.com"}}, "spec.notify.url must not hold credentials"),
        ({"notify": {"authSecretRef": {"name": "hooks", "key": "token"}}}, "spec.notify.url: Required value"),
        ({"notify": {"url": "https://h", "authSecretRef": {"name": "hooks"}}}, "spec.notify.authSecretRef.key: Required value"),
        ({"notify": {"url": "https://h", "header": "X Auth"}}, "spec.notify.header"),
        ({"ttlSecondsAfterFinished": -1}, "spec.ttlSecondsAfterFinished"),
    ],
)  # fmt: skip
def test_a_notify_or_ttl_that_cannot_work_is_refused(
    plane: ControlPlane, spec: dict[str, Any], message: str
) -> None:
    refused = refusal(plane, model="m", prompt="hi", **spec)
    assert message in refused
    assert "hunter2" not in refused


def test_notify_and_ttl_are_accepted_with_the_header_defaulted(plane: ControlPlane) -> None:
    text = manifest(
        model="m",
        prompt="hi",
        notify={
            "url": "https://hooks.example.com/runs",
            "authSecretRef": {"name": "h", "key": "t"},
        },
        ttlSecondsAfterFinished=86400,
    )
    created = json.loads(
        plane.kubectl("create", "--dry-run=server", "-f", "-", "-o", "json", input=text).stdout
    )
    assert created["spec"]["notify"]["header"] == "Authorization"
    assert created["spec"]["ttlSecondsAfterFinished"] == 86400
