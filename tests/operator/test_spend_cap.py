"""The daily spend cap, with the operator as its own process on the bench's real
kube-apiserver (no node: the test is each pod's kubelet), each pod's container the real
runner as a process of its own, and the scripted Messages API as the model.

A namespace capped at $0.05 by its annotation ``alpineagents.dev/daily-spend-usd``, runs
that cost $0.01 each (the price table makes one reply of ``done`` cost exactly that):
five end, and the sixth, running meanwhile (its model request held), has its pod taken
back at the cap and stops at its next step, saved; a run applied then stays ``Queued``;
raising the cap resumes the sixth from where it stopped, and its State has lost no entry.

Then, with the :class:`Reconciler` in this process and its clock the test's: a run held
at the cap starts once the UTC day rolls over (and the namespace's spend metric goes back
to 0), and an annotation that is not a number of dollars is one Warning Event naming it,
the chart's cap holding.
"""

from __future__ import annotations

import base64
import json
import signal
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from alpineagents import FileStore, State
from alpineagents.testing import ModelServer, hold, reply, tool_use
from alpineagents_operator.kube.cluster import Cluster
from alpineagents_operator.kube.config import OperatorConfig
from alpineagents_operator.kube.daily_spend import SPEND_ANNOTATION, SPEND_REASON
from alpineagents_operator.kube.views import format_time
from alpineagents_operator.reconciling.reconciler import Reconciler
from alpineagents_operator.watching.watched import Watched
from tests.bench.control_plane import ControlPlane
from tests.bench.operator_process import (
    Event,
    EventLog,
    agentrun,
    operator_in_namespace,
    pod_added,
)
from tests.bench.runner_process import RunnerProcess, child_env
from tests.operator.test_reconciler_faults import Kube, status

JSON = dict[str, Any]
DONE = "done"
# One reply of DONE is 8 output tokens (the scripted server counts about 4 characters of
# its JSON a token): at $1,250 a million, $0.01. Input is free, so each run's cost is
# exactly its replies'.
PRICES = {"claude-sonnet": {"input": 0, "output": 1250}}


def phase_is(name: str, phase: str, reason: str | None = None) -> Callable[[Event], bool]:
    def matches(event: Event) -> bool:
        status = event.object.get("status") or {}
        return (
            event.name == name
            and status.get("phase") == phase
            and (reason is None or status.get("reason") == reason)
        )

    return matches


class Kubelet:
    """What the test does as the kubelet of the bench's missing node: runs each pod's
    container as the runner process, and writes its state into the pod's status."""

    def __init__(
        self, plane: ControlPlane, namespace: str, model: ModelServer, folder: Path
    ) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(plane.api_client())
        self.namespace = namespace
        self.model = model
        self.folder = folder
        self.processes: list[RunnerProcess] = []

    def start(self, pod: JSON) -> RunnerProcess:
        """Start the pod's container: the runner with the pod's environment and its spec
        Secret as the file it names; the pod then shows its container running."""
        name = pod["metadata"]["name"]
        work = self.folder / name
        work.mkdir(parents=True)
        secret = self.core.read_namespaced_secret(f"{name}-spec", self.namespace)
        spec_file = work / "spec.json"
        spec_file.write_bytes(base64.b64decode(secret.data["spec.json"]))
        container = pod["spec"]["containers"][0]
        env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
        env["ALPINEAGENTS_SPEC_FILE"] = str(spec_file)
        runner = RunnerProcess(["run"], workdir=work, env=child_env(self.model, **env))
        self.processes.append(runner)
        self._container(name, {"running": {"startedAt": format_time(datetime.now(UTC))}})
        return runner

    def exited(self, pod: str, runner: RunnerProcess, *, gone: bool = False) -> int:
        """Wait for the container's process to end; write its exit as the kubelet would
        (not for a pod already ``gone``: an unscheduled pod is deleted at once)."""
        code = runner.wait()
        if gone:
            return code
        message = runner.message_path.read_text() if runner.message_path.exists() else ""
        terminated = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "message": message,
        }
        self._container(pod, {"terminated": terminated}, "Succeeded" if code == 0 else "Failed")
        return code

    def _container(self, pod: str, state: JSON, phase: str = "Running") -> None:
        status = {
            "phase": phase,
            "containerStatuses": [
                {
                    "name": "agent",
                    "image": "alpineagents:spend",
                    "imageID": "",
                    "ready": "running" in state,
                    "restartCount": 0,
                    "state": state,
                }
            ],
        }
        self.core.patch_namespaced_pod_status(pod, self.namespace, {"status": status})

    def stop(self) -> None:
        for runner in self.processes:
            runner.stop()


