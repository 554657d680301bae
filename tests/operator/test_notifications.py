"""A run's end told to a real HTTP endpoint (``spec.notify``), with the operator as its
own process on a real kube-apiserver without a node (a pod's exit is written as its
kubelet would).

- The endpoint refuses the first tries; the operator is stopped while it waits to try
  again and another started: the end is delivered exactly once, every try with the same
  CloudEvent id and the auth header from the Secret, and the Secret's value is nowhere in
  the operator's log, the run's Events or its status.
- An operator that stopped in the middle of a try (its ``Sending`` mark left): the next
  one does not send it again (at most once) and marks it Unknown.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from alpineagents.pod_contract import termination_message_json
from tests.bench.control_plane import ControlPlane
from tests.bench.http_sink import HttpSink
from tests.bench.operator_process import (
    Event,
    EventLog,
    OperatorProcess,
    agentrun,
    operator_in_namespace,
    pod_added,
)


@pytest.fixture
def notifying(
    control_plane: ControlPlane, tmp_path: Path
) -> Iterator[tuple[ControlPlane, str, OperatorProcess]]:
    with operator_in_namespace(control_plane, tmp_path, "notify") as (namespace, _, operator):
        operator.env["ALPINEAGENTS_NOTIFY_BACKOFF_SECONDS"] = "1"
        yield control_plane, namespace, operator


def marked(name: str, state: str) -> Callable[[Event], bool]:
    """Matches an event of AgentRun ``name`` whose notification mark is ``state``."""

    def matches(event: Event) -> bool:
        mark = (event.object.get("status") or {}).get("notification") or {}
        return event.object["metadata"]["name"] == name and mark.get("state") == state

    return matches


def pod_exits(plane: ControlPlane, namespace: str, pod: str, answer: str) -> None:
    """Write the pod's status as its kubelet would once the runner answered."""
    message = termination_message_json(
        outcome="answered",
        state_id="",
        last_saved_seq=3,
        turns=1,
        usage={"input_tokens": 120, "output_tokens": 40},
        answer=answer,
        error=None,
        cost_usd=0.0012,
    )
    status = {
        "phase": "Succeeded",
        "containerStatuses": [
            {
                "name": "agent",
                "image": "alpineagents:notify",
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": {
                    "terminated": {
                        "exitCode": 0,
                        "reason": "Completed",
                        "message": json.dumps(message),
                    }
                },
            }
        ],
    }
    plane.kubectl(
        "patch", "pod", pod, "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": status}),
    )  # fmt: skip


def auth_secret(plane: ControlPlane, namespace: str) -> str:
    value = f"Bearer hook-{uuid.uuid4().hex}"
    plane.kubectl(
        "create", "secret", "generic", "hook-auth", "-n", namespace, f"--from-literal=token={value}"
    )
    return value


def run_json(plane: ControlPlane, namespace: str, name: str) -> Any:
    return json.loads(plane.kubectl("get", "agentrun", name, "-n", namespace, "-o", "json").stdout)


def test_an_end_is_delivered_once_across_refusals_and_an_operator_restart(
    notifying: tuple[ControlPlane, str, OperatorProcess],
) -> None:
    plane, namespace, operator = notifying
    token = auth_secret(plane, namespace)
    client = plane.api_client()
    with (
        HttpSink(open=False) as sink,
        EventLog(client, namespace, "pods") as pods,
        EventLog(client, namespace, "agentruns") as runs,
    ):
        operator.start()
        notify = {
            "url": sink.url,
            "authSecretRef": {"name": "hook-auth", "key": "token"},
            "header": "X-Hook-Auth",
        }
        plane.kubectl("create", "-f", "-", input=agentrun(namespace, "told", notify=notify))
        pods.wait_for(pod_added("told"))
        pod_exits(plane, namespace, "told-1", "All done.\nThree files changed.")
        runs.wait_for(marked("told", "Retrying"))  # the endpoint refused the first try

        # Stopped while it waits to try again; the endpoint then takes it; another starts.
        assert operator.stop() == 0, operator.log_text()[-3000:]
        tries_before = len(sink.received)
        sink.open()
        operator.start()
        delivered = runs.wait_for(marked("told", "Delivered"))

    received = sink.received
    assert [r.answered for r in received].count(200) == 1, received
    assert received[-1].answered == 200 and len(received) > tries_before
    mark = delivered.object["status"]["notification"]
    assert mark["attempts"] == len(received), (mark, received)
    events = [json.loads(r.body) for r in received]
    assert {e["id"] for e in events} == {mark["id"]}
    assert all(r.headers["x-hook-auth"] == token for r in received)
    assert all(r.headers["content-type"] == "application/cloudevents+json" for r in received)
    event = events[-1]
    assert (event["specversion"], event["type"], event["subject"]) == (
        "1.0",
        "dev.alpineagents.run.finished",
        "told",
    )
    data = event["data"]
    assert (data["run"], data["namespace"], data["phase"], data["reason"]) == (
        "told",
        namespace,
        "Succeeded",
        "Answered",
    )
    assert data["answer"] == "All done.\nThree files changed." and data["costUSD"]
    assert data["usage"]["inputTokens"] == 120, data

    # The Secret's value reached the endpoint only.
    secret = token.split()[-1]
    assert secret not in operator.log_text()
    assert secret not in json.dumps(run_json(plane, namespace, "told"))
    listed = plane.kubectl("get", "events", "-n", namespace, "-o", "json").stdout
    assert secret not in listed
    reasons = [e["reason"] for e in json.loads(listed)["items"]]
    assert reasons.count("Notified") == 1, reasons


