"""An idle operator's API requests do not grow with its runs.

The operator as its own process (a ServiceAccount of its own, so the API server's audit
log counts its requests apart) on the real kube-apiserver without a node (pods stay
Pending), its resync every second. Once 10 runs have their pods and nothing changes, its
requests over a window of several resync rounds are counted; then the same with 50 runs.
Today's resync reads each run and lists its pods every round (two requests per run per
round); from the watches' views it makes none for a run that is as it should be. The
heavy scale (10,000 runs) is ``benchmarks/operator_runs.py``.

A restarted operator judges each run it resumes from its watches' views and one paged
listing of the run pods: a run that needs nothing costs it no request (it used to read
each run and list its pods, twice). A pod whose run was deleted while no operator ran
(the test takes its owner reference away, as if no garbage collector ran) is still
stopped once the operator is back.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from benchmarks.operator_checks import free_port, resumed, run_checks

from tests.bench.control_plane import ControlPlane
from tests.bench.operator_process import (
    EventLog,
    OperatorProcess,
    agentrun,
    operator_in_namespace,
    pod_added,
)

RESYNC_SECONDS = 1.0
WINDOW_SECONDS = 6.0  # six resync rounds: the figure counted, not a deadline
HANDLED = "kopf.alpineagents.dev/last-handled-configuration"


class Idle:
    def __init__(self, plane: ControlPlane, namespace: str, operator: OperatorProcess) -> None:
        self.plane, self.namespace, self.operator = plane, namespace, operator

    def requests(self) -> list[str]:
        user = f"system:serviceaccount:{self.namespace}:{self.operator.name}"
        return [
            f"{e.get('verb')} {(e.get('objectRef') or {}).get('resource', '?')}"
            for e in self.plane.audit_events(user)
        ]

    def create_runs(self, names: list[str], pods: EventLog) -> None:
        """Create the runs; return once each has its pod and the operator is done with it
        (its status names the pod and kopf marked it handled)."""
        items = [json.loads(agentrun(self.namespace, name)) for name in names]
        listing = yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items})
        self.plane.kubectl("create", "-f", "-", input=listing)
        for name in names:
            pods.wait_for(pod_added(name))
        deadline = time.monotonic() + 300
        while not self._all_handled(len(names)):
            assert time.monotonic() < deadline, "the runs were not all handled"
            time.sleep(0.5)  # its status and kopf's annotation: read back as the admin

    def _all_handled(self, at_least: int) -> bool:
        listing = self.plane.kubectl("get", "agentruns", "-n", self.namespace, "-o", "json")
        items = json.loads(listing.stdout)["items"]
        handled = [
            item
            for item in items
            if HANDLED in (item["metadata"].get("annotations") or {})
            and (item.get("status") or {}).get("pod")
        ]
        return len(handled) == len(items) and len(items) >= at_least

    def idle_requests(self) -> list[str]:
        """The operator's requests over the window, after a round for the last steps."""
        time.sleep(2 * RESYNC_SECONDS)  # the handled runs' follow-up steps end
        before = len(self.requests())
        time.sleep(WINDOW_SECONDS)  # counting requests over a window is the measure
        time.sleep(1.0)  # the audit log is written as requests finish
        return self.requests()[before:]


@pytest.fixture
def idle(control_plane: ControlPlane, tmp_path: Path) -> Iterator[Idle]:
    with operator_in_namespace(control_plane, tmp_path, "idle", resync_seconds=RESYNC_SECONDS) as (
        namespace,
        _,
        operator,
    ):
        yield Idle(control_plane, namespace, operator)


