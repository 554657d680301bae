"""The operator as its own process against the bench's control plane, as in its image
(``python -m alpineagents_operator``), and what tests and benchmarks need around it:

- :func:`operator_kubeconfig`: a ServiceAccount of its own with a token, so that the API
  server's audit log tells one operator process's requests from another's and from the
  test's (the admin);
- :class:`OperatorProcess`: start, SIGKILL, SIGTERM, its log;
- :class:`EventLog`: one watch of a namespace's pods, AgentRuns or Leases, every event
  kept with its arrival time, so a test waits for an event instead of sleeping.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.paths import REPO

JSON = dict[str, Any]
WAIT_LIMIT = 300.0
"""A safety net for waits on a busy machine: a test fails rather than hangs. Never a
measure of anything."""


def operator_kubeconfig(plane: Any, namespace: str, name: str, directory: Path) -> Path:
    """A kubeconfig for ServiceAccount ``namespace/name`` (made here, bound to
    cluster-admin: these tests are about who acts, not what it may do)."""
    plane.kubectl("create", "serviceaccount", name, "-n", namespace)
    plane.kubectl(
        "create", "clusterrolebinding", f"{namespace}-{name}", "--clusterrole=cluster-admin",
        f"--serviceaccount={namespace}:{name}",
    )  # fmt: skip
    token = plane.kubectl("create", "token", name, "-n", namespace, "--duration=2h").stdout
    path = directory / f"{name}.kubeconfig"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "bench",
                "cluster": {"server": plane.server, "certificate-authority": str(plane.ca_file)},
            }
        ],
        "users": [{"name": name, "user": {"token": token.strip()}}],
        "contexts": [{"name": name, "context": {"cluster": "bench", "user": name}}],
        "current-context": name,
    }
    path.write_text(json.dumps(config))
    path.chmod(0o600)
    return path


@dataclass(frozen=True)
class LeaseTiming:
    """The leader election's settings given to an operator process."""

    lease_seconds: int = 3
    renew_deadline_seconds: float = 2.0
    retry_seconds: float = 0.5


class OperatorProcess:
    """``python -m alpineagents_operator`` watching one namespace, its store a folder."""

    def __init__(
        self,
        name: str,
        kubeconfig: Path,
        namespace: str,
        store: Path,
        log: Path,
        lease: str = "",
        timing: LeaseTiming = LeaseTiming(),
        resync_seconds: float = 30.0,
    ) -> None:
        self.name = name
        self.log = log
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO / "operator"), str(REPO)]),
            "KUBECONFIG": str(kubeconfig),
            "ALPINEAGENTS_NAMESPACES": namespace,
            "ALPINEAGENTS_STORE": store.as_uri(),
            "ALPINEAGENTS_RUN_CREDENTIALS": "shared",
            "ALPINEAGENTS_RESYNC_SECONDS": str(resync_seconds),
            "ALPINEAGENTS_METRICS_PORT": "0",
            "ALPINEAGENTS_HEALTH_PORT": "0",
            "ALPINEAGENTS_LOG_LEVEL": "INFO",
            "ALPINEAGENTS_LEADER_LEASE": lease,
            "ALPINEAGENTS_LEASE_SECONDS": str(timing.lease_seconds),
            "ALPINEAGENTS_LEASE_RENEW_DEADLINE_SECONDS": str(timing.renew_deadline_seconds),
            "ALPINEAGENTS_LEASE_RETRY_SECONDS": str(timing.retry_seconds),
            "POD_ID": name,
        }
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "alpineagents_operator"],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def kill(self) -> None:
        """SIGKILL, as a node lost or an OOM kill would: no goodbye, no Lease handed back."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM and wait (SIGKILL after ``timeout``); its exit code, None if never run."""
        process = self.process
        if process is None:
            return None
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        return process.returncode

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@dataclass(frozen=True)
class Event:
    """One watch event: its type, the object, and ``time.monotonic()`` on arrival."""

    type: str
    object: JSON
    at: float

    @property
    def name(self) -> str:
        return str(self.object["metadata"]["name"])


