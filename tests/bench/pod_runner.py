"""A stand-in kubelet for tests: pods from a real API server run as local processes.

:class:`PodRunner` registers a Node, watches Pods, binds unscheduled ones to its node
(when ``schedule=True``), runs every container's ``command`` + ``args`` as a local process
and reports what happens through the ``pods/status`` subresource the way the kubelet
does, so code that watches pods (the operator) sees realistic phases, container states,
exit codes, reasons, termination messages, restarts and deletions. Tests can also cause
the disruptions a real cluster has: hard eviction, OOM kill, and loss of the node.

Use
---
The ``pod_runner`` fixture (function scope, on the session's ``control_plane``) yields a
started runner for node ``bench-node`` that also schedules; at teardown its processes
are SIGKILLed and the pods bound to its node and the Node itself are deleted. For more
nodes, ``PodRunner(api_client, node_name="other", schedule=False).start()`` and
``.stop()`` it yourself. :func:`wait_for_pod` watches one pod until a condition on its
JSON (or its absence) holds. Nothing is mocked: every effect goes through the API server.

What it does
------------
- Node: creates ``Node/<node_name>`` with a Ready condition, capacity from this machine,
  address 127.0.0.1. No heartbeat and no Lease (nothing here would mark it NotReady).
- Scheduling: a runner built with ``schedule=True`` binds every pod with an empty
  ``spec.nodeName`` to its node through ``pods/binding``. nodeSelector, affinity,
  tolerations, resources and schedulerName are ignored. Several runners may share a
  control plane (each runs only pods bound to its own node); let exactly one of them
  schedule at a time (if two do, the first binding wins and the other gets a conflict).
- Containers: init containers run first, one at a time, in order; then all regular
  containers at once. ``command`` (or, when it is empty, the entry point given for the
  image in ``entrypoints=``) plus ``args``, with ``$(VAR)`` expanded like the kubelet, is
  run in this machine's Python environment: a leading ``python``/``python3`` becomes
  ``sys.executable``, anything else is looked up on PATH. Each attempt gets a fresh
  temporary working directory (``HOME`` is that directory, ``TMPDIR`` a folder in it),
  stdout+stderr go to one log file (:meth:`PodRunner.logs`), and the process starts in a
  new session so signals go to its whole process group.
- Environment: a small base (``PATH``, ``PYTHONPATH`` if set in the test's environment,
  ``HOSTNAME`` = pod name, ``HOME``, ``TMPDIR``), then ``envFrom`` (configMapRef,
  secretRef, prefix), then ``env`` (value with ``$(VAR)`` expansion, secretKeyRef,
  configMapKeyRef, fieldRef for metadata.name/namespace/uid/labels/annotations,
  spec.nodeName, spec.serviceAccountName, status.podIP(s), status.hostIP(s)). A missing
  non-optional Secret/ConfigMap/key leaves the container Waiting with reason
  ``CreateContainerConfigError`` and is retried every second, as the kubelet does.
- Termination messages: ``terminationMessagePath`` cannot be mounted, so each attempt
  gets a local file whose path is in the env var ``TERMINATION_MESSAGE_PATH`` (this
  overrides any value from the pod spec). Up to 4096 bytes of it become
  ``state.terminated.message``; with ``terminationMessagePolicy: FallbackToLogsOnError``
  an empty file on a failed exit is replaced by the log's last 80 lines (2048 bytes).
- Status: phase (the kubelet's own rules for Pending/Running/Succeeded/Failed under each
  restartPolicy), podIP/hostIP 127.0.0.1, startTime, conditions PodReadyToStartContainers,
  Initialized, Ready, ContainersReady, PodScheduled (and DisruptionTarget on eviction),
  container statuses with waiting/running/terminated state, lastState, restartCount,
  ready, started, image, imageID, containerID ``local://<pid>``. Exit by signal N is
  exit code 128+N; reasons are Completed, Error, OOMKilled, StartError (command not
  found: exit code 128). When a pod is torn down (deleted, evicted) its final status is
  settled as the kubelet's TerminatePod does: a container waiting to restart reports its
  last run as terminated, one that never ran is terminated ContainerStatusUnknown (137),
  and the phase ends Succeeded (all exit 0) or Failed, never Pending/Running.
- Restarts: ``OnFailure``/``Always`` restart exited containers after a back-off
  (``restart_backoff``, much shorter than the kubelet's 10 s..5 min), shown as Waiting
  ``CrashLoopBackOff`` with the last termination in ``lastState``.
- Deletion: a pod that gets a ``deletionTimestamp`` has its processes sent SIGTERM, then
  SIGKILL after the kubelet's effective grace period (``deletionGracePeriodSeconds``, or
  ``spec.terminationGracePeriodSeconds`` when that is 0, and never under 1 s); the final
  status is written and the pod is removed with grace 0 and a uid precondition, as the
  kubelet does when it has finished. A pod force-deleted from the API gets the same
  SIGTERM/SIGKILL treatment, without status writes.
- Disruptions for tests: :meth:`PodRunner.evict`, :meth:`PodRunner.oom_kill`,
  :meth:`PodRunner.lose_node` and :meth:`PodRunner.declare_node_gone`, each returning once
  its effect is visible in the API.

What it does NOT emulate
------------------------
- Images: nothing is pulled or unpacked. ``image`` is only echoed into the status; the
  command runs with this machine's files, Python and installed packages. A container with
  no command and no ``entrypoints=`` entry for its image stays Waiting
  (``CreateContainerError``).
- Volumes and mounts: only ``secret`` volumes, and those only in part. Processes see the
  real filesystem, so a mount cannot appear at its ``mountPath``: each secret volume a
  container mounts is written (with the kubelet's atomic-writer layout: ``..data`` one
  symlink swapped at once) into the attempt's directory, and every env value that starts
  with the ``mountPath`` is pointed there instead. Like the kubelet, the runner updates
  the files when the Secret changes (polled every second), waits in ContainerCreating
  while a non-optional Secret is missing, and applies ``defaultMode``; ``items`` and
  ``subPath`` are not supported. Every other volume, ``workingDir``, projected
  service-account tokens and ``terminationMessagePath`` are ignored (the working
  directory is a fresh temporary directory instead).
- Isolation: no container runtime, cgroups or namespaces: no resource limit is enforced
  (OOM happens only when a test calls :meth:`PodRunner.oom_kill`), there is no network,
  PID, mount or UTS namespace, every pod's IP is 127.0.0.1, ports may collide, and
  ``hostNetwork``/``hostPID``/``dnsPolicy``/``hostAliases`` mean nothing.
- securityContext: ignored. ``runAsUser``/``runAsNonRoot``/``fsGroup``/capabilities/
  seccomp are not applied; the process runs as the test's user. ``readOnlyRootFilesystem``
  is not enforced.
- Probes and hooks: liveness, readiness and startup probes are ignored (a running
  container counts as started and ready at once); ``postStart``/``preStop`` hooks are not
  run; readinessGates are not checked.
- Native sidecars (init containers with ``restartPolicy: Always``) run as ordinary init
  containers. Ephemeral containers, ``stdin``/``tty``, ``kubectl exec``/``logs``/
  ``port-forward`` (there is no kubelet API) are not supported: read logs with
  :meth:`PodRunner.logs`.
- Service environment variables (``KUBERNETES_SERVICE_HOST`` etc.) and
  ``resourceFieldRef`` env values are not provided (the latter is a config error).
- Node upkeep: no heartbeats, Leases, node-pressure eviction of its own, image or
  container garbage collection, or pod-level resource accounting. Pods it did not start
  (bound to its node before it started and not Pending) are run anew, like after a
  kubelet restart. Hard eviction here is SIGKILL with no grace by default; the real
  kubelet sends SIGTERM and waits 1 s (pass ``grace_seconds=1`` for that).
"""

from __future__ import annotations

