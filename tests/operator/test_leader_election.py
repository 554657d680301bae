"""Two operator replicas, one acting: the Lease-based leader election on the real
kube-apiserver (:mod:`tests.bench.control_plane`, no node, so pods stay Pending).

- Two operator processes, each with a ServiceAccount of its own (the audit log tells
  their requests apart): only the Lease's holder touches AgentRuns or pods; a new run
  gets one pod. The leader is SIGKILLed: the standby takes the Lease once it expires and
  gives the next new run its pod; the old runs get no second pod. The failover time (kill
  → the next run's pod) is recorded, not asserted (see ``benchmarks/failover.py``).
- A leader SIGTERMed hands the Lease back: the standby takes over without waiting out the
  lease.
- A leader cut off from the API server (every byte to it held by a proxy) stops acting
  before the standby may take its Lease.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from alpineagents_operator.edge.leadership import LeaderElector, LeaseSettings
from tests.bench.control_plane import ControlPlane
from tests.bench.operator_process import (
    WAIT_LIMIT,
    EventLog,
    OperatorProcess,
    agentrun,
    holder,
    operator_kubeconfig,
    run_label,
)

LEASE = "alpineagents-operator"


@dataclass
class Pair:
    plane: ControlPlane
    namespace: str
    first: OperatorProcess
    second: OperatorProcess

    def user(self, operator: OperatorProcess) -> str:
        return f"system:serviceaccount:{self.namespace}:{operator.name}"

    def requests(self, operator: OperatorProcess) -> list[tuple[str, str, str]]:
        """(verb, resource[/subresource], name) of every request ``operator`` made."""
        found = []
        for event in self.plane.audit_events(self.user(operator)):
            ref = event.get("objectRef") or {}
            resource = ref.get("resource", "?") + (
                "/" + ref["subresource"] if ref.get("subresource") else ""
            )
            found.append((str(event.get("verb")), resource, str(ref.get("name", ""))))
        return found

    def create_run(self, name: str) -> None:
        self.plane.kubectl("create", "-f", "-", input=agentrun(self.namespace, name))

    def diagnostics(self) -> str:
        return "\n".join(
            f"--- {o.name} log (last lines):\n" + "\n".join(o.log_text().splitlines()[-30:])
            for o in (self.first, self.second)
        )


def _wait_until(condition: Callable[[], bool], what: str) -> None:
    """For what has no watch event: the audit log and the operators' logs are files."""
    deadline = time.monotonic() + WAIT_LIMIT
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {WAIT_LIMIT} s")
        time.sleep(0.1)


@pytest.fixture
def pair(control_plane: ControlPlane, tmp_path: Path) -> Iterator[Pair]:
    control_plane.apply_crds()
    namespace = f"ha-{uuid.uuid4().hex[:6]}"
    control_plane.kubectl("create", "namespace", namespace)
    store = tmp_path / "runs"
    store.mkdir()
    operators = [
        OperatorProcess(
            name,
            operator_kubeconfig(control_plane, namespace, name, tmp_path),
            namespace,
            store,
            tmp_path / f"{name}.log",
            lease=f"{namespace}/{LEASE}",
        )
        for name in ("operator-a", "operator-b")
    ]
    pair = Pair(control_plane, namespace, *operators)
    try:
        yield pair
    finally:
        for operator in operators:
            operator.stop()
        control_plane.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def _start_leader_then_standby(pair: Pair, leases: EventLog) -> None:
    pair.first.start()
    leases.wait_for(lambda e: e.name == LEASE and holder(e).startswith("operator-a_"))
    pair.second.start()
    # The standby read the Lease (it now counts the lease from what it saw).
    _wait_until(lambda: ("get", "leases", LEASE) in pair.requests(pair.second), "the standby reads")


def test_one_replica_acts_and_the_standby_takes_over_a_killed_leader(
    pair: Pair, record_property: Callable[[str, Any], None]
) -> None:
    api = pair.plane.api_client()
    with (
        EventLog(api, pair.namespace, "leases") as leases,
        EventLog(api, pair.namespace, "pods") as pods,
        EventLog(api, pair.namespace, "agentruns") as runs,
    ):
        _start_leader_then_standby(pair, leases)
        pair.create_run("before")
        pods.wait_for(lambda e: e.type == "ADDED" and run_label(e) == "before")
        runs.wait_for(
            lambda e: e.name == "before" and bool((e.object.get("status") or {}).get("pod"))
        )

        # Only the leader acted: the standby made no request but for the Lease.
        standby_requests = pair.requests(pair.second)
        assert standby_requests, "the standby never looked at the Lease"
        assert {resource for _, resource, _ in standby_requests} == {"leases"}, pair.diagnostics()
        _wait_until(
            lambda: ("patch", "agentruns/status", "before") in pair.requests(pair.first),
            "the leader's status patch in the audit log",
        )

        killed_at = time.monotonic()
        pair.first.kill()
        pair.create_run("after")
        taken = leases.wait_for(lambda e: holder(e).startswith("operator-b_"), after=killed_at)
        pod = pods.wait_for(lambda e: e.type == "ADDED" and run_label(e) == "after")
        runs.wait_for(
            lambda e: e.name == "after" and bool((e.object.get("status") or {}).get("pod"))
        )
        record_property("lease_taken_after_kill_seconds", round(taken.at - killed_at, 3))
        record_property("next_pod_after_kill_seconds", round(pod.at - killed_at, 3))

        _wait_until(
            lambda: ("patch", "agentruns/status", "after") in pair.requests(pair.second),
            "the new leader's status patch in the audit log",
        )
        # The new leader resumed "before" too (kopf resumes every run; it is judged from
        # the watches' views, without a request of its own) and left its pod be.
        added = sorted(e.name for e in pods.events if e.type == "ADDED")
        assert added == ["after-1", "before-1"], pair.diagnostics()
        assert ("patch", "agentruns/status", "after") not in pair.requests(pair.first)
        assert pair.first.process is not None and pair.first.process.returncode == -9