class EventLog:
    """Every event of one watch (``pods``, ``agentruns``, ``agentschedules``, ``leases``,
    core ``events`` or Kueue's ``workloads`` in a namespace)."""

    def __init__(self, api_client: Any, namespace: str, kind: str) -> None:
        from kubernetes import client

        core, custom = client.CoreV1Api(api_client), client.CustomObjectsApi(api_client)
        coordination = client.CoordinationV1Api(api_client)
        lists: dict[str, Callable[..., Any]] = {
            "pods": lambda **o: core.list_namespaced_pod(namespace, **o),
            "agentruns": lambda **o: custom.list_namespaced_custom_object(
                "alpineagents.dev", "v1", namespace, "agentruns", **o
            ),
            "leases": lambda **o: coordination.list_namespaced_lease(namespace, **o),
            "agentschedules": lambda **o: custom.list_namespaced_custom_object(
                "alpineagents.dev", "v1", namespace, "agentschedules", **o
            ),
            "events": lambda **o: core.list_namespaced_event(namespace, **o),
            "workloads": lambda **o: custom.list_namespaced_custom_object(
                "kueue.x-k8s.io", "v1beta2", namespace, "workloads", **o
            ),
        }
        self._list = lists[kind]
        self.kind = kind
        self.events: list[Event] = []
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"watch-{kind}", daemon=True)

    def __enter__(self) -> EventLog:
        self._thread.start()
        if not self._ready.wait(60):
            raise RuntimeError(f"the {self.kind} watch did not start")
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()

    def _run(self) -> None:
        version = ""
        while not self._stop.is_set():
            try:
                response = self._list(
                    watch=True,
                    resource_version=version or None,
                    allow_watch_bookmarks=True,
                    timeout_seconds=60,
                    _request_timeout=(10, 90),
                    _preload_content=False,
                )
                self._ready.set()
                try:
                    for line in response:
                        if not line.strip():
                            continue
                        at = time.monotonic()
                        event = json.loads(line)
                        version = event["object"]["metadata"].get("resourceVersion", version)
                        if event["type"] == "BOOKMARK":
                            continue
                        with self._changed:
                            self.events.append(Event(event["type"], event["object"], at))
                            self._changed.notify_all()
                finally:
                    response.close()
            except Exception:  # the stream broke: watch on from where it was
                if self._stop.is_set():
                    return
                self._stop.wait(0.1)

    def wait_for(self, matches: Callable[[Event], bool], after: float = 0.0) -> Event:
        """The first event arriving at or after ``after`` (monotonic) that ``matches``,
        waiting for it if it has not come yet."""
        deadline = time.monotonic() + WAIT_LIMIT
        seen = 0
        with self._changed:
            while True:
                for event in self.events[seen:]:
                    if event.at >= after and matches(event):
                        return event
                seen = len(self.events)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"no such {self.kind} event within {WAIT_LIMIT} s")
                self._changed.wait(remaining)

    def since(self, seen: int, timeout: float) -> list[Event]:
        """The events after the first ``seen``, waiting up to ``timeout`` seconds for one
        if none has come yet (empty: none came). For a reader of thousands of events,
        which :meth:`wait_for` would scan from the start each time."""
        with self._changed:
            if len(self.events) <= seen:
                self._changed.wait(timeout)
            return self.events[seen:]


def holder(event: Event) -> str:
    """A Lease event's holder identity ("" when free)."""
    return str((event.object.get("spec") or {}).get("holderIdentity") or "")


def run_label(event: Event) -> str:
    """A pod event's AgentRun (its ``alpineagents.dev/run`` label)."""
    return str((event.object["metadata"].get("labels") or {}).get("alpineagents.dev/run", ""))


def agentrun(namespace: str, name: str, **spec: Any) -> str:
    """An AgentRun manifest (YAML) whose pod, on a plane without nodes, stays Pending;
    ``spec`` adds fields."""
    return json.dumps(
        {
            "apiVersion": "alpineagents.dev/v1",
            "kind": "AgentRun",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "model": "claude-sonnet-5",
                "prompt": f"job {name}",
                "restartPolicy": {"initialBackoffSeconds": 0},
                **spec,
            },
        }
    )


def pod_added(run: str) -> Callable[[Event], bool]:
    """Matches the ADDED event of a pod of AgentRun ``run``."""
    return lambda event: event.type == "ADDED" and run_label(event) == run


def held_by(replica: str) -> Callable[[Event], bool]:
    """Matches a Lease event naming a process of ``replica`` (its POD_ID) as the holder."""
    return lambda event: holder(event).startswith(f"{replica}_")


@contextlib.contextmanager
def operator_in_namespace(
    plane: Any, directory: Path, prefix: str, **options: Any
) -> Iterator[tuple[str, Path, OperatorProcess]]:
    """A fresh namespace with the CRDs applied and an operator (not started) watching it
    as its own ServiceAccount, its store the folder it yields; both go afterwards."""
    plane.apply_crds()
    namespace = f"{prefix}-{uuid.uuid4().hex[:6]}"
    plane.kubectl("create", "namespace", namespace)
    folder = directory / "runs"
    folder.mkdir()
    process = OperatorProcess(
        "operator",
        operator_kubeconfig(plane, namespace, "operator", directory),
        namespace,
        folder,
        directory / "operator.log",
        **options,
    )
    try:
        yield namespace, folder, process
    finally:
        process.stop()
        plane.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