import base64
import contextlib
import copy
import datetime
import json
import logging
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

_log = logging.getLogger(__name__)

JSON = dict[str, Any]

POD_IP = "127.0.0.1"
HOST_IP = "127.0.0.1"
MAX_TERMINATION_MESSAGE_BYTES = 4096  # the kubelet's MaxContainerTerminationMessageLength
_FALLBACK_LOG_LINES = 80  # MaxContainerTerminationMessageLogLines
_FALLBACK_LOG_BYTES = 2048  # MaxContainerTerminationMessageLogLength
_DEFAULT_GRACE_SECONDS = 30
_TERMINAL_PHASES = ("Succeeded", "Failed")
_CONFIG_RETRY_SECONDS = 1.0


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --------------------------------------------------------------------------------------
# Status building: pure functions over plain data, so they can be unit-tested.
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Termination:
    """How one run of a container ended (``state.terminated`` / ``lastState.terminated``)."""

    exit_code: int
    reason: str
    started_at: str
    finished_at: str
    container_id: str
    message: str = ""


@dataclass(frozen=True)
class ContainerView:
    """What the status says about one container right now.

    Exactly one of ``waiting_reason``, ``running_since`` and ``terminated`` is set.
    """

    name: str
    image: str
    restart_count: int = 0
    waiting_reason: str | None = "ContainerCreating"
    waiting_message: str = ""
    running_since: str | None = None
    container_id: str | None = None
    terminated: Termination | None = None
    last_terminated: Termination | None = None

    @property
    def ever_started(self) -> bool:
        ran = [t for t in (self.terminated, self.last_terminated) if t is not None]
        return self.running_since is not None or any(t.container_id for t in ran)


@dataclass(frozen=True)
class PodFacts:
    """Everything :func:`build_pod_status` needs to know about one pod."""

    restart_policy: str
    init_containers: Sequence[ContainerView]
    containers: Sequence[ContainerView]
    start_time: str
    terminal: bool = False
    """All processes are gone and none will start again (pod deleted or evicted)."""
    sandbox_ready: bool = True
    evicted_message: str | None = None
    generation: int | None = None


def _termination_json(term: Termination) -> JSON:
    out: JSON = {"exitCode": term.exit_code, "reason": term.reason}
    # ContainerStatusUnknown has no times and no container, as in the kubelet's.
    for key, value in (
        ("message", term.message),
        ("startedAt", term.started_at),
        ("finishedAt", term.finished_at),
        ("containerID", term.container_id),
    ):
        if value:
            out[key] = value
    return out


def container_status(view: ContainerView, *, init: bool = False) -> JSON:
    """One entry of ``containerStatuses`` / ``initContainerStatuses``."""
    state: JSON
    if view.running_since is not None:
        state = {"running": {"startedAt": view.running_since}}
    elif view.terminated is not None:
        state = {"terminated": _termination_json(view.terminated)}
    else:
        waiting: JSON = {"reason": view.waiting_reason or "ContainerCreating"}
        if view.waiting_message:
            waiting["message"] = view.waiting_message
        state = {"waiting": waiting}
    running = view.running_since is not None
    # Init containers are "ready" once they completed successfully, as in the kubelet.
    ready = running and not init
    if init and view.terminated is not None and view.terminated.exit_code == 0:
        ready = True
    out: JSON = {
        "name": view.name,
        "image": view.image,
        "imageID": f"local://{view.image}" if view.ever_started else "",
        "ready": ready,
        "started": running,
        "restartCount": view.restart_count,
        "state": state,
        "lastState": (
            {"terminated": _termination_json(view.last_terminated)}
            if view.last_terminated is not None
            else {}
        ),
    }
    container_id = view.container_id or (view.terminated.container_id if view.terminated else None)
    if container_id:
        out["containerID"] = container_id
    return out


def pod_phase(
    restart_policy: str,
    init_containers: Sequence[ContainerView],
    containers: Sequence[ContainerView],
    *,
    terminal: bool = False,
) -> str:
    """The pod phase, by the rules of the kubelet's ``getPhase`` (without sidecars)."""
    pending_init = 0
    failed_init = 0
    for view in init_containers:
        if view.running_since is not None:
            pending_init += 1
        elif view.terminated is not None:
            if view.terminated.exit_code != 0:
                failed_init += 1
        elif view.last_terminated is not None:
            if view.last_terminated.exit_code != 0:
                failed_init += 1
        else:
            pending_init += 1
    running = waiting = stopped = succeeded = 0
    for view in containers:
        if view.running_since is not None:
            running += 1
        elif view.terminated is not None:
            stopped += 1
            if view.terminated.exit_code == 0:
                succeeded += 1
        elif view.last_terminated is not None:
            stopped += 1
        else:
            waiting += 1
    if failed_init > 0 and restart_policy == "Never":
        return "Failed"
    if pending_init > 0 or waiting > 0:
        return "Pending"
    if running > 0:
        return "Running"
    if stopped > 0:
        if terminal:
            return "Succeeded" if stopped == succeeded else "Failed"
        if restart_policy == "Always":
            return "Running"
        if stopped == succeeded:
            return "Succeeded"
        if restart_policy == "Never":
            return "Failed"
        return "Running"
    return "Pending"


_UNKNOWN_MESSAGE = "The container could not be located when the pod was terminated"


def settle_terminated(
    view: ContainerView, older: Termination | None, *, initialized: bool
) -> ContainerView:
    """A container's final state once its pod is terminal (deleted, evicted, node gone).

    Like the kubelet: a container waiting to be restarted reports its last run as its
    state (the one before that moves to ``lastState``); one that never ran in an
    initialized pod is terminated with ``ContainerStatusUnknown`` and exit code 137.
    """
    if view.terminated is not None or view.running_since is not None:
        return view
    if view.last_terminated is not None:
        return replace(
            view,
            waiting_reason=None,
            waiting_message="",
            terminated=view.last_terminated,
            last_terminated=older,
        )
    if not initialized:
        return view
    unknown = Termination(137, "ContainerStatusUnknown", "", "", "", _UNKNOWN_MESSAGE)
    return replace(view, waiting_reason=None, waiting_message="", terminated=unknown)


def _condition(
    kind: str,
    status: bool,
    previous: Mapping[str, JSON],
    now: str,
    reason: str = "",
    message: str = "",
) -> JSON:
    value = "True" if status else "False"
    before = previous.get(kind)
    # Like the kubelet: the transition time moves only when the status flips.
    if before is not None and before.get("status") == value and before.get("lastTransitionTime"):
        since = before["lastTransitionTime"]
    else:
        since = now
    out: JSON = {"type": kind, "status": value, "lastProbeTime": None, "lastTransitionTime": since}
    if reason:
        out["reason"] = reason
    if message:
        out["message"] = message
    return out


def _go_list(names: Sequence[str]) -> str:
    return "[" + " ".join(names) + "]"  # how Go's %s prints a []string