def test_an_idle_operator_makes_no_more_requests_with_five_times_the_runs(idle: Idle) -> None:
    with EventLog(idle.plane.api_client(), idle.namespace, "pods") as pods:
        idle.operator.start()
        idle.create_runs([f"few-{n}" for n in range(10)], pods)
        few = idle.idle_requests()
        idle.create_runs([f"many-{n}" for n in range(40)], pods)
        many = idle.idle_requests()
    rounds = WINDOW_SECONDS / RESYNC_SECONDS
    detail = f"10 runs: {few}; 50 runs: {many}\n{idle.operator.log_text()[-3000:]}"
    # Per-run polling would be 2 requests per run per round: 120 and 600 here.
    assert len(many) <= 2 * len(few) + 10, detail
    assert len(many) < 50 * rounds / 4, detail


def test_a_restarted_operator_sends_no_request_per_run_for_runs_that_need_nothing(
    idle: Idle,
) -> None:
    names = [f"kept-{n}" for n in range(30)]
    with EventLog(idle.plane.api_client(), idle.namespace, "pods") as pods:
        idle.operator.start()
        idle.create_runs(names, pods)
        idle.operator.stop()
        before = len(idle.requests())
        port = free_port()
        idle.operator.env["ALPINEAGENTS_METRICS_PORT"] = str(port)
        idle.operator.start()
        deadline = time.monotonic() + 300
        while resumed(port) < len(names):
            assert time.monotonic() < deadline, idle.operator.log_text()[-3000:]
            time.sleep(0.5)  # its metrics page has no change event
        # The restarted operator acts where something changed: one run's pod is lost.
        idle.plane.kubectl("delete", "pod", f"{names[0]}-1", "-n", idle.namespace)
        pods.wait_for(lambda e: e.type == "ADDED" and e.name == f"{names[0]}-2")
        time.sleep(1.0)  # the audit log is written as requests finish
        since_restart = idle.requests()[before:]
    checks = run_checks(port)
    detail = f"{since_restart}\n{checks}\n{idle.operator.log_text()[-3000:]}"
    assert checks.get(("resume", "true"), 0) == 0, detail
    # Per run it used to be a GET of the run and a LIST of its pods, twice (120 here);
    # now: the operator's own listing of the pods, kopf's, and the lost pod's run's steps.
    reads = [r for r in since_restart if r in ("get agentruns", "list pods")]
    assert len(reads) < len(names), detail


def test_a_pod_whose_run_was_deleted_while_no_operator_ran_is_stopped_after_its_start(
    idle: Idle,
) -> None:
    with EventLog(idle.plane.api_client(), idle.namespace, "pods") as pods:
        idle.operator.start()
        idle.create_runs(["deleted-0", "kept-0"], pods)
        idle.operator.stop()
        # As on a cluster without a garbage collector: a session's other tests may start
        # one on this plane, and it would delete the pod of the deleted run on its own.
        idle.plane.kubectl(
            *("patch", "pod", "deleted-0-1", "-n", idle.namespace, "--type=json"),
            *("-p", '[{"op": "remove", "path": "/metadata/ownerReferences"}]'),
        )
        idle.plane.kubectl("delete", "agentrun", "deleted-0", "-n", idle.namespace)
        restarted = time.monotonic()
        idle.operator.start()
        pods.wait_for(lambda e: e.type == "DELETED" and e.name == "deleted-0-1", restarted)
    kept = idle.plane.kubectl("get", "pods", "-n", idle.namespace, "-o", "name").stdout.split()
    assert kept == ["pod/kept-0-1"], kept


def test_the_operator_logs_its_decisions_at_info_not_a_line_per_watch_event(idle: Idle) -> None:
    # kopf's "Handler ... succeeded." for every event was a tenth of the operator's CPU in
    # a burst of lost pods, written on its event loop's thread.
    with EventLog(idle.plane.api_client(), idle.namespace, "pods") as pods:
        idle.operator.start()
        idle.create_runs(["logged-0", "logged-1"], pods)
    logged = idle.operator.log_text()
    assert f"{idle.namespace}/logged-0: " in logged and "creating pod logged-1-1" in logged, logged
    assert "Handler '" not in logged, logged  # kopf's "Handler 'pod_changed' succeeded."