def test_a_try_cut_short_by_a_stopped_operator_is_not_sent_again(
    notifying: tuple[ControlPlane, str, OperatorProcess],
) -> None:
    plane, namespace, operator = notifying
    client = plane.api_client()
    with HttpSink() as sink, EventLog(client, namespace, "agentruns") as runs:
        plane.kubectl(
            "create", "-f", "-", input=agentrun(namespace, "cut", notify={"url": sink.url})
        )
        uid = run_json(plane, namespace, "cut")["metadata"]["uid"]
        end = f"{uid}-succeeded-20261207T050000Z"
        # As an operator leaves it when it stops between its Sending mark and the answer.
        status = {
            "phase": "Succeeded",
            "reason": "Answered",
            "completedAt": "2026-12-07T05:00:00Z",
            "notification": {"id": end, "state": "Sending", "attempts": 1},
        }
        plane.kubectl(
            "patch", "agentrun", "cut", "-n", namespace, "--subresource=status",
            "--type=merge", "-p", json.dumps({"status": status}),
        )  # fmt: skip
        operator.start()
        unknown = runs.wait_for(marked("cut", "Unknown"))
    assert sink.received == []
    assert unknown.object["status"]["notification"]["id"] == end
    assert "not sent again" in unknown.object["status"]["notification"]["message"]


def ends(plane: ControlPlane, namespace: str, name: str) -> None:
    """The run's status as an operator writes it when the run ends."""
    status = {"phase": "Succeeded", "reason": "Answered", "completedAt": "2026-12-07T05:00:00Z"}
    plane.kubectl(
        "patch", "agentrun", name, "-n", namespace, "--subresource=status",
        "--type=merge", "-p", json.dumps({"status": status}),
    )  # fmt: skip


def test_an_unusable_target_is_marked_failed_and_nothing_is_sent(
    notifying: tuple[ControlPlane, str, OperatorProcess],
) -> None:
    plane, namespace, operator = notifying
    client = plane.api_client()
    with HttpSink() as sink, EventLog(client, namespace, "agentruns") as runs:
        operator.start()
        missing = {"url": sink.url, "authSecretRef": {"name": "nowhere", "key": "token"}}
        plane.kubectl("create", "-f", "-", input=agentrun(namespace, "nosecret", notify=missing))
        ends(plane, namespace, "nosecret")
        failed = runs.wait_for(marked("nosecret", "Failed"))
        assert failed.object["status"]["notification"]["message"] == (
            "spec.notify.authSecretRef 'nowhere' (key 'token') does not exist in " + namespace
        )
        operator.stop()
        operator.env["ALPINEAGENTS_NOTIFICATIONS"] = "false"  # the chart's default
        operator.start()
        plane.kubectl(
            "create", "-f", "-", input=agentrun(namespace, "off", notify={"url": sink.url})
        )
        ends(plane, namespace, "off")
        off = runs.wait_for(marked("off", "Failed"))
    assert "notifications are off" in off.object["status"]["notification"]["message"]
    assert sink.received == []


async def test_two_operators_seeing_the_same_end_at_once_send_it_once(
    control_plane: ControlPlane,
) -> None:
    """The Sending mark is written only if the run is unchanged since it was read: of two
    operators judging the same end at the same moment (a leader deposed mid-handover and
    its successor), one sends."""
    from alpineagents_operator.kube.cluster import Cluster
    from alpineagents_operator.kube.config import OperatorConfig
    from alpineagents_operator.kube.views import AgentRunView
    from alpineagents_operator.reconciling.notifier import Notifier
    from tests.operator.test_reconciler_faults import Kube

    control_plane.apply_crds()
    kube = Kube(control_plane, f"twice-{uuid.uuid4().hex[:6]}")
    control_plane.kubectl("create", "namespace", kube.namespace)
    with HttpSink() as sink:
        kube.create_run("twice", notify={"url": sink.url})
        ends(control_plane, kube.namespace, "twice")
        view = AgentRunView.from_body(kube.run("twice"))
        config = OperatorConfig()
        clusters = [Cluster(control_plane.api_client()) for _ in range(2)]
        notifiers = [Notifier(config, cluster, lambda: datetime.now(UTC)) for cluster in clusters]
        try:
            for notifier in notifiers:
                notifier.run_seen(view, gone=False)  # both judge it due, from the same read
            for notifier in notifiers:
                await notifier.tried()
        finally:
            for notifier, cluster in zip(notifiers, clusters, strict=True):
                notifier.close()
                cluster.close()
        assert len(sink.received) == 1, sink.received
    mark = kube.run("twice")["status"]["notification"]
    assert (mark["state"], mark["attempts"]) == ("Delivered", 1), mark
