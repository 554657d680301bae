"""One acting operator among replicas: leader election through a ``coordination.k8s.io``
Lease, with the semantics of client-go's ``leaderelection`` package.

Every replica runs :meth:`LeaderElector.acquire` before it starts kopf. A standby reads
the Lease every ``retry_seconds`` and takes it (an update carrying the resourceVersion it
read, so of two standbys one wins) when it is free, or when its record has not changed for
the holder's ``leaseDurationSeconds`` *as measured on the standby's own clock* since it saw
the record change: clocks of different nodes need not agree, only run at the same rate.

The leader renews the Lease every ``retry_seconds``. If no renewal has succeeded within
``renew_deadline_seconds`` of being sent (the API server unreachable, or too slow), the
leader stops acting: ``on_lost`` is called, by default ending the process at once (exit
code 75) so that its pod restarts as a standby. Since the renew deadline is shorter than
the lease, and a standby counts the lease from a moment after the renewal was sent, the
old leader has stopped before any standby may take over. If the Lease turns out to be held
by another, the leader stops at once. On a clean stop (SIGTERM: a rolling upgrade, a
drain) :meth:`LeaderElector.release` hands the Lease back, so a standby takes over within
one ``retry_seconds`` instead of a whole lease.

Ending the process rather than pausing kopf is deliberate: a paused kopf still finishes
the reconcile steps it started, on threads that may be waiting on the same unreachable
API server; a process that has exited can write nothing more.

Settings come from the environment (the Helm chart sets them):

=============================================  ==========================================
``ALPINEAGENTS_LEADER_LEASE``                  ``NAMESPACE/NAME`` of the Lease; empty:
                                               no election (one replica only)
``ALPINEAGENTS_LEASE_SECONDS``                 the lease (whole seconds, default 15)
``ALPINEAGENTS_LEASE_RENEW_DEADLINE_SECONDS``  a leader unable to renew for this long
                                               stops acting (default 10)
``ALPINEAGENTS_LEASE_RETRY_SECONDS``           how often the leader renews and a standby
                                               looks (default 2)
``POD_ID``                                     this replica's name in the Lease (the
                                               chart passes the pod's name)
``ALPINEAGENTS_LEASE_HOLDER_POD``              ``true``: ``POD_ID`` is this replica's pod,
                                               in the Lease's namespace; a standby then
                                               takes the Lease as soon as its holder's pod
                                               shows the holder dead, without waiting out
                                               the lease (:mod:`.lease_holder`; the chart
                                               sets it)
=============================================  ==========================================
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from alpineagents_operator.edge.lease_holder import HolderLiveness, api_pod_reader
from alpineagents_operator.kube.cluster import failure_text

_log = logging.getLogger(__name__)

LOST_EXIT_CODE = 75
"""Exit code of a leader that lost its Lease (EX_TEMPFAIL: its restart is a standby)."""


@dataclass(frozen=True)
class LeaseSettings:
    """Which Lease the replicas share, who this one is, and the election's timing."""

    namespace: str
    name: str
    identity: str
    # client-go's defaults (kube-controller-manager's and kube-scheduler's). A shorter
    # lease fails over sooner after a crash, but a leader starved of CPU misses its renew
    # deadline: at 3 / 2 / 0.5 s, on a 2-CPU node busy with 60 run pods, both replicas
    # took the lead and lost it within seconds, over and over, and no run was resumed
    # (benchmarks/results/warm_pool_burst.md).
    lease_seconds: int = 15
    """How long a standby waits, after it last saw the Lease renewed, before taking it."""
    renew_deadline_seconds: float = 10.0
    """A leader that has not renewed within this stops acting (shorter than the lease)."""
    retry_seconds: float = 2.0
    """Between two renewals by the leader, and two reads by a standby."""
    holder_pod: bool = False
    """Replicas are pods named by ``POD_ID`` in the Lease's namespace: a standby reads the
    holder's pod and takes the Lease once the pod shows the holder dead."""

    def __post_init__(self) -> None:
        if not 0 < self.retry_seconds < self.renew_deadline_seconds < self.lease_seconds:
            raise ValueError(
                "leader election needs 0 < ALPINEAGENTS_LEASE_RETRY_SECONDS < "
                "ALPINEAGENTS_LEASE_RENEW_DEADLINE_SECONDS < ALPINEAGENTS_LEASE_SECONDS "
                "(a leader must stop before its lease can be taken), got "
                f"{self.retry_seconds} < {self.renew_deadline_seconds} < {self.lease_seconds}"
            )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> LeaseSettings | None:
        """The settings in ``env`` (default ``os.environ``); None without a Lease named."""
        env = os.environ if env is None else env
        lease = env.get("ALPINEAGENTS_LEADER_LEASE", "").strip()
        if not lease:
            return None
        namespace, slash, name = lease.partition("/")
        if not (slash and namespace and name):
            raise ValueError(
                f"ALPINEAGENTS_LEADER_LEASE must be NAMESPACE/NAME of a Lease, got {lease!r}"
            )

        def number(variable: str, default: float) -> float:
            text = env.get(variable, "").strip()
            try:
                return float(text) if text else default
            except ValueError:
                raise ValueError(f"{variable} must be a number of seconds, got {text!r}") from None

        lease_seconds = number("ALPINEAGENTS_LEASE_SECONDS", cls.lease_seconds)
        if lease_seconds != int(lease_seconds):
            raise ValueError(
                f"ALPINEAGENTS_LEASE_SECONDS must be whole seconds (a Lease counts in "
                f"seconds), got {lease_seconds}"
            )
        replica = env.get("POD_ID", "").strip() or socket.gethostname()
        return cls(
            namespace=namespace,
            name=name,
            # A restarted pod keeps its name: the suffix tells its new process from the
            # old one, whose lease it must not take for its own.
            identity=f"{replica}_{uuid.uuid4().hex[:8]}",
            lease_seconds=int(lease_seconds),
            renew_deadline_seconds=number(
                "ALPINEAGENTS_LEASE_RENEW_DEADLINE_SECONDS", cls.renew_deadline_seconds
            ),
            retry_seconds=number("ALPINEAGENTS_LEASE_RETRY_SECONDS", cls.retry_seconds),
            holder_pod=_flag(env, "ALPINEAGENTS_LEASE_HOLDER_POD"),
        )


