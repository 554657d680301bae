"""Where the e2e suite runs: a cluster of your own, or the bench's real node.

Both give a test the same few things (:class:`Environment`): ``kubectl`` against the
cluster, the namespace the chart was installed into, an API client, a run pod's log and
a run's saved history. Either way the chart is installed by ``helm install --wait`` with
the echo model and the bundled MinIO, everything runs in the cluster, and the saved
history is read by ``kubectl exec`` in the operator's pod, which has the store's URL and
credentials.

- **A cluster of your own** (``ALPINEAGENTS_E2E_KUBECONFIG`` names its kubeconfig): from
  the image ``ALPINEAGENTS_E2E_IMAGE`` (default ``alpineagents:dev``, e.g. loaded with
  ``kind load docker-image``).
- **The bench's real node** (otherwise; :mod:`tests.bench.real_node`): a real kubelet
  v1.35 with containerd on this machine, our image built from the project's Dockerfile
  on a Debian python base, MinIO from the bench's own build. Tests that need more than
  a cluster gives (losing a node, holding a tool call) get the node from
  :attr:`Environment.real_node`.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import yaml

from tests.bench.helm import Helm
from tests.bench.tool_gate import ToolGate

JSON = dict[str, Any]
RELEASE = "e2e"
OPERATOR_VALUES = {"resyncSeconds": 5, "replicas": 1}
"""The operator's chart values in the e2e release. One replica: these tests read its log
and metrics from its pod, and a standby has neither (failover is
tests/operator/test_leader_election.py's)."""
DEADLINE = 120.0
# What a run's answer starts with when its pod was stopped gracefully in a tool call. The
# runner saves the call as ``aborted`` on SIGTERM; but the operator does not wait for the
# old container to end (a fencing store decides who writes), so when its claim for the
# replacement reaches the store first that save is refused and the new pod closes the call
# ``unknown``. Either way the call is closed once and not run again.
STANDBYS_WAITING = "alpineagents.dev/standby=true"
"""Label selector of the warm pool's waiting standbys."""
CLOSED_ON_STOP = ("shell failed: (aborted", "shell failed: (unknown")
"""Seconds any one awaited condition may take: a safety net, not a measurement."""


class Environment:
    """What a test of the installed chart works with (see the module docstring)."""

    def __init__(
        self,
        kubeconfig: Path,
        kubectl_path: Path,
        namespace: str,
        real_node: Any = None,
        release: str = RELEASE,
    ) -> None:
        from kubernetes import config

        self.kubeconfig = kubeconfig
        self.kubectl_path = kubectl_path
        self.namespace = namespace
        self.operator = f"{release}-alpineagents-operator"
        """The operator's Deployment."""
        self.real_node = real_node
        """The bench's :class:`~tests.bench.real_node.RealCluster`, or None on a cluster of
        your own."""
        self.values: dict[str, Any] = {}
        """The chart values the release was installed with."""
        self.api_client: Any = config.new_client_from_config(config_file=str(kubeconfig))

    def close(self) -> None:
        self.api_client.close()

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None, timeout: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        """kubectl in the release namespace; raises on failure when ``check``."""
        command = [
            str(self.kubectl_path),
            f"--kubeconfig={self.kubeconfig}",
            f"--namespace={self.namespace}",
            *args,
        ]
        result = subprocess.run(
            command, input=input, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"`kubectl {' '.join(args)}` exited {result.returncode}:\n"
                f"{result.stdout}{result.stderr}"
            )
        return result

    def logs(self, pod: str) -> str:
        """The agent container's log so far ("" before it started)."""
        raise NotImplementedError

    def history(self, state_id: str) -> list[JSON] | None:
        """The saved entries of a State as the store holds them, or None if there is none."""
        raise NotImplementedError

    def operator_log(self) -> str:
        """The operator's log so far."""
        raise NotImplementedError

    def operator_calls(self) -> list[JSON] | None:
        """The API requests of the operator's ServiceAccount so far, as the API server's
        audit events (metadata only), or None where that log cannot be read (a cluster of
        your own; the bench's API server keeps one)."""
        if self.real_node is None:
            return None
        deployment = json.loads(
            self.kubectl("get", "deployment", self.operator, "-o", "json").stdout
        )
        account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
        events: list[JSON] = self.real_node.plane.audit_events(
            f"system:serviceaccount:{self.namespace}:{account}"
        )
        return events

    def diagnostics(self) -> str:
        """What to show when a test fails: the end of the operator's log."""
        tail = "\n".join(self.operator_log().splitlines()[-80:])
        return f"operator log (last lines):\n{tail}"


# --------------------------------------------------------------------------- a real cluster

_READ_HISTORY = """
import json, os, sys
from alpineagents import open_store
record = open_store(os.environ["ALPINEAGENTS_STORE"]).read(sys.argv[1])
print(json.dumps(None if record is None else record.entries))
"""


class ClusterEnvironment(Environment):
    """The chart on the cluster a kubeconfig points to (see the module docstring)."""

    def logs(self, pod: str) -> str:
        result = self.kubectl("logs", pod, "-c", "agent", check=False)
        return result.stdout if result.returncode == 0 else ""

    def history(self, state_id: str) -> list[JSON] | None:
        result = self.kubectl(
            "exec",
            f"deployment/{self.operator}",
            "-c",
            "operator",
            "--",
            "python",
            "-c",
            _READ_HISTORY,
            state_id,
        )
        entries: list[JSON] | None = json.loads(result.stdout.strip().splitlines()[-1])
        return entries

    def operator_log(self) -> str:
        result = self.kubectl("logs", f"deployment/{self.operator}", "-c", "operator", check=False)
        return result.stdout + result.stderr


def image_values(image: str) -> dict[str, Any]:
    """Chart values for a cluster of your own: our image, the echo model, the bundled
    MinIO on an emptyDir."""
    repository, _, tag = image.rpartition(":")
    return {
        "image": {"repository": repository, "tag": tag},
        "echoModel": {"enabled": True},
        "minio": {"persistence": {"enabled": False}},
    }


@contextlib.contextmanager
def cluster_environment(
    kubeconfig: Path,
    helm: Helm,
    values: Mapping[str, Any],
    kubectl: Path | None = None,
    real_node: Any = None,
) -> Iterator[ClusterEnvironment]:
    """Install the chart with ``values`` into a fresh namespace and wait for it."""
    if kubectl is None:
        found = shutil.which("kubectl")
        if found is None:
            from tests.bench.testbin import binary_path

            found = str(binary_path("kubectl"))
        kubectl = Path(found)
    namespace = f"e2e-{uuid.uuid4().hex[:6]}"
    with ExitStack() as stack:
        cluster = ClusterEnvironment(kubeconfig, kubectl, namespace, real_node)
        cluster.values = dict(values)
        stack.callback(cluster.close)
        admin = [str(kubectl), f"--kubeconfig={kubeconfig}"]
        subprocess.run([*admin, "create", "namespace", namespace], check=True)
        stack.callback(
            subprocess.run,
            [*admin, "delete", "namespace", namespace, "--wait=false"],
            check=False,
        )
        helm.install(
            RELEASE,
            namespace,
            kubeconfig,
            release_values(values),
            "--wait",
            "--timeout=5m",
        )
        stack.callback(helm.uninstall, RELEASE, namespace, kubeconfig)
        stack.callback(_delete_runs, cluster)
        wait_until_operator_watches(cluster)
        yield cluster


def release_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """The values the release is installed with: ``values`` and the e2e operator's."""
    return {**values, "operator": OPERATOR_VALUES}


def upgrade_release(env: Environment, helm: Helm, values: Mapping[str, Any]) -> None:
    """``helm upgrade`` the release to what it was installed with plus ``values`` (which
    change the operator's pod), and wait until the new operator is the only one and
    handles AgentRuns."""
    selector = "app.kubernetes.io/component=operator"
    before = env.kubectl("get", "pods", "-l", selector, "-o", "name").stdout.split()
    helm.upgrade(
        RELEASE,
        env.namespace,
        env.kubeconfig,
        release_values({**env.values, **values}),
        "--wait",
        "--timeout=5m",
    )
    if before:
        # An old operator still terminating could lead a little longer and start pods with
        # the old settings: it goes first.
        env.kubectl("wait", "--for=delete", *before, "--timeout=180s", timeout=200)
    wait_until_operator_watches(env)


_HANDLED = "kopf.alpineagents.dev/last-handled-configuration"


def wait_until_operator_watches(env: Environment) -> None:
    """Wait until the operator handles AgentRuns from its watch, not only its resync loop.

    A suspended AgentRun (it starts no pod) is created; kopf marks an object it handled
    from a watch event with its last-handled annotation. Until then, handlers that need
    the watch (the finalizer of ``onDelete: Delete``) would not run yet.
    """
    name = f"operator-ready-{uuid.uuid4().hex[:6]}"
    body = {
        "apiVersion": "alpineagents.dev/v1",
        "kind": "AgentRun",
        "metadata": {"name": name},
        "spec": {"model": "claude-sonnet-5", "prompt": "(readiness check)", "suspend": True},
    }
    env.kubectl("apply", "-f", "-", input=yaml.safe_dump(body))
    try:
        wait_for_run(
            env,
            name,
            lambda run: _HANDLED in ((run or {}).get("metadata", {}).get("annotations") or {}),
            "handled by the operator's watch",
        )
    finally:
        env.kubectl("delete", "agentrun", name, "--wait=false", check=False)


def _delete_runs(env: Environment) -> None:
    env.kubectl("delete", "agentruns", "--all", "--timeout=60s", check=False)


# --------------------------------------------------------------------------- runs

# Long enough to be interrupted on purpose; never waited out by a passing test.
SLOW_STEP = 'use shell {"command": "sleep 60; echo finished"}'


def apply_run(where: Environment, name: str, prompt: str, **spec: Any) -> None:
    """``kubectl apply`` an AgentRun with the shell tool and JSON progress logs (``spec``
    adds fields; its ``env`` adds variables)."""
    env = [{"name": "ALPINEAGENTS_LOG_FORMAT", "value": "json"}, *spec.pop("env", [])]
    body = {
        "apiVersion": "alpineagents.dev/v1",
        "kind": "AgentRun",
        "metadata": {"name": name},
        "spec": {
            "model": "claude-sonnet-5",
            "prompt": prompt,
            "tools": ["shell"],
            "maxTurns": 5,
            "restartPolicy": {"initialBackoffSeconds": 0},
            "env": env,
            **spec,
        },
    }
    where.kubectl("apply", "-f", "-", input=yaml.safe_dump(body))


def status(run: JSON | None) -> JSON:
    return dict((run or {}).get("status") or {})


def in_phase(phase: str) -> Any:
    return lambda run: status(run).get("phase") == phase


# --------------------------------------------------------------------------- waiting

_AGENTRUNS = ("alpineagents.dev", "v1")


def wait_for_run(
    env: Environment,
    name: str,
    until: Callable[[JSON | None], bool],
    what: str,
    timeout: float = DEADLINE,
) -> JSON | None:
    """Watch the AgentRun until ``until(run)`` holds (``run`` is None while it does not
    exist); fails with its status and the operator's log after ``timeout`` seconds."""
    from kubernetes import client, watch

    custom = client.CustomObjectsApi(env.api_client)
    deadline = time.monotonic() + timeout
    last: JSON | None = None
    while True:
        listing = custom.list_namespaced_custom_object(
            *_AGENTRUNS, env.namespace, "agentruns", field_selector=f"metadata.name={name}"
        )
        items = listing.get("items") or []
        last = items[0] if items else None
        if until(last):
            return last
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            status = json.dumps((last or {}).get("status"), indent=2)
            raise AssertionError(
                f"AgentRun {name} never became {what}; status: {status}\n{env.diagnostics()}"
            )
        stream = watch.Watch().stream(
            custom.list_namespaced_custom_object,
            *_AGENTRUNS,
            env.namespace,
            "agentruns",
            field_selector=f"metadata.name={name}",
            resource_version=listing["metadata"]["resourceVersion"],
            timeout_seconds=max(1, int(remaining)),
        )
        for event in stream:
            if event["type"] in ("ERROR", "BOOKMARK"):
                break
            last = None if event["type"] == "DELETED" else event["object"]
            if until(last):
                return last


def wait_for_pods(
    env: Environment, selector: str, until: Callable[[list[Any]], bool], what: str
) -> list[Any]:
    """Watch the pods of ``selector`` until ``until(pods)`` holds; fails after DEADLINE
    seconds with the pods as they were."""
    from kubernetes import client, watch

    core = client.CoreV1Api(env.api_client)
    deadline = time.monotonic() + DEADLINE
    while True:
        listing = core.list_namespaced_pod(env.namespace, label_selector=selector)
        pods = {p.metadata.name: p for p in listing.items}
        if until(list(pods.values())):
            return list(pods.values())
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"pods {selector} never {what}: {sorted(pods)}")
        stream = watch.Watch().stream(
            core.list_namespaced_pod,
            env.namespace,
            label_selector=selector,
            resource_version=listing.metadata.resource_version,
            timeout_seconds=max(1, int(remaining)),
        )
        for event in stream:
            if event["type"] in ("ERROR", "BOOKMARK"):
                break
            pod = event["object"]
            if event["type"] == "DELETED":
                pods.pop(pod.metadata.name, None)
            else:
                pods[pod.metadata.name] = pod
            if until(list(pods.values())):
                return list(pods.values())