def test_a_stopped_leader_hands_the_lease_back(pair: Pair) -> None:
    api = pair.plane.api_client()
    with EventLog(api, pair.namespace, "leases") as leases:
        _start_leader_then_standby(pair, leases)
        stopped_at = time.monotonic()
        assert pair.first.stop() == 0, pair.diagnostics()
        freed = leases.wait_for(lambda e: e.name == LEASE and not holder(e), after=stopped_at)
        taken = leases.wait_for(lambda e: holder(e).startswith("operator-b_"), after=stopped_at)
        assert freed.at <= taken.at
        assert (freed.object["spec"].get("leaseDurationSeconds")) == 1


def test_a_standby_stopped_while_it_waits_exits_cleanly_without_the_lease(pair: Pair) -> None:
    # In a pod the operator is PID 1, for which an unhandled SIGTERM does nothing: a
    # deleted standby must stop on it, not stand by until its grace period's SIGKILL.
    api = pair.plane.api_client()
    with EventLog(api, pair.namespace, "leases") as leases:
        _start_leader_then_standby(pair, leases)
        assert pair.second.stop() == 0, pair.diagnostics()
        assert "stopped while standing by" in pair.second.log_text()
        assert not any(holder(e).startswith("operator-b_") for e in leases.events)
    assert pair.first.process is not None and pair.first.process.poll() is None


class _HoldingProxy:
    """A TCP proxy to the API server that, once :meth:`cut` is called, holds every byte
    (and every new connection) forever: the leader's requests neither fail nor finish,
    as across a network partition."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self._upstream = upstream
        self._cut = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        self._cut.set()

    def close(self) -> None:
        for sock in self._sockets:
            sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self._sockets.append(client)
            if self._cut.is_set():
                continue  # accepted, never answered
            server = socket.create_connection(self._upstream)
            self._sockets.append(server)
            for source, target in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, target), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                if self._cut.is_set():
                    return  # held: nothing goes on, and the socket stays open
                target.sendall(data)
        except OSError:
            return


def test_a_leader_cut_off_from_the_api_server_stops_before_its_lease_can_be_taken(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    from kubernetes import config

    namespace = f"ha-{uuid.uuid4().hex[:6]}"
    control_plane.kubectl("create", "namespace", namespace)
    host, _, port = control_plane.server.removeprefix("https://").rpartition(":")
    proxy = _HoldingProxy((host, int(port)))
    kubeconfig = yaml.safe_load(control_plane.kubeconfig.read_text())
    kubeconfig["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
    proxied = tmp_path / "proxied.kubeconfig"
    proxied.write_text(json.dumps(kubeconfig))

    lost: list[tuple[float, str]] = []
    lost_event = threading.Event()

    def stop_acting(reason: str) -> None:
        lost.append((time.monotonic(), reason))
        lost_event.set()

    def settings(identity: str) -> LeaseSettings:
        return LeaseSettings(namespace, LEASE, identity, 3, 2.0, 0.3)

    proxied_client = config.new_client_from_config(str(proxied))  # type: ignore[no-untyped-call]
    leader = LeaderElector(settings("cut-off"), proxied_client, stop_acting)
    standby = LeaderElector(settings("standby"), control_plane.api_client(), lambda reason: None)
    try:
        assert leader.acquire()
        stop_waiting = threading.Event()
        took: list[bool] = []
        waiting = threading.Thread(target=lambda: took.append(standby.acquire(stop_waiting)))
        waiting.start()
        _wait_until(lambda: standby.holder == "cut-off", "the standby sees the leader")
        proxy.cut()
        waiting.join(WAIT_LIMIT)
        assert took == [True]
        assert lost_event.is_set(), "the cut-off leader never stopped acting"
        stopped_at, reason = lost[0]
        assert stopped_at < standby.acquired_at, "the standby took the Lease from a live leader"
        assert "not renewed within 2 s" in reason
        assert not leader.leading
    finally:
        standby.release()
        proxy.close()
        control_plane.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"ALPINEAGENTS_LEADER_LEASE": "just-a-name"}, "NAMESPACE/NAME"),
        ({"ALPINEAGENTS_LEASE_SECONDS": "2.5"}, "whole seconds"),
        ({"ALPINEAGENTS_LEASE_RETRY_SECONDS": "soon"}, "ALPINEAGENTS_LEASE_RETRY_SECONDS"),
        ({"ALPINEAGENTS_LEASE_RENEW_DEADLINE_SECONDS": "20"}, "must stop before"),
    ],
)
def test_bad_election_settings_are_refused_naming_the_variable(
    env: dict[str, str], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        LeaseSettings.from_env({"ALPINEAGENTS_LEADER_LEASE": "ns/lease", **env})


def test_no_lease_named_means_no_election() -> None:
    assert LeaseSettings.from_env({}) is None
    settings = LeaseSettings.from_env({"ALPINEAGENTS_LEADER_LEASE": "ns/l", "POD_ID": "pod-1"})
    assert settings is not None and settings.identity.startswith("pod-1_")