def test_at_the_spend_cap_the_sixth_run_pauses_and_resumes_when_the_cap_is_raised(
    control_plane: ControlPlane, model_server: ModelServer, tmp_path: Path
) -> None:
    plane = control_plane
    with operator_in_namespace(plane, tmp_path, "spend") as (namespace, folder, operator):
        plane.kubectl("annotate", "namespace", namespace, f"{SPEND_ANNOTATION}=0.05")
        operator.env["ALPINEAGENTS_NAMESPACE_CAPS"] = "true"
        operator.env["ALPINEAGENTS_PRICES"] = json.dumps(PRICES)
        # The resync re-reads a held namespace's annotation: a raised cap shows within it.
        operator.env["ALPINEAGENTS_RESYNC_SECONDS"] = "2"
        kubelet = Kubelet(plane, namespace, model_server, tmp_path / "pods")
        client = plane.api_client()
        try:
            with (
                EventLog(client, namespace, "pods") as pods,
                EventLog(client, namespace, "agentruns") as runs,
            ):
                operator.start()

                def run_to_the_end(name: str) -> None:
                    plane.kubectl("create", "-f", "-", input=agentrun(namespace, name))
                    pod = pods.wait_for(pod_added(name)).object
                    assert kubelet.exited(f"{name}-1", kubelet.start(pod)) == 0
                    runs.wait_for(phase_is(name, "Succeeded"))

                for number in range(1, 5):
                    model_server.add(DONE)
                    run_to_the_end(f"run-{number}")

                # The sixth: a tool call, then its next model request waits (held).
                model_server.add(reply(tool_use("shell", {"command": "echo one step"})))
                model_server.add(hold(DONE))
                asked = len(model_server.requests)
                plane.kubectl(
                    "create", "-f", "-", input=agentrun(namespace, "sixth", tools=["shell"])
                )
                sixth = kubelet.start(pods.wait_for(pod_added("sixth")).object)
                model_server.wait_for_requests(asked + 2)
                runs.wait_for(phase_is("sixth", "Running"))

                # The fifth ends: $0.05 spent today. The sixth's pod is taken back.
                model_server.add(DONE)
                run_to_the_end("run-5")
                pods.wait_for(lambda e: e.type == "DELETED" and e.name == "sixth-1")
                sixth.signal(signal.SIGTERM)  # the kubelet's stop: it saves, then ends
                assert kubelet.exited("sixth-1", sixth, gone=True) == 143, sixth.stderr
                held = runs.wait_for(phase_is("sixth", "Queued", SPEND_REASON)).object
                status = held["status"]
                assert status["message"].startswith(
                    f"daily spend cap: namespace {namespace} spent $0.05 of its $0.05 on "
                ), status
                assert "restarts" not in status and "disruptions" not in status
                state_id = status["stateId"]
                paused = FileStore(folder).load(state_id)
                # Stopped before its answer, its one step done and saved.
                assert paused.answer is None
                assert [e.outcome for e in paused.history if e.kind == "tool_result"] == ["ok"]

                # A run applied at the cap queues, naming the spend cap; the sixth waits too.
                plane.kubectl("create", "-f", "-", input=agentrun(namespace, "seventh"))
                seventh = runs.wait_for(phase_is("seventh", "Queued", SPEND_REASON))
                assert seventh.object["status"]["reason"] != "NamespaceCap"
                assert not [e for e in pods.events if e.name.startswith(("sixth-2", "seventh"))]
                plane.kubectl("delete", "agentrun", "seventh", "-n", namespace)

                # The cap raised: the sixth resumes from where it stopped.
                model_server.add(DONE)
                plane.kubectl(
                    "annotate", "namespace", namespace, f"{SPEND_ANNOTATION}=1", "--overwrite"
                )
                second = pods.wait_for(lambda e: e.type == "ADDED" and e.name == "sixth-2").object
                assert kubelet.exited("sixth-2", kubelet.start(second)) == 0
                done = runs.wait_for(phase_is("sixth", "Succeeded")).object
        finally:
            kubelet.stop()
    assert done["status"]["answer"] == DONE
    assert float(done["status"]["costUSD"]) > 0.01  # its tool call's reply, and the answer
    final = FileStore(folder).load(state_id)
    assert_kept(paused, final)
    reasons = events_of(plane, namespace, "sixth")
    assert {"Queued", "Resumed"} <= set(reasons), reasons


def assert_kept(paused: State, final: State) -> None:
    """Every entry saved before the pause is in the final history, unchanged, and the
    run went on from the last of them to its answer."""
    before = [(e.seq, e.kind, e.text) for e in paused.history]
    assert [(e.seq, e.kind, e.text) for e in final.history[: len(before)]] == before
    results = [e for e in final.history if e.kind == "tool_result"]
    assert [e.outcome for e in results] == ["ok"], results
    assert final.answer == DONE


def events_of(plane: ControlPlane, namespace: str, name: str) -> list[str]:
    items = json.loads(
        plane.kubectl(
            "get",
            "events",
            "-n",
            namespace,
            f"--field-selector=involvedObject.name={name}",
            "-o",
            "json",
        ).stdout
    )["items"]
    return [str(item["reason"]) for item in items]