def wait_for_event(
    env: Environment, about: str, reason: str, saying: str, timeout: float = DEADLINE
) -> JSON:
    """Watch the Events about the object ``about`` until one of ``reason`` whose message
    holds ``saying`` is there; fails after ``timeout`` seconds with the operator's log."""
    from kubernetes import client, watch

    core = client.CoreV1Api(env.api_client)
    selector = f"involvedObject.name={about},reason={reason}"
    deadline = time.monotonic() + timeout
    while True:
        listing = core.list_namespaced_event(env.namespace, field_selector=selector)
        for event in listing.items:
            if saying in (event.message or ""):
                return dict(env.api_client.sanitize_for_serialization(event))
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            told = [event.message for event in listing.items]
            raise AssertionError(
                f"no Event {reason} about {about} saying {saying!r} (there are: {told})\n"
                f"{env.diagnostics()}"
            )
        stream = watch.Watch().stream(
            core.list_namespaced_event,
            env.namespace,
            field_selector=selector,
            resource_version=listing.metadata.resource_version,
            timeout_seconds=max(1, int(remaining)),
        )
        for change in stream:
            if change["type"] in ("ERROR", "BOOKMARK"):
                break
            if saying in (change["object"].message or ""):
                return dict(env.api_client.sanitize_for_serialization(change["object"]))


