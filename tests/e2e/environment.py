"""Where the e2e suite runs: a real cluster, or the test bench standing in for one.

Both give a test the same few things (:class:`Environment`): ``kubectl`` against the
cluster, the namespace the chart was installed into, an API client, a run pod's log and
a run's saved history.

- **A real cluster** (``ALPINEAGENTS_E2E_KUBECONFIG`` names its kubeconfig): the chart is
  installed by ``helm install --wait`` with the echo model and the bundled MinIO, from the
  image ``ALPINEAGENTS_E2E_IMAGE`` (default ``alpineagents:dev``, e.g. loaded with ``kind
  load docker-image``). Everything runs in the cluster; the saved history is read by
  ``kubectl exec`` in the operator's pod, which has the store's URL and credentials.
- **The test bench** (otherwise): the chart is installed by ``helm install`` into the
  bench's kube-apiserver, pointed at the bench's MinIO and a scripted echo model on
  loopback. No controller runs the Deployment, so the operator runs as a local process
  with the environment the Deployment gives its container (:func:`container_environment`
  resolves the ConfigMap, the Secrets and the fieldRefs from the installed objects) and
  the credentials of the chart's own ServiceAccount (a token from the TokenRequest API),
  so the chart's RBAC is what it works with. The only local changes are the listening
  ports (free loopback ports instead of the pod's 8080/9090) and ``KUBECONFIG``. The
  stand-in kubelet (:class:`tests.bench.pod_runner.PodRunner`) runs the agent pods'
  ``python -m alpineagents run`` as local processes.
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

from alpineagents import open_store
from tests.bench.helm import Helm
from tests.bench.pod_runner import expand

JSON = dict[str, Any]
RELEASE = "e2e"
OPERATOR = f"{RELEASE}-alpineagents-operator"
DEADLINE = 120.0
"""Seconds any one awaited condition may take: a safety net, not a measurement."""


class Environment:
    """What a test of the installed chart works with (see the module docstring)."""

    def __init__(self, kubeconfig: Path, kubectl_path: Path, namespace: str) -> None:
        from kubernetes import config

        self.kubeconfig = kubeconfig
        self.kubectl_path = kubectl_path
        self.namespace = namespace
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

    def diagnostics(self) -> str:
        """What to show when a test fails: the end of the operator's log."""
        tail = "\n".join(self.operator_log().splitlines()[-80:])
        return f"operator log (last lines):\n{tail}"


# --------------------------------------------------------------------------- the bench


def container_environment(
    pod_spec: Mapping[str, Any],
    container_name: str,
    *,
    config_map: Callable[[str], Mapping[str, str]],
    secret: Callable[[str], Mapping[str, str]],
    fields: Mapping[str, str],
) -> dict[str, str]:
    """The environment the kubelet would give ``container_name`` of ``pod_spec``: its
    ``envFrom`` sources, then ``env`` (values with ``$(VAR)`` expansion, secretKeyRef,
    configMapKeyRef, fieldRef from ``fields``). Raises KeyError for anything missing,
    where the kubelet would refuse to start the container."""
    (container,) = [c for c in pod_spec["containers"] if c["name"] == container_name]
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        if "configMapRef" in source:
            data = config_map(source["configMapRef"]["name"])
        else:
            data = secret(source["secretRef"]["name"])
        env.update({prefix + key: value for key, value in data.items()})
    for item in container.get("env") or []:
        name = item["name"]
        if "value" in item:
            env[name] = expand(item["value"], env)
            continue
        source = item["valueFrom"]
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            env[name] = secret(ref["name"])[ref["key"]]
        elif "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            env[name] = config_map(ref["name"])[ref["key"]]
        elif "fieldRef" in source:
            env[name] = fields[source["fieldRef"]["fieldPath"]]
        else:
            raise KeyError(f"env {name}: unsupported source {sorted(source)}")
    return env


def service_account_kubeconfig(admin_kubeconfig: Path, token: str, path: Path) -> Path:
    """A kubeconfig for the same API server as ``admin_kubeconfig``, as a bearer token."""
    admin = yaml.safe_load(admin_kubeconfig.read_text())
    cluster = admin["clusters"][0]
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [cluster],
                "users": [{"name": "operator", "user": {"token": token}}],
                "contexts": [
                    {
                        "name": "operator",
                        "context": {"cluster": cluster["name"], "user": "operator"},
                    }
                ],
                "current-context": "operator",
            }
        )
    )
    path.chmod(0o600)
    return path


class BenchEnvironment(Environment):
    """The chart on the test bench (see the module docstring)."""

    def __init__(
        self,
        kubeconfig: Path,
        kubectl_path: Path,
        namespace: str,
        runner: Any,
        operator: Any,
        store_url: str,
        store_env: Mapping[str, str],
    ) -> None:
        super().__init__(kubeconfig, kubectl_path, namespace)
        self.runner = runner
        self.operator = operator
        self.store_url = store_url
        self.store_env = dict(store_env)

    def logs(self, pod: str) -> str:
        return str(self.runner.logs(self.namespace, pod))

    def history(self, state_id: str) -> list[JSON] | None:
        record = open_store(self.store_url, env=self.store_env).read(state_id)
        return None if record is None else list(record.entries)

    def operator_log(self) -> str:
        return str(self.operator.log_tail(100_000))


def _secret_data(env: Environment, name: str) -> dict[str, str]:
    body = json.loads(env.kubectl("get", "secret", name, "-o", "json").stdout)
    return {k: base64.b64decode(v).decode() for k, v in (body.get("data") or {}).items()}


def _config_map_data(env: Environment, name: str) -> dict[str, str]:
    body = json.loads(env.kubectl("get", "configmap", name, "-o", "json").stdout)
    return dict(body.get("data") or {})


