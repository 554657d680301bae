"""A standby takes the Lease as soon as its holder's pod shows the holder dead, instead of
waiting out the lease (:mod:`alpineagents_operator.edge.lease_holder`), on the real
kube-apiserver (:mod:`tests.bench.control_plane`, no node).

With no node there is no kubelet: the test writes the holder pod's status as the kubelet
reports a container that died (terminated, or restarted), through the status subresource
the kubelet uses. The Lease is 600 s, so a takeover within the test's wait can only come
from the holder's pod, never from the lease running out.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from alpineagents_operator.edge.leadership import LeaderElector, LeaseSettings
from alpineagents_operator.edge.lease_holder import HolderLiveness, api_pod_reader
from tests.bench.control_plane import ControlPlane
from tests.bench.operator_process import (
    WAIT_LIMIT,
    EventLog,
    LeaseTiming,
    OperatorProcess,
    held_by,
    operator_kubeconfig,
)

LEASE = "alpineagents-operator"
LONG = LeaseTiming(lease_seconds=600, renew_deadline_seconds=10.0, retry_seconds=0.5)


@pytest.fixture
def namespace(control_plane: ControlPlane) -> Iterator[str]:
    control_plane.apply_crds()
    name = f"lh-{uuid.uuid4().hex[:6]}"
    control_plane.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        control_plane.kubectl("delete", "namespace", name, "--wait=false", check=False)


def _pod(plane: ControlPlane, namespace: str, name: str) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"containers": [{"name": "operator", "image": "alpineagents:bench"}]},
    }
    plane.kubectl("create", "-f", "-", input=json.dumps(body))


def _report(
    plane: ControlPlane, namespace: str, pod: str, restarts: int, state: Any, last: Any = None
) -> None:
    """Write the pod's container status as the kubelet would."""
    status = {
        "phase": "Running",
        "containerStatuses": [
            {
                "name": "operator",
                "image": "alpineagents:bench",
                "imageID": "",
                "ready": "running" in state,
                "restartCount": restarts,
                "state": state,
                "lastState": last or {},
            }
        ],
    }
    plane.kubectl(
        "patch", "pod", pod, "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": status}),
    )  # fmt: skip


def _wait_until(condition: Callable[[], bool], what: str) -> None:
    """For what has no event: the standby's last look at the Lease is an attribute."""
    deadline = time.monotonic() + WAIT_LIMIT
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


RUNNING = {"running": {"startedAt": "2026-12-07T05:00:00Z"}}
TERMINATED = {
    "terminated": {
        "exitCode": 137,
        "reason": "Error",
        "startedAt": "2026-12-07T05:00:00Z",
        "finishedAt": "2026-12-07T05:01:00Z",
    }
}


BACK_OFF = {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s"}}
CREATING = {"waiting": {"reason": "ContainerCreating"}}


def test_a_standby_takes_the_lease_once_the_holders_container_has_died(
    control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    """A leader process SIGKILLed; its pod then shows its container terminated: the
    standby takes the 600 s Lease at once, and says why."""
    _pod(control_plane, namespace, "operator-a")
    _report(control_plane, namespace, "operator-a", 0, RUNNING)
    store = tmp_path / "runs"
    store.mkdir()
    leader = OperatorProcess(
        "operator-a",
        operator_kubeconfig(control_plane, namespace, "operator-a", tmp_path),
        namespace,
        store,
        tmp_path / "operator-a.log",
        lease=f"{namespace}/{LEASE}",
        timing=LONG,
    )
    settings = LeaseSettings(
        namespace, LEASE, f"operator-b_{uuid.uuid4().hex[:8]}", 600, 10.0, 0.5, holder_pod=True
    )
    standby = LeaderElector(settings, control_plane.api_client(), lambda reason: None)
    stop = threading.Event()
    took: list[bool] = []
    waiting = threading.Thread(target=lambda: took.append(standby.acquire(stop)))
    api = control_plane.api_client()
    try:
        with EventLog(api, namespace, "leases") as leases:
            leader.start()
            leases.wait_for(held_by("operator-a"))
            waiting.start()
            _wait_until(lambda: standby.holder.startswith("operator-a_"), "the standby looks")
            leader.kill()
            _report(control_plane, namespace, "operator-a", 0, TERMINATED)
            taken = leases.wait_for(held_by("operator-b"))
            waiting.join(WAIT_LIMIT)
        assert took == [True]
        assert standby.leading
        spec = taken.object["spec"]
        assert spec["holderIdentity"] == settings.identity
        assert int(spec["leaseTransitions"]) >= 1
    finally:
        stop.set()
        standby.release()
        leader.stop()


def test_the_holders_pod_says_when_it_is_dead_and_nothing_else_does(
    control_plane: ControlPlane, namespace: str
) -> None:
    """What the standby reads from the holder's pod, state by state."""
    _pod(control_plane, namespace, "op-a")
    reader = api_pod_reader(control_plane.api_client(), namespace, 10.0)
    liveness = HolderLiveness("op-b_1111", reader)
    holder = "op-a_2222"

    assert liveness.dead(holder) == ""  # Pending, no container yet: nothing proved
    _report(control_plane, namespace, "op-a", 0, CREATING)
    assert liveness.dead(holder) == ""  # waiting, but never ran: nothing proved either
    _report(control_plane, namespace, "op-a", 0, RUNNING)
    assert liveness.dead(holder) == ""
    _report(control_plane, namespace, "op-a", 1, RUNNING)  # restarted since first seen
    assert "restarted" in liveness.dead(holder)

    liveness.forget(holder)
    assert liveness.dead(holder) == ""  # seen afresh: the restarted container may hold it
    # Crashed again: the kubelet holds it back (crash-loop back-off) before a restart, so
    # the restart count has not grown yet, but no process of that container is left.
    _report(control_plane, namespace, "op-a", 1, BACK_OFF, last=TERMINATED)
    assert "waits to start again (CrashLoopBackOff)" in liveness.dead(holder)
    _report(control_plane, namespace, "op-a", 1, TERMINATED)
    assert "terminated" in liveness.dead(holder)

    control_plane.kubectl("delete", "pod", "op-a", "-n", namespace, "--grace-period=0", "--force")
    assert "gone" in liveness.dead(holder)

    # A holder that ran in this replica's own pod died before this process started.
    assert "this pod" in liveness.dead("op-b_3333")
    assert liveness.dead("op-b_1111") == ""  # this process itself
    assert liveness.dead("") == ""


def test_a_pod_that_cannot_be_read_proves_nothing() -> None:
    def unreadable(name: str) -> dict[str, Any] | None:
        raise ConnectionError("the API server is unreachable")

    assert HolderLiveness("op-b_1", unreadable).dead("op-a_2") == ""


def test_the_holder_pod_setting_is_read_and_checked() -> None:
    base = {"ALPINEAGENTS_LEADER_LEASE": "ns/lease", "POD_ID": "op-a"}
    on = LeaseSettings.from_env({**base, "ALPINEAGENTS_LEASE_HOLDER_POD": "true"})
    assert on is not None and on.holder_pod
    off = LeaseSettings.from_env(base)
    assert off is not None and not off.holder_pod
    with pytest.raises(ValueError, match="ALPINEAGENTS_LEASE_HOLDER_POD"):
        LeaseSettings.from_env({**base, "ALPINEAGENTS_LEASE_HOLDER_POD": "yes"})