def wait_phase(env: Environment, name: str, phase: str, timeout: float = 300.0) -> JSON:
    """The run's status once it is in ``phase``."""
    return status(wait_for_run(env, name, in_phase(phase), phase, timeout))


def ended(env: Environment, name: str) -> JSON:
    """The status once the run has ended, Succeeded or Failed."""
    run = wait_for_run(
        env,
        name,
        lambda r: status(r).get("phase") in ("Succeeded", "Failed"),
        "ended (Succeeded or Failed)",
        300,
    )
    return status(run)


def run_pods(env: Environment, name: str) -> list[JSON]:
    """The pods of the run ``name``, live or not."""
    listing = env.kubectl("get", "pods", "-l", f"alpineagents.dev/run={name}", "-o", "json")
    return list(json.loads(listing.stdout)["items"])


def gated(gate: ToolGate, step: str, then: str = "") -> str:
    """A prompt whose one tool call is the gated shell command ``step``."""
    command = gate.command(step, then)
    return "Do the job.\nuse shell " + json.dumps({"command": command, "timeout": 1800})


def secret_data(env: Environment, name: str) -> dict[str, str]:
    """The decoded data of the Secret ``name`` in the chart's namespace."""
    body = json.loads(env.kubectl("get", "secret", name, "-o", "json").stdout)
    return {k: base64.b64decode(v).decode() for k, v in (body.get("data") or {}).items()}