@contextlib.contextmanager
def bench_environment(
    plane: Any, helm: Helm, minio: Any, model_url: str, workdir: Path
) -> Iterator[BenchEnvironment]:
    """Install the chart on the bench, start the operator and the stand-in kubelet."""
    from tests.bench.operator_process import OperatorProcess
    from tests.bench.pod_runner import PodRunner

    namespace = f"e2e-{uuid.uuid4().hex[:6]}"
    bucket = minio.fresh_bucket()
    store_url = f"s3://{bucket}/runs?endpoint={minio.endpoint}&secure=false"
    values = {
        "image": {"repository": "alpineagents", "tag": "e2e"},
        "minio": {"enabled": False},
        "store": {
            "url": store_url,
            "accessKeyId": minio.access_key,
            "secretAccessKey": minio.secret_key,
        },
        "anthropic": {"apiKey": "bench-key-for-the-echo-model", "baseUrl": model_url},
        "operator": {"resyncSeconds": 5},
    }
    with ExitStack() as stack:
        stack.callback(minio.remove_bucket, bucket)
        plane.apply_crds()
        plane.kubectl("create", "namespace", namespace)
        stack.callback(plane.kubectl, "delete", "namespace", namespace, "--wait=false", check=False)
        helm.install(RELEASE, namespace, plane.kubeconfig, values)
        stack.callback(helm.uninstall, RELEASE, namespace, plane.kubeconfig)
        admin = Environment(plane.kubeconfig, plane.kubectl_path, namespace)
        stack.callback(admin.close)

        deployment = json.loads(admin.kubectl("get", "deployment", OPERATOR, "-o", "json").stdout)
        pod_spec = deployment["spec"]["template"]["spec"]
        (container,) = pod_spec["containers"]
        assert container["command"] == ["python", "-m", "alpineagents_operator"]
        assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
        env = container_environment(
            pod_spec,
            "operator",
            config_map=lambda name: _config_map_data(admin, name),
            secret=lambda name: _secret_data(admin, name),
            fields={"metadata.name": f"{OPERATOR}-local"},
        )
        # The pod's ports become free loopback ports (OperatorProcess picks them).
        for port_setting in ("ALPINEAGENTS_HEALTH_PORT", "ALPINEAGENTS_METRICS_PORT"):
            env.pop(port_setting)

        account = pod_spec["serviceAccountName"]
        token = admin.kubectl("create", "token", account, "--duration=2h").stdout.strip()
        kubeconfig = service_account_kubeconfig(
            plane.kubeconfig, token, workdir / "operator.kubeconfig"
        )
        operator = OperatorProcess(kubeconfig, workdir, env)
        stack.callback(operator.stop)
        operator.start()

        runner = PodRunner(plane.api_client(), node_name=f"node-{namespace}", namespace=namespace)
        stack.callback(runner.stop)
        runner.start()

        bench = BenchEnvironment(
            plane.kubeconfig,
            plane.kubectl_path,
            namespace,
            runner,
            operator,
            store_url,
            {k: env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")},
        )
        stack.callback(bench.close)
        # Runs first, while the operator still runs: their pods stop and finalizers clear.
        stack.callback(_delete_runs, bench)
        wait_until_operator_watches(bench)
        yield bench


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
            f"deployment/{OPERATOR}",
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
        result = self.kubectl("logs", f"deployment/{OPERATOR}", "-c", "operator", check=False)
        return result.stdout + result.stderr


@contextlib.contextmanager
def cluster_environment(kubeconfig: Path, helm: Helm, image: str) -> Iterator[ClusterEnvironment]:
    """Install the chart (echo model, bundled MinIO) into a fresh namespace and wait."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        from tests.bench.testbin import binary_path

        kubectl = str(binary_path("kubectl"))
    namespace = f"e2e-{uuid.uuid4().hex[:6]}"
    repository, _, tag = image.rpartition(":")
    values = {
        "image": {"repository": repository, "tag": tag},
        "echoModel": {"enabled": True},
        "minio": {"persistence": {"enabled": False}},
        "operator": {"resyncSeconds": 5},
    }
    with ExitStack() as stack:
        cluster = ClusterEnvironment(kubeconfig, Path(kubectl), namespace)
        stack.callback(cluster.close)
        subprocess.run(
            [kubectl, f"--kubeconfig={kubeconfig}", "create", "namespace", namespace], check=True
        )
        stack.callback(
            subprocess.run,
            [
                kubectl,
                f"--kubeconfig={kubeconfig}",
                "delete",
                "namespace",
                namespace,
                "--wait=false",
            ],
            check=False,
        )
        helm.install(RELEASE, namespace, kubeconfig, values, "--wait", "--timeout=5m")
        stack.callback(helm.uninstall, RELEASE, namespace, kubeconfig)
        stack.callback(_delete_runs, cluster)
        wait_until_operator_watches(cluster)
        yield cluster


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


# --------------------------------------------------------------------------- waiting

_AGENTRUNS = ("alpineagents.dev", "v1")


def wait_for_run(
    env: Environment, name: str, until: Callable[[JSON | None], bool], what: str
) -> JSON | None:
    """Watch the AgentRun until ``until(run)`` holds (``run`` is None while it does not
    exist); fails with its status and the operator's log at the deadline."""
    from kubernetes import client, watch

    custom = client.CustomObjectsApi(env.api_client)
    deadline = time.monotonic() + DEADLINE
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


def e2e_kubeconfig() -> Path | None:
    """The real cluster's kubeconfig from ``ALPINEAGENTS_E2E_KUBECONFIG``, if set."""
    value = os.environ.get("ALPINEAGENTS_E2E_KUBECONFIG", "").strip()
    return Path(value).expanduser() if value else None
