"""Admission caps on the bench's real node: the release upgraded to
``admission.maxRunningPerNamespace`` (put back after), runs applied at once.

Never more runs with a live pod than the cap (a pod watch counts them), every run
``Succeeded``, admitted in order of ``spec.priority`` then age, and a run holding a place
whose pod is deleted resumes at once, without queueing behind the others.

Suite scale: six runs capped at two. The issue's scale (30 capped at 5) is
``ALPINEAGENTS_ADMISSION_RUNS=30 ALPINEAGENTS_ADMISSION_CAP=5``.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from tests.bench.helm import Helm
from tests.bench.tool_gate import ToolGate
from tests.e2e.environment import (
    Environment,
    apply_run,
    gated,
    status,
    upgrade_release,
    wait_for_run,
)

pytestmark = pytest.mark.e2e
RUNS = int(os.environ.get("ALPINEAGENTS_ADMISSION_RUNS", "6"))
CAP = int(os.environ.get("ALPINEAGENTS_ADMISSION_CAP", "2"))


class LivePods:
    """Watches the namespace's run pods and keeps the most runs with a live pod at once
    (a pod being deleted, or whose container exited, no longer counts: its run's place
    may pass on)."""

    def __init__(self, env: Environment, prefix: str) -> None:
        self.env, self.prefix = env, prefix
        self.most = 0
        self._live: dict[str, set[str]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> LivePods:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()

    def _watch(self) -> None:
        from kubernetes import client, watch

        core = client.CoreV1Api(self.env.api_client)
        while not self._stop.is_set():
            stream = watch.Watch().stream(
                core.list_namespaced_pod,
                self.env.namespace,
                label_selector="alpineagents.dev/run",
                timeout_seconds=5,
            )
            for event in stream:
                pod = event["object"]
                run = (pod.metadata.labels or {}).get("alpineagents.dev/run", "")
                if not run.startswith(self.prefix):
                    continue
                pods = self._live.setdefault(run, set())
                ending = event["type"] == "DELETED" or pod.metadata.deletion_timestamp
                # The run ends with its container's exit (the operator acts on it); the
                # pod's phase follows when the kubelet tears the pod down.
                exited = any(
                    c.state is not None and c.state.terminated is not None
                    for c in pod.status.container_statuses or []
                )
                if ending or exited or pod.status.phase in ("Succeeded", "Failed"):
                    pods.discard(pod.metadata.name)
                else:
                    pods.add(pod.metadata.name)
                self.most = max(self.most, sum(1 for p in self._live.values() if p))


@pytest.fixture
def capped(node_env: Environment, helm: Helm) -> Iterator[Environment]:
    upgrade_release(node_env, helm, {"admission": {"maxRunningPerNamespace": CAP}})
    try:
        yield node_env
    finally:
        upgrade_release(node_env, helm, {})


def test_a_capped_namespace_runs_at_most_its_cap_in_order_and_all_succeed(
    capped: Environment, gate: ToolGate
) -> None:
    env = capped
    prefix = f"adm-{uuid.uuid4().hex[:4]}"
    # The first CAP take the places; the rest queue behind them. The last one is urgent:
    # it goes first when a place frees, the others by age.
    names = [f"{prefix}-{i:02d}" for i in range(RUNS)]  # same age: then by name, as here
    with LivePods(env, prefix) as live:
        for name in names[:CAP]:
            apply_run(env, name, gated(gate, name))
        for name in names[:CAP]:
            gate.wait_started(name)
        for index, name in enumerate(names[CAP:], CAP):
            apply_run(env, name, gated(gate, name), priority=10 if index == RUNS - 1 else 0)
        waiting = wait_for_run(
            env, names[CAP], lambda run: status(run).get("phase") == "Queued", "Queued"
        )
        assert status(waiting)["reason"] == "NamespaceCap", status(waiting)
        started = list(names[:CAP])

        def next_start() -> None:
            deadline = time.monotonic() + 300
            while not (new := [n for n in names if n not in started and gate.starts(n)]):
                assert time.monotonic() < deadline, started
                time.sleep(0.1)  # the gate's counts have no change event to await here
            assert len(new) == 1, (started, new)  # one place freed, one run admitted
            started.extend(new)

        # A run holding a place loses its pod: it resumes at once (had it queued, no
        # place would free for it), closes its call as aborted and answers.
        env.kubectl("delete", "pod", f"{names[0]}-1", "--wait=false")
        resumed = wait_for_run(
            env, names[0], lambda run: status(run).get("phase") == "Succeeded", "Succeeded"
        )
        assert status(resumed)["attempt"] == 2, status(resumed)
        next_start()  # the place it gave up when it ended
        for name in started:  # grows as runs are admitted
            if name == names[0]:
                continue
            gate.release(name)
            if len(started) < RUNS:
                next_start()
        for name in names:
            wait_for_run(
                env, name, lambda run: status(run).get("phase") == "Succeeded", "Succeeded"
            )
    assert live.most == CAP, live.most
    # Admitted by priority, then age: the urgent run first of those that queued.
    assert started == [*names[:CAP], names[-1], *names[CAP:-1]], started