def wait_for_log(
    env: Environment, pod: str, until: Callable[[list[JSON]], bool], what: str
) -> None:
    """Poll the pod's JSON log lines until ``until(lines)`` holds; fails at the deadline."""
    deadline = time.monotonic() + DEADLINE
    while True:
        lines = []
        for line in env.logs(pod).splitlines():
            with contextlib.suppress(ValueError):
                parsed = json.loads(line)
                if isinstance(parsed, dict):
                    lines.append(parsed)
        if until(lines):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"pod {pod} never logged {what}; log:\n{env.logs(pod)}")
        time.sleep(0.1)  # polling: a log has no change event to await


def wait_until_tool_runs(env: Environment, name: str) -> JSON:
    """Wait for the run's pod to have saved the model's tool call (the shell now runs)."""
    run = wait_for_run(env, name, lambda r: bool(status(r).get("pod")), "given a pod")
    pod = status(run)["pod"]
    wait_for_log(
        env,
        pod,
        lambda lines: any(line.get("kind") == "model_reply" for line in lines),
        "a saved model reply",
    )
    assert run is not None
    return run


def e2e_kubeconfig() -> Path | None:
    """The real cluster's kubeconfig from ``ALPINEAGENTS_E2E_KUBECONFIG``, if set."""
    value = os.environ.get("ALPINEAGENTS_E2E_KUBECONFIG", "").strip()
    return Path(value).expanduser() if value else None