def build_pod_status(
    facts: PodFacts, previous_conditions: Mapping[str, JSON] | None = None, now: str | None = None
) -> JSON:
    """The ``status`` a kubelet would report for ``facts``.

    ``previous_conditions`` (by type) keeps ``lastTransitionTime`` stable across writes.
    """
    now = now or _now()
    previous = previous_conditions or {}
    phase = pod_phase(
        facts.restart_policy, facts.init_containers, facts.containers, terminal=facts.terminal
    )
    if facts.evicted_message is not None or (facts.terminal and phase not in _TERMINAL_PHASES):
        phase = "Failed"  # the kubelet's TerminatePod: a terminated pod is never left pending
    conditions: list[JSON] = [
        _condition("PodReadyToStartContainers", facts.sandbox_ready, previous, now)
    ]
    incomplete = [
        v.name for v in facts.init_containers if v.terminated is None or v.terminated.exit_code != 0
    ]
    if not facts.init_containers:
        conditions.append(_condition("Initialized", True, previous, now))
    elif phase == "Succeeded":
        conditions.append(_condition("Initialized", True, previous, now, "PodCompleted"))
    elif incomplete:
        conditions.append(
            _condition(
                "Initialized",
                False,
                previous,
                now,
                "ContainersNotInitialized",
                f"containers with incomplete status: {_go_list(incomplete)}",
            )
        )
    else:
        conditions.append(_condition("Initialized", True, previous, now))
    unready = [v.name for v in facts.containers if v.running_since is None]
    for kind in ("Ready", "ContainersReady"):
        if phase in _TERMINAL_PHASES:
            reason = "PodCompleted" if phase == "Succeeded" else "PodFailed"
            conditions.append(_condition(kind, False, previous, now, reason))
        elif unready:
            conditions.append(
                _condition(
                    kind,
                    False,
                    previous,
                    now,
                    "ContainersNotReady",
                    f"containers with unready status: {_go_list(unready)}",
                )
            )
        else:
            conditions.append(_condition(kind, True, previous, now))
    conditions.append(_condition("PodScheduled", True, previous, now))
    if facts.evicted_message is not None:
        conditions.append(
            _condition(
                "DisruptionTarget",
                True,
                previous,
                now,
                "TerminationByKubelet",
                facts.evicted_message,
            )
        )
    status: JSON = {
        "phase": phase,
        "conditions": conditions,
        "hostIP": HOST_IP,
        "hostIPs": [{"ip": HOST_IP}],
        "podIP": POD_IP,
        "podIPs": [{"ip": POD_IP}],
        "startTime": facts.start_time,
        "containerStatuses": [container_status(v) for v in facts.containers],
        "initContainerStatuses": (
            [container_status(v, init=True) for v in facts.init_containers]
            if facts.init_containers
            else None
        ),
        # A merge patch: None clears what an earlier write set.
        "reason": "Evicted" if facts.evicted_message is not None else None,
        "message": facts.evicted_message,
    }
    if facts.generation is not None:
        status["observedGeneration"] = facts.generation
    return status