def _flag(env: Mapping[str, str], variable: str) -> bool:
    text = env.get(variable, "").strip().lower()
    if text not in ("", "true", "false"):
        raise ValueError(f"{variable} must be true or false, got {text!r}")
    return text == "true"


class LeaseMissing(Exception):
    """The Lease does not exist and this replica may not create it."""


def _now() -> str:
    """A MicroTime, as the API server writes them."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _exit_process(reason: str) -> None:
    _log.error("stopping: %s; this replica restarts as a standby", reason)
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(LOST_EXIT_CODE)


class LeaderElector:
    """Waits for, holds and hands back one Lease (see the module's docstring).

    ``api_client`` is a ``kubernetes.client.ApiClient`` used by the election alone, so
    that renewals never queue behind reconcile steps for a connection. ``on_lost`` is
    called (from the election's own thread) when leadership ends other than by
    :meth:`release`; the default ends the process.
    """

    def __init__(
        self,
        settings: LeaseSettings,
        api_client: Any,
        on_lost: Callable[[str], None] = _exit_process,
        holder_liveness: HolderLiveness | None = None,
    ) -> None:
        from kubernetes import client

        self.settings = settings
        if holder_liveness is None and settings.holder_pod:
            reader = api_pod_reader(api_client, settings.namespace, settings.renew_deadline_seconds)
            holder_liveness = HolderLiveness(settings.identity, reader)
        self._liveness = holder_liveness
        self._api: Any = client.CoordinationV1Api(api_client)  # typed for models, not dicts
        self._on_lost = on_lost
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._leading = False
        self._stopped = False
        self._deadline = 0.0  # monotonic: the leader stops acting at this moment
        self._lease: dict[str, Any] = {}  # the last version read or written
        self._threads: list[threading.Thread] = []
        self.holder = ""
        """Who held the Lease when this replica last looked."""
        self.acquired_at = 0.0
        """``time.monotonic()`` when this replica became the leader (0 before)."""

    @property
    def leading(self) -> bool:
        """Whether this replica holds the Lease and may act."""
        return self._leading

    # ------------------------------------------------------------------ standby

    def acquire(self, stop: threading.Event | None = None) -> bool:
        """Block until this replica holds the Lease (True), or ``stop`` is set (False).

        Then renew it in the background until :meth:`release`, or until leadership is
        lost (``on_lost``)."""
        settings = self.settings
        observed: tuple[Any, ...] = ()
        observed_at = 0.0
        announced = ""
        while not (stop and stop.is_set()):
            sent = time.monotonic()
            try:
                lease = self._read_or_create()
            except LeaseMissing:
                raise
            except Exception as error:  # the API server may come back
                _log.warning("cannot read Lease %s: %s", self._where(), _short(error))
                lease = None
            if lease is not None:
                spec = lease.get("spec") or {}
                record = (
                    spec.get("holderIdentity"),
                    spec.get("renewTime"),
                    lease["metadata"].get("resourceVersion"),
                )
                if record != observed:
                    observed, observed_at = record, time.monotonic()
                holder = spec.get("holderIdentity") or ""
                if self._liveness is not None and self.holder and holder != self.holder:
                    self._liveness.forget(self.holder)
                self.holder = holder
                if holder and holder != announced:
                    _log.info("standing by: Lease %s is held by %s", self._where(), holder)
                    announced = holder
                duration = float(spec.get("leaseDurationSeconds") or settings.lease_seconds)
                free = not holder or time.monotonic() > observed_at + duration
                dead = "" if free or self._liveness is None else self._liveness.dead(holder)
                if dead:
                    _log.info("the Lease's holder %s is dead: %s; taking it now", holder, dead)
                if (free or dead) and self._take(lease, sent, previous=holder):
                    return True
            if stop is not None:
                stop.wait(settings.retry_seconds)
            else:
                time.sleep(settings.retry_seconds)  # the Lease has no change event to await
        return False

    def _read_or_create(self) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return self._read()
        except ApiException as error:
            if error.status != 404:
                raise
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.settings.name, "namespace": self.settings.namespace},
            "spec": {},
        }
        try:
            self._api.create_namespaced_lease(self.settings.namespace, body, **self._options())
        except ApiException as error:
            if error.status == 403:
                raise LeaseMissing(
                    f"Lease {self._where()} does not exist and this operator may not create "
                    "it: the Helm chart creates it; elsewhere create it with `kubectl create "
                    "-f` of a Lease of that name, or grant `create` on leases"
                ) from error
            if error.status != 409:  # 409: another replica created it first
                raise
        return None  # read it on the next round

    def _take(self, lease: dict[str, Any], sent: float, previous: str) -> bool:
        from kubernetes.client.exceptions import ApiException

        spec = dict(lease.get("spec") or {})
        now = _now()
        if previous != self.settings.identity:
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        spec.update(
            holderIdentity=self.settings.identity,
            leaseDurationSeconds=self.settings.lease_seconds,
            acquireTime=now,
            renewTime=now,
        )
        try:
            written = self._replace({**lease, "spec": spec})
        except ApiException as error:
            if error.status == 409:  # another standby took it between our read and write
                return False
            raise
        with self._lock:
            self._lease = written
            self._leading = True
            self._deadline = sent + self.settings.renew_deadline_seconds
            self.holder = self.settings.identity
            self.acquired_at = time.monotonic()
        _log.info(
            "leading: took Lease %s%s", self._where(), f" from {previous}" if previous else ""
        )
        for target, name in ((self._renew_forever, "renew"), (self._watch_deadline, "deadline")):
            thread = threading.Thread(target=target, name=f"lease-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return True

    # ------------------------------------------------------------------ leader

    def _renew_forever(self) -> None:
        from kubernetes.client.exceptions import ApiException

        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._stopped, self.settings.retry_seconds)
                if self._stopped or not self._leading:
                    return
                lease = self._lease
                remaining = self._deadline - time.monotonic()
            sent = time.monotonic()
            spec = {**lease["spec"], "renewTime": _now()}
            try:
                written = self._replace({**lease, "spec": spec}, timeout=max(0.1, remaining))
            except ApiException as error:
                if error.status == 409:
                    self._after_conflict()
                    continue
                _log.warning("cannot renew Lease %s: %s", self._where(), _short(error))
                continue
            except Exception as error:  # unreachable: the deadline decides
                _log.warning("cannot renew Lease %s: %s", self._where(), _short(error))
                continue
            took = time.monotonic() - sent
            if took > self.settings.renew_deadline_seconds / 2:
                # Half way to giving up: a slow API server (or an operator starved of CPU)
                # is worth knowing before it costs the lead.
                _log.warning(
                    "renewing Lease %s took %.1f s (a leader stops acting after %g s)",
                    self._where(),
                    took,
                    self.settings.renew_deadline_seconds,
                )
            with self._changed:
                if self._leading:
                    self._lease = written
                    self._deadline = sent + self.settings.renew_deadline_seconds
                    self._changed.notify_all()

    def _after_conflict(self) -> None:
        """The Lease changed under us: carry on if it is still ours, else stop acting."""
        try:
            lease = self._read()
        except Exception as error:  # retried at the next renewal
            _log.warning("cannot read Lease %s: %s", self._where(), _short(error))
            return
        holder = (lease.get("spec") or {}).get("holderIdentity") or ""
        if holder == self.settings.identity:
            with self._lock:
                self._lease = lease
            return
        self._lose(f"Lease {self._where()} is now held by {holder or 'nobody'}")

    def _watch_deadline(self) -> None:
        with self._changed:
            while self._leading and not self._stopped:
                remaining = self._deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._changed.wait(remaining)
            if not self._leading or self._stopped:
                return
        self._lose(
            f"Lease {self._where()} not renewed within {self.settings.renew_deadline_seconds:g} s"
        )

    def _lose(self, reason: str) -> None:
        with self._changed:
            if not self._leading:
                return
            self._leading = False
            self._stopped = True
            self._changed.notify_all()
        self._on_lost(reason)

    def release(self) -> None:
        """Stop renewing and hand the Lease back (a standby takes it at its next look).

        Call it once this replica has stopped acting."""
        with self._changed:
            leading = self._leading
            self._leading = False
            self._stopped = True
            self._changed.notify_all()
            lease = self._lease
        for thread in self._threads:
            thread.join()
        if not leading:
            return
        # As client-go's ReleaseOnCancel: nobody holds it, and a reader that still goes
        # by the duration sees it expire within a second.
        spec = {
            **lease["spec"],
            "holderIdentity": "",
            "leaseDurationSeconds": 1,
            "renewTime": _now(),
        }
        try:
            self._replace({**lease, "spec": spec})
        except Exception as error:  # a standby then waits for the lease
            _log.warning("cannot hand back Lease %s: %s", self._where(), _short(error))
            return
        _log.info("handed back Lease %s", self._where())

    # ------------------------------------------------------------------ calls

    def _options(self, timeout: float | None = None) -> dict[str, Any]:
        budget = timeout if timeout is not None else self.settings.renew_deadline_seconds
        return {"_request_timeout": (budget, budget), "_preload_content": False}

    def _read(self) -> dict[str, Any]:
        response = self._api.read_namespaced_lease(
            self.settings.name, self.settings.namespace, **self._options()
        )
        return dict(json.loads(_finish(response)))

    def _replace(self, lease: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        response = self._api.replace_namespaced_lease(
            self.settings.name, self.settings.namespace, lease, **self._options(timeout)
        )
        return dict(json.loads(_finish(response)))

    def _where(self) -> str:
        return f"{self.settings.namespace}/{self.settings.name}"


def _short(error: BaseException) -> str:
    return failure_text(error)


def _finish(response: Any) -> bytes:
    """A raw response's body, its connection given back whole (see cluster.py)."""
    try:
        return bytes(response.data)
    finally:
        response.release_conn()


class StandbyHealth:
    """The liveness endpoint while this replica waits as a standby: kopf's own serves it
    only once this replica leads. A standby is alive and ready (a PodDisruptionBudget
    counts it, so a drain may evict the leader while the standby can take over)."""

    def __init__(self, port: int, elector: LeaderElector) -> None:
        class _Answer(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # the name http.server calls
                body = json.dumps({"leader": False, "holder": elector.holder}).encode()
                self.send_response(200 if self.path.startswith("/healthz") else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                del format, args  # a probe every few seconds is not worth a log line

        self._server = ThreadingHTTPServer(("0.0.0.0", port), _Answer)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="standby-health", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Stop answering and free the port for kopf's endpoint."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