# ------------------------------------------------------------------ the Reconciler in process
class Clock:
    """The reconciler's clock, moved on by the test: a minute before midnight (UTC)."""

    def __init__(self) -> None:
        self.now = datetime(2026, 12, 7, 23, 59, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def kube(control_plane: ControlPlane) -> Kube:
    control_plane.apply_crds()
    namespace = f"spend-{uuid.uuid4().hex[:6]}"
    control_plane.kubectl("create", "namespace", namespace)
    return Kube(control_plane, namespace)


@pytest.fixture
def clock() -> Clock:
    return Clock()


def reconciler_for(kube: Kube, folder: Path, clock: Clock, **settings: Any) -> Reconciler:
    folder.mkdir()
    config = OperatorConfig(
        namespaces=(kube.namespace,),
        store=folder.as_uri(),
        image="alpineagents:spend",
        run_credentials="shared",  # a FileStore: no credentials of a run's own
        **settings,
    )
    return Reconciler(config, Cluster(kube.plane.api_client()), clock=clock, watched=Watched())


@pytest.fixture
def capped(kube: Kube, tmp_path: Path, clock: Clock) -> Iterator[Reconciler]:
    """The chart's cap of $0.05 a namespace."""
    reconciler = reconciler_for(kube, tmp_path / "runs", clock, daily_spend_usd_per_namespace=0.05)
    try:
        yield reconciler
    finally:
        reconciler.close()


def seen(reconciler: Reconciler, kube: Kube, name: str) -> None:
    """The run as its watch event would deliver it to the operator."""
    reconciler.run_seen(kube.run(name), gone=False)


def spend_metric(reconciler: Reconciler, namespace: str) -> float | None:
    value = reconciler.metrics.registry.get_sample_value(
        "alpineagents_admission_spend_today_usd", {"namespace": namespace}
    )
    return None if value is None else float(value)


async def test_a_run_held_at_the_cap_starts_when_the_utc_day_rolls_over(
    kube: Kube, capped: Reconciler, clock: Clock
) -> None:
    reconciler = capped
    for number in range(5):  # $0.01 each, today
        name = f"spent-{number}"
        kube.create_run(name)
        kube.set_status(
            name,
            {
                "phase": "Succeeded",
                "costUSD": "0.0100",
                "dailySpend": {"day": "2026-12-07", "fromUSD": "0.0000"},
            },
        )
        seen(reconciler, kube, name)
    assert spend_metric(reconciler, kube.namespace) == pytest.approx(0.05)
    kube.create_run("late")
    seen(reconciler, kube, "late")
    await reconciler.reconcile(kube.namespace, "late")
    held = status(kube.run("late"))
    assert (held["phase"], held["reason"]) == ("Queued", SPEND_REASON), held
    assert "(admission.dailySpendUSDPerNamespace)" in held["message"]
    seen(reconciler, kube, "late")
    await reconciler.resync()  # the same day: it stays held
    assert kube.pod_names("late") == []
    clock.now += timedelta(minutes=2)  # 00:01 UTC, the next day
    await reconciler.resync()
    assert kube.pod_names("late") == ["late-1"]
    assert status(kube.run("late"))["phase"] == "Pending"
    assert spend_metric(reconciler, kube.namespace) == 0.0


async def test_an_annotation_that_is_not_dollars_is_one_warning_event_and_the_charts_cap_holds(
    kube: Kube, tmp_path: Path, clock: Clock
) -> None:
    kube.plane.kubectl("annotate", "namespace", kube.namespace, f"{SPEND_ANNOTATION}=lots")
    # The chart's cap of $0 lets no run start.
    reconciler = reconciler_for(
        kube,
        tmp_path / "runs",
        clock,
        daily_spend_usd_per_namespace=0.0,
        namespace_caps=True,
    )
    try:
        for name in ("first", "second"):
            kube.create_run(name)
            await reconciler.reconcile(kube.namespace, name)
            held = status(kube.run(name))
            assert (held["phase"], held["reason"]) == ("Queued", SPEND_REASON), held
            assert "of its $0.00" in held["message"]
        warnings = [
            e
            for name in ("first", "second")
            for e in kube.core.list_namespaced_event(
                kube.namespace, field_selector=f"involvedObject.name={name}"
            ).items
            if e.reason == "InvalidSpendCap"
        ]
        assert len(warnings) == 1, warnings
        assert warnings[0].type == "Warning"
        assert warnings[0].message.startswith(
            f"annotation {SPEND_ANNOTATION} of Namespace {kube.namespace} must be a number of "
            "US dollars per day"
        )
        assert "admission.dailySpendUSDPerNamespace ($0.00) holds" in warnings[0].message
    finally:
        reconciler.close()
