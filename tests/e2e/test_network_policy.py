"""The chart's NetworkPolicy, enforced on the real node: a run pod reaches DNS, the model
and the store, and nothing else (not another pod, not the API server, not the node).

The bench's policy agent (:mod:`tests.bench.policy_agent`) enforces the policies. Two
probe pods run our image with the run pods' securityContext and try TCP connections with
``python -c`` (no tools added to the image, one attempt per address, only to bridge and
Service addresses): one carries a run pod's labels, so the chart's policy selects it; the
other carries none, and reaching everything but the store (MinIO's own policy admits
only the operator and run pods) shows that each address was really there to be reached,
so what the first one cannot reach is closed by the policy.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import yaml

from tests.e2e.environment import DEADLINE, RELEASE, Environment
from tests.paths import REPO

# One connection attempt per address, all at once; a closed port answers at once (the
# agent rejects), an open one accepts.
_PROBE = """
import json, socket, sys
from concurrent.futures import ThreadPoolExecutor
def probe(target):
    host, port = target
    try:
        socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    except OSError:
        return "unresolved"
    try:
        socket.create_connection((host, port), timeout=10).close()
        return "open"
    except OSError as error:
        return type(error).__name__
targets = json.loads(sys.argv[1])
with ThreadPoolExecutor(len(targets)) as pool:
    print(json.dumps(dict(zip(targets, pool.map(probe, targets.values())))))
"""

_CHART_DEFAULTS = yaml.safe_load((REPO / "charts" / "alpineagents" / "values.yaml").read_text())
_RUN_POD_LABELS = {
    "app.kubernetes.io/name": "alpineagents",
    "app.kubernetes.io/component": "agent-run",
    "app.kubernetes.io/managed-by": "alpineagents-operator",
}


def _probe_pod(env: Environment, name: str, labels: dict[str, str]) -> dict[str, Any]:
    image = env.values["image"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            # The agent guards node-0's pods (a second node may be up for another test).
            "nodeSelector": {"kubernetes.io/hostname": "node-0"},
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 1,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 65532,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "probe",
                    "image": f"{image['repository']}:{image['tag']}",
                    "imagePullPolicy": "Never",
                    "command": ["python", "-c", "import time; time.sleep(600)"],
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }


def _wait(what: str, done: Any) -> Any:
    deadline = time.monotonic() + DEADLINE
    while not (result := done()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} within {DEADLINE:.0f}s")
        time.sleep(0.5)
    return result


def _pod(env: Environment, name: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(env.kubectl("get", "pod", name, "-o", "json").stdout)
    return found


def _reachable(env: Environment, pod: str, targets: dict[str, tuple[str, int]]) -> dict[str, str]:
    result = env.kubectl("exec", pod, "--", "python", "-c", _PROBE, json.dumps(targets))
    reached: dict[str, str] = json.loads(result.stdout.strip().splitlines()[-1])
    return reached


def test_a_run_pod_reaches_dns_the_model_and_the_store_and_nothing_else(
    node_env: Environment,
) -> None:
    env = node_env
    cluster = env.real_node
    agent = cluster.policy_agent
    assert agent is not None, "the real node runs without its NetworkPolicy agent"
    suffix = uuid.uuid4().hex[:6]
    run_pod, plain_pod = f"probe-run-{suffix}", f"probe-plain-{suffix}"
    pods = [_probe_pod(env, run_pod, _RUN_POD_LABELS), _probe_pod(env, plain_pod, {})]
    env.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(pods))
    try:
        for name in (run_pod, plain_pod):
            _wait(
                f"{name} running",
                lambda name=name: _pod(env, name).get("status", {}).get("phase") == "Running",
            )
        _wait(f"{run_pod} under the agent's firewall", lambda: agent.guards(env.namespace, run_pod))
        operator_pod = _wait(
            "the operator's pod address",
            lambda: next(
                (
                    pod["status"].get("podIP")
                    for pod in json.loads(
                        env.kubectl(
                            "get",
                            "pods",
                            "-l",
                            "app.kubernetes.io/component=operator",
                            "-o",
                            "json",
                        ).stdout
                    )["items"]
                    if pod["status"].get("podIP")
                ),
                None,
            ),
        )
        node = cluster.nodes["node-0"]
        apiserver = cluster.plane.server.removeprefix("https://").rsplit(":", 1)
        domain = f"{env.namespace}.svc.cluster.local"
        ports = _CHART_DEFAULTS
        targets = {
            "model": (f"{RELEASE}-alpineagents-echo-model.{domain}", ports["echoModel"]["port"]),
            "store": (f"{RELEASE}-alpineagents-minio.{domain}", ports["minio"]["service"]["port"]),
            "another pod (the operator's)": (operator_pod, ports["operator"]["healthPort"]),
            "the API server's Service": ("kubernetes.default.svc.cluster.local", 443),
            "the API server": (apiserver[0], int(apiserver[1])),
            "the node's kubelet": (node.subnet.gateway, node.kubelet_port),
        }
        assert env.values["echoModel"]["enabled"], "the bench installs the echo model"

        unselected = _reachable(env, plain_pod, targets)
        # Every address is there to be reached (else the probe would prove nothing),
        # except the store, whose own NetworkPolicy takes only the operator and run pods.
        assert unselected == {
            **dict.fromkeys(targets, "open"),
            "store": "ConnectionRefusedError",
        }, unselected
        run = _reachable(env, run_pod, targets)
        assert run == {
            "model": "open",
            "store": "open",
            "another pod (the operator's)": "ConnectionRefusedError",
            "the API server's Service": "ConnectionRefusedError",
            "the API server": "ConnectionRefusedError",
            "the node's kubelet": "ConnectionRefusedError",
        }, run
    finally:
        env.kubectl("delete", "pod", run_pod, plain_pod, "--wait=false", check=False)