def expand(text: str, variables: Mapping[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: ``$$`` is a literal ``$``, unknown names stay as is."""
    out: list[str] = []
    checkpoint = 0
    cursor = 0
    while cursor < len(text):
        if text[cursor] == "$" and cursor + 1 < len(text):
            out.append(text[checkpoint:cursor])
            rest = text[cursor + 1 :]
            advance = 1
            if rest[0] == "$":
                out.append("$")
            elif rest[0] == "(":
                end = rest.find(")", 1)
                if end == -1:
                    out.append("$(")
                else:
                    name = rest[1:end]
                    out.append(variables.get(name, f"$({name})"))
                    advance = end + 1
            else:
                out.append("$" + rest[0])
            cursor += advance
            checkpoint = cursor + 1
        cursor += 1
    out.append(text[checkpoint:])
    return "".join(out)


def effective_grace_seconds(pod: Mapping[str, Any]) -> int:
    """The kubelet's grace period for a deleted pod (``calculateEffectiveGracePeriod``)."""
    grace = pod.get("metadata", {}).get("deletionGracePeriodSeconds") or 0
    if grace == 0:
        spec_grace = pod.get("spec", {}).get("terminationGracePeriodSeconds")
        grace = _DEFAULT_GRACE_SECONDS if spec_grace is None else spec_grace
    return max(int(grace), 1)


def read_termination_message(
    message_path: Path, log_path: Path, *, exit_code: int, fallback_to_logs: bool
) -> str:
    """What the kubelet puts in ``state.terminated.message`` for one finished run."""
    try:
        with message_path.open("rb") as stream:
            data = stream.read(MAX_TERMINATION_MESSAGE_BYTES)
    except OSError:
        data = b""
    if not data and fallback_to_logs and exit_code != 0:
        try:
            lines = log_path.read_bytes().splitlines(keepends=True)
        except OSError:
            lines = []
        data = b"".join(lines[-_FALLBACK_LOG_LINES:])[-_FALLBACK_LOG_BYTES:]
    return data.decode("utf-8", errors="replace")


# --------------------------------------------------------------------------------------
# The runner.
# --------------------------------------------------------------------------------------


class _ConfigError(Exception):
    """The container cannot be created yet (missing Secret/ConfigMap/key, no command)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class _Process:
    popen: subprocess.Popen[bytes]
    started_at: str
    log_path: Path
    message_path: Path
    exited: bool = False
    recorded: bool = False
    kill_reason: str | None = None  # set by oom_kill before the SIGKILL

    @property
    def container_id(self) -> str:
        return f"local://{self.popen.pid}"


@dataclass
class _Container:
    spec: JSON
    init: bool
    view: ContainerView
    attempts: int = 0
    process: _Process | None = None
    older: Termination | None = None  # the termination before view.last_terminated
    log_paths: list[Path] = field(default_factory=list)

    @property
    def name(self) -> str:
        return str(self.spec["name"])


class _Pod:
    """The runner's record of one pod (one uid)."""

    def __init__(self, obj: JSON, directory: Path) -> None:
        meta = obj["metadata"]
        spec = obj["spec"]
        self.uid: str = meta["uid"]
        self.namespace: str = meta["namespace"]
        self.name: str = meta["name"]
        self.obj = obj
        self.spec: JSON = spec
        self.restart_policy: str = spec.get("restartPolicy") or "Always"
        self.directory = directory
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.start_time = _now()
        initial = "PodInitializing" if spec.get("initContainers") else "ContainerCreating"
        self.init_containers = [
            _Container(
                c, True, ContainerView(c["name"], c.get("image", ""), waiting_reason=initial)
            )
            for c in spec.get("initContainers") or []
        ]
        self.containers = [
            _Container(
                c, False, ContainerView(c["name"], c.get("image", ""), waiting_reason=initial)
            )
            for c in spec.get("containers") or []
        ]
        self.stopping = False  # no process starts or restarts any more
        self.kill_deadline: float | None = None
        self.delete_when_done = False  # the API asked for deletion: remove the pod at the end
        self.gone = False  # no longer in the API: write nothing
        self.terminal = False
        self.evicted_message: str | None = None
        self.published_phase: str | None = None
        self.conditions: dict[str, JSON] = {}
        self.finished = threading.Event()

    def all_containers(self) -> list[_Container]:
        return [*self.init_containers, *self.containers]

    def live_processes(self) -> list[_Process]:
        return [
            c.process
            for c in self.all_containers()
            if c.process is not None and not c.process.exited
        ]


class _SecretVolume:
    """A secret volume of one container attempt, written like the kubelet's atomic writer."""

    def __init__(self, pod: _Pod, name: str, secret: str, mode: int, data: dict[str, str]) -> None:
        self.pod = pod
        self.name = name
        self.secret = secret
        self.mode = mode
        self.data = data
        self.folder: Path | None = None
        self._versions = 0

    def write(self, data: dict[str, str]) -> None:
        """Write ``data`` as a new version, then swap ``..data`` to it in one rename."""
        folder = self.folder
        if folder is None:
            raise RuntimeError("the volume has no folder yet")
        folder.mkdir(parents=True, exist_ok=True)
        self._versions += 1
        version = f"..version-{self._versions}"
        (folder / version).mkdir()
        for key, value in data.items():
            path = folder / version / key
            path.write_text(value)
            path.chmod(self.mode)
            link = folder / key
            if not link.is_symlink():
                link.symlink_to(Path("..data") / key)
        staging = folder / "..data_tmp"
        staging.symlink_to(version)
        os.replace(staging, folder / "..data")
        self.data = dict(data)


def _pointed_to(env: Mapping[str, str], mount_path: str, folder: Path) -> dict[str, str]:
    """``env`` with values under ``mount_path`` moved to ``folder`` (no mounts here)."""
    root = mount_path.rstrip("/")
    moved = {}
    for name, value in env.items():
        if value == root or value.startswith(root + "/"):
            value = str(folder) + value[len(root) :]
        moved[name] = value
    return moved


class PodRunner:
    """Runs the pods bound to one Node as local processes and reports their status.

    Use as ``runner.start()`` ... ``runner.stop()`` (or the ``pod_runner`` fixture).
    ``api_client`` is a ``kubernetes.client.ApiClient``; the runner makes its own client
    from that client's configuration. ``namespace`` limits the pods it watches (default:
    all). ``entrypoints`` maps an image name to the command its entry point would run,
    for containers that give only ``args``. ``restart_backoff`` is (first delay, cap) in
    seconds between restarts of a container.
    """

    def __init__(
        self,
        api_client: Any,
        node_name: str = "bench-node",
        namespace: str | None = None,
        *,
        schedule: bool = True,
        entrypoints: Mapping[str, Sequence[str]] | None = None,
        base_env: Mapping[str, str] | None = None,
        root: Path | None = None,
        restart_backoff: tuple[float, float] = (0.2, 5.0),
    ) -> None:
        from kubernetes import client

        self.node_name = node_name
        self.namespace = namespace
        self.schedule = schedule
        self.entrypoints = {image: list(cmd) for image, cmd in (entrypoints or {}).items()}
        if base_env is None:
            base_env = {"PATH": os.environ.get("PATH", os.defpath)}
            if os.environ.get("PYTHONPATH"):
                base_env = {**base_env, "PYTHONPATH": os.environ["PYTHONPATH"]}
        self.base_env = dict(base_env)
        self.restart_backoff = restart_backoff
        self._own_root = root is None
        self.root = (
            Path(tempfile.mkdtemp(prefix=f"pod-runner-{node_name}-")) if root is None else root
        )
        configuration = copy.deepcopy(api_client.configuration)
        configuration.connection_pool_maxsize = 32  # one connection per busy pod thread
        self._client: Any = client.ApiClient(configuration)
        self._core: Any = client.CoreV1Api(self._client)
        self._models = client
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._pods: dict[str, _Pod] = {}
        self._by_name: dict[tuple[str, str], _Pod] = {}
        self._stopping = threading.Event()
        self._quiet = False  # stopping: write nothing more to the API
        self._lost = False  # lose_node(): the node acts no more
        self._node_deleted = False
        self._watch_thread: threading.Thread | None = None
        self._watch_response: Any = None
        self._resource_version: str | None = None
        self._started = False
        self._secret_volumes: list[_SecretVolume] = []
        self._secret_thread: threading.Thread | None = None

    # ---- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        """Register the Node, take in the pods that exist, and start watching."""
        if self._started:
            raise RuntimeError("a PodRunner starts once")
        self._started = True
        self._register_node()
        self._relist()
        self._watch_thread = threading.Thread(
            target=self._watch_loop, name=f"pod-runner-watch-{self.node_name}", daemon=True
        )
        self._watch_thread.start()
        self._secret_thread = threading.Thread(
            target=self._refresh_secret_volumes,
            name=f"pod-runner-secrets-{self.node_name}",
            daemon=True,
        )
        self._secret_thread.start()

    def stop(self, *, cleanup: bool = True) -> None:
        """SIGKILL every process, stop watching; with ``cleanup``, force-delete the pods
        still bound to this node and the Node itself (so a later runner starts clean)."""
        self._stopping.set()
        self._quiet = True
        self._interrupt_watch()
        if self._watch_thread is not None:
            self._watch_thread.join(timeout=30)
        with self._lock:
            pods = list(self._pods.values())
        for pod in pods:
            self._request_termination(pod, grace=0)
        for pod in pods:
            pod.finished.wait(timeout=30)
        if cleanup and self._started and not self._node_deleted:
            with contextlib.suppress(Exception):
                for item in self._list_pods_on_node():
                    self._delete_pod(item["metadata"], uid=None)
            with contextlib.suppress(Exception):
                self._api(self._core.delete_node, self.node_name)
        self._client.close()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PodRunner:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- what tests read -------------------------------------------------------------

    def logs(
        self, namespace: str, name: str, container: str | None = None, *, previous: bool = False
    ) -> str:
        """The combined stdout/stderr of a container's current (or previous) run.

        ``container`` defaults to the pod's first container, as kubectl does. Logs outlive
        the pod's deletion until the runner stops. Empty when it has not run yet.
        """
        pod = self._pod(namespace, name)
        if pod is None:
            return ""
        target = self._container(pod, container)
        paths = target.log_paths
        index = -2 if previous else -1
        if len(paths) < (2 if previous else 1):
            return ""
        try:
            return paths[index].read_bytes().decode("utf-8", errors="replace")
        except OSError:
            return ""

    def pids(self, namespace: str, name: str) -> dict[str, int]:
        """The pids of a pod's running processes, by container name."""
        pod = self._pod(namespace, name)
        if pod is None:
            return {}
        with pod.lock:
            return {
                c.name: c.process.popen.pid
                for c in pod.all_containers()
                if c.process is not None and not c.process.exited
            }

    def wait_exited(self, namespace: str, name: str, timeout: float = 60.0) -> dict[str, int]:
        """Wait until every process of the pod has exited for good and its final status
        is written (and, if it was being deleted, the pod is removed from the API).
        Returns each regular container's last exit code."""
        deadline = time.monotonic() + timeout
        pod = self._await_pod(namespace, name, deadline)
        if not pod.finished.wait(timeout=max(0.0, deadline - time.monotonic())):
            raise TimeoutError(f"pod {namespace}/{name}: processes still running after {timeout}s")
        with pod.lock:
            return {
                c.name: c.view.terminated.exit_code
                for c in pod.containers
                if c.view.terminated is not None
            }

    # ---- disruptions -----------------------------------------------------------------

    def evict(
        self,
        namespace: str,
        name: str,
        *,
        resource: str = "memory",
        grace_seconds: float = 0,
        timeout: float = 60.0,
    ) -> None:
        """Hard eviction by the kubelet for node pressure on ``resource``: SIGKILL with no
        grace (or SIGTERM and ``grace_seconds``), then phase Failed, reason Evicted, a
        DisruptionTarget condition, and the pod is left in the API."""
        deadline = time.monotonic() + timeout
        pod = self._await_pod(namespace, name, deadline)
        with pod.lock:
            message = self._eviction_message(pod, resource)
            pod.evicted_message = message
        self._request_termination(pod, grace=grace_seconds)
        if not pod.finished.wait(timeout=max(0.0, deadline - time.monotonic())):
            raise TimeoutError(f"pod {namespace}/{name} was not evicted within {timeout}s")

    def oom_kill(
        self, namespace: str, name: str, container: str | None = None, timeout: float = 60.0
    ) -> None:
        """The kernel's OOM killer takes ``container``'s process (default: the first
        running one): SIGKILL, then terminated with reason OOMKilled and exit code 137.
        The restartPolicy decides what follows. Returns once that status is written."""
        deadline = time.monotonic() + timeout
        pod = self._await_pod(namespace, name, deadline)
        with pod.changed:
            while True:
                candidates = [
                    c
                    for c in pod.all_containers()
                    if (container is None or c.name == container)
                    and c.process is not None
                    and not c.process.exited
                ]
                if candidates:
                    break
                if pod.finished.is_set() or not pod.changed.wait(deadline - time.monotonic()):
                    raise RuntimeError(f"pod {namespace}/{name}: no running container to OOM-kill")
            process = candidates[0].process
            assert process is not None
            process.kill_reason = "OOMKilled"
            self._signal(process, signal.SIGKILL)
            if not pod.changed.wait_for(
                lambda: process.recorded, timeout=max(0.0, deadline - time.monotonic())
            ):
                raise TimeoutError(f"pod {namespace}/{name}: OOM kill not recorded in {timeout}s")

    def lose_node(self, timeout: float = 60.0) -> None:
        """The node dies: every process is SIGKILLed and the runner stops acting (no
        watch, no status writes, no deletions), so its pods keep reporting Running."""
        self._lost = True
        self._interrupt_watch()
        with self._lock:
            pods = list(self._pods.values())
        for pod in pods:
            self._request_termination(pod, grace=0)
        deadline = time.monotonic() + timeout
        for pod in pods:
            if not pod.finished.wait(timeout=max(0.0, deadline - time.monotonic())):
                raise TimeoutError(f"pod {pod.namespace}/{pod.name}: processes survived")

    def declare_node_gone(self) -> None:
        """What the control plane does about a dead node, done at once instead of after
        the usual timeouts: the node lifecycle controller marks the Node's conditions
        Unknown, taints it unreachable and flips its pods' Ready condition to False; the
        Node is deleted; then PodGC marks each of its pods Failed with a DisruptionTarget
        condition (DeletionByPodGC) and force-deletes it (grace 0).
        Calls :meth:`lose_node` first if the node is still alive."""
        if not self._lost:
            self.lose_node()
        now = _now()
        node = self._api(self._core.read_node, self.node_name)
        unknown = []
        for cond in node.get("status", {}).get("conditions") or []:
            unknown.append(
                {
                    **cond,
                    "status": "Unknown",
                    "reason": "NodeStatusUnknown",
                    "message": "Kubelet stopped posting node status.",
                    "lastTransitionTime": now,
                }
            )
        self._api(
            self._core.patch_node_status,
            self.node_name,
            {"status": {"conditions": unknown}},
            _content_type="application/merge-patch+json",
        )
        taints = [
            {"key": "node.kubernetes.io/unreachable", "effect": effect, "timeAdded": now}
            for effect in ("NoSchedule", "NoExecute")
        ]
        self._api(
            self._core.patch_node,
            self.node_name,
            {"spec": {"taints": taints}},
            _content_type="application/merge-patch+json",
        )
        pods = self._list_pods_on_node()
        for item in pods:
            conditions = item.get("status", {}).get("conditions") or []
            marked = [
                {**c, "status": "False", "lastTransitionTime": now}
                if c.get("type") == "Ready" and c.get("status") != "False"
                else c
                for c in conditions
            ]
            self._patch_status_quietly(item, {"status": {"conditions": marked}})
        self._api(self._core.delete_node, self.node_name)
        self._node_deleted = True
        for item in self._list_pods_on_node():
            status = item.get("status", {})
            if status.get("phase") not in _TERMINAL_PHASES:
                conditions = [
                    c for c in status.get("conditions") or [] if c.get("type") != "DisruptionTarget"
                ]
                conditions.append(
                    {
                        "type": "DisruptionTarget",
                        "status": "True",
                        "reason": "DeletionByPodGC",
                        "message": "PodGC: node no longer exists",
                        "lastTransitionTime": _now(),
                    }
                )
                self._patch_status_quietly(
                    item, {"status": {"phase": "Failed", "conditions": conditions}}
                )
            self._delete_pod(item["metadata"], uid=item["metadata"]["uid"])

    # ---- API plumbing ----------------------------------------------------------------

    def _api(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> JSON:
        """Call a CoreV1Api method and return the JSON body as a dict.

        Raw responses sidestep the client's model deserialization (which is known to
        choke on some responses, e.g. pods/binding's) and give plain camelCase dicts.
        """
        response = method(*args, _preload_content=False, **kwargs)
        try:
            data = response.data
        finally:
            response.release_conn()
        return json.loads(data) if data else {}

    def _register_node(self) -> None:
        from kubernetes.client.exceptions import ApiException

        machine = platform.machine().lower()
        arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)
        memory_kib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 1024
        capacity = {
            "cpu": str(os.cpu_count() or 1),
            "memory": f"{memory_kib}Ki",
            "pods": "110",
            "ephemeral-storage": "100Gi",
        }
        body = self._models.V1Node.from_dict(
            {
                "metadata": {
                    "name": self.node_name,
                    "labels": {
                        "kubernetes.io/hostname": self.node_name,
                        "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": arch,
                        "alpineagents.dev/pod-runner": "true",
                    },
                },
            }
        )
        try:
            self._api(self._core.create_node, body)
        except ApiException as error:
            if error.status != 409:
                raise
            # A leftover of an earlier runner with this name: make it schedulable again.
            self._api(
                self._core.patch_node,
                self.node_name,
                {"spec": {"taints": None, "unschedulable": None}},
                _content_type="application/merge-patch+json",
            )
        now = _now()

        def cond(kind: str, status: str, reason: str, message: str) -> JSON:
            return {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }

        status = {
            "capacity": capacity,
            "allocatable": capacity,
            "conditions": [
                cond(
                    "MemoryPressure",
                    "False",
                    "KubeletHasSufficientMemory",
                    "kubelet has sufficient memory available",
                ),
                cond(
                    "DiskPressure",
                    "False",
                    "KubeletHasNoDiskPressure",
                    "kubelet has no disk pressure",
                ),
                cond(
                    "PIDPressure",
                    "False",
                    "KubeletHasSufficientPID",
                    "kubelet has sufficient PID available",
                ),
                cond("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
            ],
            "addresses": [
                {"type": "InternalIP", "address": HOST_IP},
                {"type": "Hostname", "address": self.node_name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
            "nodeInfo": {
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
                "kernelVersion": platform.release(),
                "osImage": "pod-runner (local processes)",
                "containerRuntimeVersion": "local://pod-runner",
                "kubeletVersion": "v0.0.0-pod-runner",
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": arch,
            },
        }
        self._api(
            self._core.patch_node_status,
            self.node_name,
            {"status": status},
            _content_type="application/merge-patch+json",
        )

    def _list_pods_on_node(self) -> list[JSON]:
        result = self._api(
            self._core.list_pod_for_all_namespaces,
            field_selector=f"spec.nodeName={self.node_name}",
        )
        return list(result.get("items") or [])

    def _list_pods(self, **kwargs: Any) -> Any:
        if self.namespace is None:
            return self._core.list_pod_for_all_namespaces(_preload_content=False, **kwargs)
        return self._core.list_namespaced_pod(self.namespace, _preload_content=False, **kwargs)

    def _delete_pod(self, meta: Mapping[str, Any], uid: str | None) -> None:
        from kubernetes.client.exceptions import ApiException

        options = self._models.V1DeleteOptions(
            grace_period_seconds=0,
            preconditions=self._models.V1Preconditions(uid=uid) if uid else None,
        )
        try:
            self._api(
                self._core.delete_namespaced_pod,
                meta["name"],
                meta["namespace"],
                grace_period_seconds=0,
                body=options,
            )
        except ApiException as error:
            if error.status not in (404, 409):  # gone already, or a newer pod by that name
                raise

    def _patch_status_quietly(self, item: Mapping[str, Any], body: JSON) -> None:
        from kubernetes.client.exceptions import ApiException

        meta = item["metadata"]
        try:
            self._api(
                self._core.patch_namespaced_pod_status,
                meta["name"],
                meta["namespace"],
                body,
                _content_type="application/merge-patch+json",
            )
        except ApiException as error:
            if error.status != 404:
                raise

    def _bind(self, obj: JSON) -> None:
        from kubernetes.client.exceptions import ApiException

        meta = obj["metadata"]
        binding = self._models.V1Binding(
            metadata=self._models.V1ObjectMeta(name=meta["name"], uid=meta["uid"]),
            target=self._models.V1ObjectReference(
                api_version="v1", kind="Node", name=self.node_name
            ),
        )
        try:
            self._api(
                self._core.create_namespaced_pod_binding, meta["name"], meta["namespace"], binding
            )
        except ApiException as error:
            # 409: another scheduler bound it first; 404: deleted meanwhile.
            if error.status not in (404, 409):
                _log.warning("binding %s/%s failed: %s", meta["namespace"], meta["name"], error)

    # ---- watching --------------------------------------------------------------------

    def _relist(self) -> None:
        response = self._list_pods()
        try:
            listing = json.loads(response.data)
        finally:
            response.release_conn()
        items: list[JSON] = listing.get("items") or []
        seen = {item["metadata"]["uid"] for item in items}
        with self._lock:
            vanished = [pod for uid, pod in self._pods.items() if uid not in seen]
        for pod in vanished:
            self._on_deleted(pod.obj)
        for item in items:
            self._on_pod(item)
        self._resource_version = listing["metadata"]["resourceVersion"]

    def _interrupt_watch(self) -> None:
        response = self._watch_response
        if response is not None:
            with contextlib.suppress(Exception):
                response.shutdown()
            with contextlib.suppress(Exception):
                response.close()

    def _watch_loop(self) -> None:
        from kubernetes.client.exceptions import ApiException

        failures = 0
        while not self._stopping.is_set() and not self._lost:
            try:
                if self._resource_version is None:
                    self._relist()
                self._watch_once()
                failures = 0
            except ApiException as error:
                if error.status == 410:
                    self._resource_version = None
                    continue
                failures += 1
                _log.warning("pod watch failed: %s", error)
            except Exception as error:
                if self._stopping.is_set() or self._lost:
                    break
                failures += 1
                _log.warning("pod watch failed: %r", error)
            if failures:
                self._stopping.wait(min(0.2 * 2**failures, 5.0))

    def _watch_once(self) -> None:
        response = self._list_pods(
            watch=True,
            resource_version=self._resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=60,
            _request_timeout=(10, 90),
        )
        self._watch_response = response
        try:
            if self._stopping.is_set() or self._lost:
                return
            for line in response:
                if self._stopping.is_set() or self._lost:
                    return
                if not line.strip():
                    continue
                event = json.loads(line)
                kind = event.get("type")
                obj = event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        self._resource_version = None  # too old: list again
                        return
                    raise RuntimeError(f"watch error: {obj}")
                self._resource_version = obj["metadata"]["resourceVersion"]
                if kind == "BOOKMARK":
                    continue
                try:
                    if kind == "DELETED":
                        self._on_deleted(obj)
                    else:
                        self._on_pod(obj)
                except Exception:
                    _log.exception(
                        "handling %s of pod %s failed", kind, obj["metadata"].get("name")
                    )
        finally:
            self._watch_response = None
            # Never hand a watch's connection back open: the server may still be
            # streaming on it, and the next request to reuse it would hang behind that.
            with contextlib.suppress(Exception):
                response.close()
            with contextlib.suppress(Exception):
                response.release_conn()

    def _on_pod(self, obj: JSON) -> None:
        if self._lost or self._stopping.is_set():
            return
        meta, spec = obj["metadata"], obj.get("spec", {})
        node = spec.get("nodeName") or ""
        if not node:
            if self.schedule and not meta.get("deletionTimestamp"):
                self._bind(obj)
            return
        if node != self.node_name:
            return
        with self._lock:
            pod = self._pods.get(meta["uid"])
            if pod is None:
                if obj.get("status", {}).get("phase") in _TERMINAL_PHASES:
                    return  # finished before this runner's time
                pod = _Pod(obj, self.root / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}")
                self._pods[pod.uid] = pod
                self._by_name[(pod.namespace, pod.name)] = pod
                self._changed.notify_all()
                threading.Thread(
                    target=self._run_pod, args=(pod,), name=f"pod-{pod.name}", daemon=True
                ).start()
        with pod.lock:
            pod.obj = obj
        if meta.get("deletionTimestamp"):
            with pod.lock:
                pod.delete_when_done = True
            self._request_termination(pod, grace=effective_grace_seconds(obj))

    def _on_deleted(self, obj: JSON) -> None:
        with self._lock:
            pod = self._pods.get(obj["metadata"]["uid"])
        if pod is None:
            return
        with pod.lock:
            pod.gone = True
            pod.changed.notify_all()
        # A force-deleted pod still gets its grace period from the kubelet.
        self._request_termination(pod, grace=effective_grace_seconds(obj))

    # ---- one pod ---------------------------------------------------------------------

    def _request_termination(self, pod: _Pod, grace: float) -> None:
        """Stop the pod's processes: SIGTERM now and SIGKILL at the deadline (grace 0:
        SIGKILL now). A later request may only shorten the deadline."""
        with pod.lock:
            deadline = time.monotonic() + grace
            first = not pod.stopping
            pod.stopping = True
            if pod.kill_deadline is None or deadline < pod.kill_deadline:
                pod.kill_deadline = deadline
            pod.changed.notify_all()
            if grace <= 0:
                for process in pod.live_processes():
                    self._signal(process, signal.SIGKILL)
                return
            if not first:
                return
            for process in pod.live_processes():
                self._signal(process, signal.SIGTERM)
        threading.Thread(
            target=self._enforce_deadline, args=(pod,), name=f"kill-{pod.name}", daemon=True
        ).start()

    def _enforce_deadline(self, pod: _Pod) -> None:
        with pod.changed:
            while pod.live_processes():
                assert pod.kill_deadline is not None
                remaining = pod.kill_deadline - time.monotonic()
                if remaining <= 0:
                    for process in pod.live_processes():
                        self._signal(process, signal.SIGKILL)
                    return
                pod.changed.wait(remaining)

    @staticmethod
    def _signal(process: _Process, signum: int) -> None:
        # Called with the pod's lock held; the reaper reaps under the same lock, so the
        # pid (and the process group it leads) cannot be reused under us.
        if process.exited:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.popen.pid, signum)

    def _run_pod(self, pod: _Pod) -> None:
        try:
            self._publish(pod)
            initialized = True
            for container in pod.init_containers:
                if not self._supervise(pod, container):
                    initialized = False
                    break
            if initialized and not pod.stopping:
                threads = [
                    threading.Thread(
                        target=self._supervise,
                        args=(pod, c),
                        name=f"pod-{pod.name}-{c.name}",
                        daemon=True,
                    )
                    for c in pod.containers
                ]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
            with pod.lock:
                pod.terminal = pod.stopping
                if pod.terminal:
                    self._settle(pod, initialized)
                self._publish(pod, final=True)
                delete = pod.delete_when_done and not pod.gone
            if delete and not self._quiet and not self._lost:
                self._delete_pod(pod.obj["metadata"], uid=pod.uid)
        except Exception:
            _log.exception("pod %s/%s: runner failed", pod.namespace, pod.name)
        finally:
            pod.finished.set()
            with pod.changed:
                pod.changed.notify_all()

    @staticmethod
    def _settle(pod: _Pod, initialized: bool) -> None:
        for container in pod.init_containers:
            container.view = settle_terminated(container.view, container.older, initialized=False)
        for container in pod.containers:
            container.view = settle_terminated(
                container.view, container.older, initialized=initialized
            )

    def _supervise(self, pod: _Pod, container: _Container) -> bool:
        """Run one container until it is done for good (restarting per restartPolicy).
        Returns whether its last run succeeded (what an init container needs)."""
        failures = 0
        while True:
            outcome = self._start(pod, container)
            if outcome is None:  # not startable yet, or the pod is stopping
                with pod.changed:
                    if pod.stopping or pod.changed.wait_for(
                        lambda: pod.stopping, timeout=_CONFIG_RETRY_SECONDS
                    ):
                        return False
                continue
            term = (
                outcome if isinstance(outcome, Termination) else self._reap(pod, container, outcome)
            )
            with pod.changed:
                policy = pod.restart_policy
                again = not pod.stopping and (
                    policy == "Always" or (policy == "OnFailure" and term.exit_code != 0)
                )
                if container.init and term.exit_code == 0:
                    again = False
                if not again:
                    return term.exit_code == 0
                failures += 1
                container.older = container.view.last_terminated
                delay = min(self.restart_backoff[0] * 2 ** (failures - 1), self.restart_backoff[1])
                container.view = replace(
                    container.view,
                    restart_count=container.view.restart_count + 1,
                    waiting_reason="CrashLoopBackOff",
                    waiting_message=(
                        f"back-off {delay:g}s restarting failed container={container.name} "
                        f"pod={pod.name}_{pod.namespace}({pod.uid})"
                    ),
                    terminated=None,
                    container_id=None,
                    last_terminated=term,
                )
                self._publish(pod)
                if pod.changed.wait_for(lambda: pod.stopping, timeout=delay):
                    return False

    def _start(self, pod: _Pod, container: _Container) -> _Process | Termination | None:
        """Start one run of the container: its process, or how starting it failed
        (StartError), or None when it cannot start now."""
        try:
            env = self._container_env(pod, container)
            argv = self._argv(container, env)
            secret_volumes = self._secret_volume_data(pod, container)
        except _ConfigError as error:
            with pod.lock:
                if not pod.stopping:
                    container.view = replace(
                        container.view, waiting_reason=error.reason, waiting_message=str(error)
                    )
                    self._publish(pod)
            return None
        with pod.lock:
            if pod.stopping:
                return None
            container.attempts += 1
            directory = pod.directory / f"{container.name}-{container.attempts}"
            work = directory / "work"
            (work / "tmp").mkdir(parents=True, exist_ok=True)
            log_path = directory / "log"
            message_path = directory / "termination-log"
            message_path.touch()
            container.log_paths.append(log_path)
            for mount_path, volume in secret_volumes:
                volume.folder = directory / "volumes" / volume.name
                volume.write(volume.data)
                env = _pointed_to(env, mount_path, volume.folder)
                with self._lock:
                    self._secret_volumes.append(volume)
            env = {
                **self.base_env,
                "HOSTNAME": pod.name,
                "HOME": str(work),
                "TMPDIR": str(work / "tmp"),
                **env,
                "TERMINATION_MESSAGE_PATH": str(message_path),
            }
            started_at = _now()
            executable = argv[0]
            if "/" not in executable:
                executable = shutil.which(executable, path=env.get("PATH", "")) or executable
            try:
                with log_path.open("ab") as log:
                    popen = subprocess.Popen(
                        [executable, *argv[1:]],
                        cwd=work,
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
            except OSError as error:
                term = Termination(
                    exit_code=128,
                    reason="StartError",
                    started_at="1970-01-01T00:00:00Z",
                    finished_at=_now(),
                    container_id=f"local://start-error-{container.attempts}",
                    message=(
                        "failed to create containerd task: exec: "
                        f'"{argv[0]}": {error.strerror or error}'
                    ),
                )
                container.view = replace(
                    container.view,
                    waiting_reason=None,
                    waiting_message="",
                    running_since=None,
                    container_id=None,
                    terminated=term,
                )
                self._publish(pod)
                return term
            process = _Process(popen, started_at, log_path, message_path)
            container.process = process
            container.view = replace(
                container.view,
                waiting_reason=None,
                waiting_message="",
                running_since=started_at,
                container_id=process.container_id,
                terminated=None,
            )
            self._publish(pod)
            return process

    def _reap(self, pod: _Pod, container: _Container, process: _Process) -> Termination:
        pid = process.popen.pid
        # Wait without reaping, so the pid stays reserved until the lock is held.
        while True:
            try:
                os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
                break
            except ChildProcessError:
                break
            except InterruptedError:
                continue
        with pod.changed:
            # A container's exit takes all its processes with it.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            code = process.popen.wait()
            process.exited = True
            exit_code = 128 - code if code < 0 else code
            reason = process.kill_reason or ("Completed" if exit_code == 0 else "Error")
            message = read_termination_message(
                process.message_path,
                process.log_path,
                exit_code=exit_code,
                fallback_to_logs=container.spec.get("terminationMessagePolicy")
                == "FallbackToLogsOnError",
            )
            term = Termination(
                exit_code=exit_code,
                reason=reason,
                started_at=process.started_at,
                finished_at=_now(),
                container_id=process.container_id,
                message=message,
            )
            container.view = replace(
                container.view,
                running_since=None,
                container_id=None,
                terminated=term,
                waiting_reason=None,
                waiting_message="",
            )
            self._publish(pod)
            process.recorded = True
            pod.changed.notify_all()
            return term

    def _publish(self, pod: _Pod, *, final: bool = False) -> None:
        """Write the pod's status (call with the pod's lock held)."""
        from kubernetes.client.exceptions import ApiException

        if self._quiet or self._lost or pod.gone:
            return
        facts = PodFacts(
            restart_policy=pod.restart_policy,
            init_containers=[c.view for c in pod.init_containers],
            containers=[c.view for c in pod.containers],
            start_time=pod.start_time,
            terminal=pod.terminal,
            sandbox_ready=not final,
            evicted_message=pod.evicted_message if final else None,
            generation=pod.obj["metadata"].get("generation"),
        )
        status = build_pod_status(facts, pod.conditions)
        if pod.published_phase in _TERMINAL_PHASES:
            status["phase"] = pod.published_phase  # a terminal phase is forever
        try:
            self._api(
                self._core.patch_namespaced_pod_status,
                pod.name,
                pod.namespace,
                {"status": status},
                _content_type="application/merge-patch+json",
            )
        except ApiException as error:
            if error.status == 404:
                pod.gone = True
                return
            _log.error(
                "pod %s/%s: status write refused: %s %s",
                pod.namespace,
                pod.name,
                error.status,
                error.body,
            )
            return
        pod.published_phase = status["phase"]
        pod.conditions = {c["type"]: c for c in status["conditions"]}

    # ---- container configuration -----------------------------------------------------

    def _argv(self, container: _Container, env: Mapping[str, str]) -> list[str]:
        spec = container.spec
        command = list(spec.get("command") or [])
        if not command:
            command = list(self.entrypoints.get(spec.get("image", ""), []))
        if not command:
            raise _ConfigError(
                "CreateContainerError",
                f"pod_runner does not run images: container {container.name!r} has no "
                f"command and image {spec.get('image')!r} has no entry in entrypoints=",
            )
        argv = [expand(part, env) for part in [*command, *(spec.get("args") or [])]]
        if argv[0] in ("python", "python3"):
            argv[0] = sys.executable
        return argv

    def _container_env(self, pod: _Pod, container: _Container) -> dict[str, str]:
        env: dict[str, str] = {}
        spec = container.spec
        for source in spec.get("envFrom") or []:
            prefix = source.get("prefix") or ""
            if "configMapRef" in source:
                ref = source["configMapRef"]
                data = self._config_map(pod.namespace, ref["name"], bool(ref.get("optional")))
            elif "secretRef" in source:
                ref = source["secretRef"]
                data = self._secret(pod.namespace, ref["name"], bool(ref.get("optional")))
            else:
                continue
            for key, value in (data or {}).items():
                if "=" not in key:
                    env[prefix + key] = value
        for item in spec.get("env") or []:
            name = item["name"]
            source = item.get("valueFrom")
            if source is None:
                env[name] = expand(item.get("value") or "", env)
                continue
            resolved = self._env_value(pod, source)
            if resolved is not None:
                env[name] = resolved
        return env

    def _secret_volume_data(
        self, pod: _Pod, container: _Container
    ) -> list[tuple[str, _SecretVolume]]:
        """(mountPath, volume) of each secret volume the container mounts, read now."""
        volumes = {v.get("name"): v for v in pod.spec.get("volumes") or []}
        found = []
        for mount in container.spec.get("volumeMounts") or []:
            source = (volumes.get(mount.get("name")) or {}).get("secret")
            if not isinstance(source, dict):
                continue
            name, optional = source["secretName"], bool(source.get("optional"))
            try:
                data = self._secret(pod.namespace, name, optional)
            except _ConfigError:
                raise _ConfigError(
                    "ContainerCreating",
                    f'MountVolume.SetUp failed for volume "{mount["name"]}" : '
                    f'secret "{name}" not found',
                ) from None
            volume = _SecretVolume(
                pod, str(mount["name"]), name, int(source.get("defaultMode", 0o644)), data or {}
            )
            found.append((str(mount["mountPath"]), volume))
        return found

    def _refresh_secret_volumes(self) -> None:
        """Write a Secret's new data into the volumes that mount it, as the kubelet does."""
        while not self._stopping.wait(1.0):
            with self._lock:
                self._secret_volumes = [
                    v for v in self._secret_volumes if not v.pod.finished.is_set()
                ]
                volumes = list(self._secret_volumes)
            for volume in volumes:
                try:
                    data = self._secret(volume.pod.namespace, volume.secret, optional=True)
                except Exception:  # the API is unreachable for a moment: next round
                    continue
                if data is not None and data != volume.data:
                    volume.write(data)

    def _env_value(self, pod: _Pod, source: Mapping[str, Any]) -> str | None:
        if "fieldRef" in source:
            return self._field_value(pod, source["fieldRef"]["fieldPath"])
        for key, kind, read in (
            ("secretKeyRef", "Secret", self._secret),
            ("configMapKeyRef", "ConfigMap", self._config_map),
        ):
            if key in source:
                ref = source[key]
                optional = bool(ref.get("optional"))
                data = read(pod.namespace, ref["name"], optional)
                if data is None:
                    return None
                if ref["key"] not in data:
                    if optional:
                        return None
                    raise _ConfigError(
                        "CreateContainerConfigError",
                        f"couldn't find key {ref['key']} in {kind} {pod.namespace}/{ref['name']}",
                    )
                return data[ref["key"]]
        raise _ConfigError(
            "CreateContainerConfigError",
            f"pod_runner does not emulate env valueFrom {sorted(source)}",
        )

    def _field_value(self, pod: _Pod, path: str) -> str:
        meta, spec = pod.obj["metadata"], pod.obj.get("spec", {})
        simple = {
            "metadata.name": meta["name"],
            "metadata.namespace": meta["namespace"],
            "metadata.uid": meta["uid"],
            "spec.nodeName": spec.get("nodeName", ""),
            "spec.serviceAccountName": spec.get("serviceAccountName", ""),
            "status.podIP": POD_IP,
            "status.podIPs": POD_IP,
            "status.hostIP": HOST_IP,
            "status.hostIPs": HOST_IP,
        }
        if path in simple:
            return str(simple[path])
        match = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
        if match:
            return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
        raise _ConfigError("CreateContainerConfigError", f"unsupported fieldPath {path!r}")

    def _read_object(self, kind: str, namespace: str, name: str, optional: bool) -> JSON | None:
        from kubernetes.client.exceptions import ApiException

        method = (
            self._core.read_namespaced_secret
            if kind == "secret"
            else self._core.read_namespaced_config_map
        )
        try:
            return self._api(method, name, namespace)
        except ApiException as error:
            if error.status != 404:
                raise
            if optional:
                return None
            raise _ConfigError("CreateContainerConfigError", f'{kind} "{name}" not found') from None

    def _secret(self, namespace: str, name: str, optional: bool) -> dict[str, str] | None:
        obj = self._read_object("secret", namespace, name, optional)
        if obj is None:
            return None
        return {
            key: base64.b64decode(value).decode("utf-8", errors="surrogateescape")
            for key, value in (obj.get("data") or {}).items()
        }

    def _config_map(self, namespace: str, name: str, optional: bool) -> dict[str, str] | None:
        obj = self._read_object("configmap", namespace, name, optional)
        if obj is None:
            return None
        return dict(obj.get("data") or {})

    # ---- lookups ---------------------------------------------------------------------

    def _pod(self, namespace: str, name: str) -> _Pod | None:
        with self._lock:
            return self._by_name.get((namespace, name))

    def _await_pod(self, namespace: str, name: str, deadline: float) -> _Pod:
        with self._changed:
            while True:
                pod = self._by_name.get((namespace, name))
                if pod is not None:
                    return pod
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"pod {namespace}/{name} never ran on {self.node_name}")
                self._changed.wait(remaining)

    @staticmethod
    def _container(pod: _Pod, name: str | None) -> _Container:
        if name is None:
            return (pod.containers or pod.init_containers)[0]
        for container in pod.all_containers():
            if container.name == name:
                return container
        raise KeyError(f"pod {pod.namespace}/{pod.name} has no container {name!r}")

    @staticmethod
    def _eviction_message(pod: _Pod, resource: str) -> str:
        message = (
            f"The node was low on resource: {resource}. Threshold quantity: 100Mi, available: 0. "
        )
        for container in pod.containers:
            process = container.process
            if process is None or process.exited:
                continue
            usage = "0"
            with contextlib.suppress(OSError):
                status = Path(f"/proc/{process.popen.pid}/status").read_text()
                found = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
                if found:
                    usage = f"{found.group(1)}Ki"
            request = (container.spec.get("resources") or {}).get("requests", {}).get(resource, "0")
            message += (
                f"Container {container.name} was using {usage}, request is {request}, "
                f"has larger consumption of {resource}. "
            )
        return message


# --------------------------------------------------------------------------------------
# Waiting on pods through the API, and the fixture.
# --------------------------------------------------------------------------------------


def wait_for_pod(
    api_client: Any,
    namespace: str,
    name: str,
    until: Callable[[JSON | None], bool],
    timeout: float = 60.0,
) -> JSON | None:
    """Watch one pod until ``until(pod)`` holds, where ``pod`` is its JSON dict, or None
    while it does not exist. Returns that last value; raises TimeoutError (with the last
    state seen) at the deadline."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core: Any = client.CoreV1Api(api_client)
    deadline = time.monotonic() + timeout
    selector = f"metadata.name={name}"
    last: JSON | None = None
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"pod {namespace}/{name}: condition not met; last seen: {last}")
        response = core.list_namespaced_pod(
            namespace, field_selector=selector, _preload_content=False
        )
        try:
            listing = json.loads(response.data)
        finally:
            response.release_conn()
        items = listing.get("items") or []
        last = items[0] if items else None
        if until(last):
            return last
        version = listing["metadata"]["resourceVersion"]
        try:
            for event in _watch_events(core, namespace, selector, version, remaining):
                if event["type"] == "ERROR":
                    break  # e.g. 410 Gone: list again
                if event["type"] == "BOOKMARK":
                    continue
                last = None if event["type"] == "DELETED" else event["object"]
                if until(last):
                    return last
        except ApiException as error:
            if error.status != 410:
                raise


def _watch_events(
    core: Any, namespace: str, selector: str, version: str, remaining: float
) -> Iterator[JSON]:
    seconds = max(1, int(remaining))
    response = core.list_namespaced_pod(
        namespace,
        field_selector=selector,
        resource_version=version,
        watch=True,
        timeout_seconds=seconds,
        _request_timeout=(10, seconds + 10),
        _preload_content=False,
    )
    try:
        for line in response:
            if line.strip():
                yield json.loads(line)
    finally:
        response.close()  # not reusable: the server may still be streaming on it
        response.release_conn()


@pytest.fixture
def pod_runner(control_plane: Any) -> Iterator[PodRunner]:
    """A :class:`PodRunner` for node ``bench-node`` that also schedules, on the session's
    control plane; stopped (processes killed, its pods and Node deleted) after the test."""
    api_client = control_plane.api_client()
    runner = PodRunner(api_client)
    try:
        runner.start()
        yield runner
    finally:
        runner.stop()
        api_client.close()
