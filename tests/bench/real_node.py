"""A real Kubernetes node for tests: the chart, our image and the operator's pods on a real
kubelet (v1.35) with containerd and runc, on this machine.

Fixture:

- ``real_node`` (session): a :class:`RealCluster`: etcd + kube-apiserver (the bench's
  control plane, listening on the node's bridge so pods reach it through the
  ``kubernetes`` Service), kube-controller-manager (all default controllers),
  kube-scheduler, kube-proxy (iptables), dnsmasq answering Service names, a NetworkPolicy
  agent (:mod:`tests.bench.policy_agent`: the chart's policies are enforced), and node
  ``node-0`` (:class:`~tests.bench.kubelet_node.KubeletNode`: containerd + kubelet) with
  the bench's images loaded (:mod:`tests.bench.images`: ours built from the project's
  Dockerfile on a Debian python base, a pause image, MinIO). :meth:`RealCluster.add_node`
  brings up a second node, ``node-1``, for tests that lose one.

Pod and Service addresses exist only on this machine's bridges (see
:mod:`tests.bench.node_network`); nothing a pod sends leaves the machine. Everything the
fixture starts it stops by pid, and it removes its bridges, firewall rules, mounts and
cgroups and gives back the kernel settings it changed. It needs root, Linux with cgroups,
and Debian's packages (``python -m tests.bench.images`` installs them); without them the
tests that use it skip, or fail under ``ALPINEAGENTS_REQUIRE_INFRA=1``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.bench.control_plane import (
    ControlPlane,
    PlaneOptions,
    healthz_ok,
    start_control_plane,
    start_controller_manager,
)
from tests.bench.host_packages import missing_packages
from tests.bench.images import Image, ensure_images
from tests.bench.infra import free_port, missing
from tests.bench.kubelet_node import KubeletNode
from tests.bench.node_network import (
    CLUSTER_CIDR,
    TEST_SERVERS_ADDRESS,
    HostNetwork,
    NodeSubnet,
    ServiceNames,
)
from tests.bench.policy_agent import USER as POLICY_AGENT_USER
from tests.bench.policy_agent import PolicyAgent
from tests.bench.server_process import ServerFailed, ServerProcess
from tests.bench.testbin import ProvisioningError, binary_path

NODE_NAMES = ("node-0", "node-1", "node-2")
_HOW_TO_FIX = (
    "run `python -m tests.bench.testbin` and `python -m tests.bench.images` as root on a "
    "Debian machine (scripts/test does both)"
)


@dataclass
class RealCluster:
    """The running cluster (see the module docstring) and the ways a test uses it."""

    plane: ControlPlane
    images: dict[str, Image]
    workdir: Path
    nodes: dict[str, KubeletNode] = field(default_factory=dict)
    policy_agent: PolicyAgent | None = None
    """What enforces NetworkPolicy for the pods of ``node-0``."""

    @property
    def kubeconfig(self) -> Path:
        """The admin's kubeconfig (client certificate in system:masters)."""
        return self.plane.kubeconfig

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None, timeout: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        """kubectl as the admin; raises on failure when ``check``."""
        return self.plane.kubectl(*args, check=check, input=input, timeout=timeout)

    def chart_values(self) -> dict[str, Any]:
        """Values that point the chart at the images loaded on the nodes, with the echo
        model and the bundled MinIO (on an emptyDir: there is no volume provisioner).

        Its NetworkPolicy lets run pods reach DNS where the bench answers it (dnsmasq on
        the node's address, port 53 only) and the tests' own servers
        (:data:`~tests.bench.node_network.TEST_SERVERS_ADDRESS`); the node itself stays
        closed to them."""
        ours, minio = self.images["alpineagents"], self.images["minio"]
        return {
            "networkPolicy": {
                "dnsTo": [{"ipBlock": {"cidr": f"{NodeSubnet(0).gateway}/32"}}],
                "extraEgress": [{"to": [{"ipBlock": {"cidr": f"{TEST_SERVERS_ADDRESS}/32"}}]}],
            },
            "image": {"repository": ours.repository, "tag": ours.tag, "pullPolicy": "Never"},
            "echoModel": {"enabled": True},
            "minio": {
                "image": {"repository": minio.repository, "tag": minio.tag, "pullPolicy": "Never"},
                "persistence": {"enabled": False},
            },
        }

    def add_node(self, name: str = NODE_NAMES[1]) -> KubeletNode:
        """Bring up worker ``name`` (``node-1`` or ``node-2``, with our image and the pause
        image) and wait until it is Ready."""
        if name in self.nodes:
            return self.nodes[name]
        node = _make_node(self.plane, NODE_NAMES.index(name), self.workdir)
        self.nodes[name] = node
        node.start([self.images["pause"], self.images["alpineagents"]], self.nodes["node-0"])
        return node

    def load_image(self, image: Image) -> None:
        """Import ``image`` into every node's containerd (a new tag to upgrade to)."""
        for node in self.nodes.values():
            node.load_images([image])

    def remove_node(self, name: str) -> None:
        """Stop node ``name`` for good: its pods are deleted, then it stops and its Node
        object goes (a node that was powered off is cleaned up the same way)."""
        node = self.nodes.pop(name)
        _drain(self.plane, [node])
        node.stop()
        self.kubectl("delete", "node", name, "--ignore-not-found", "--wait=false", check=False)

    def stop_nodes(self) -> None:
        """Drain every node (its kubelet tears its pods down through CRI), then stop it."""
        nodes = list(self.nodes.values())
        _drain(self.plane, nodes)
        for node in nodes:
            node.stop()
        self.nodes.clear()

    def wait_for_default_service_account(self, namespace: str) -> None:
        """Wait until the controller-manager made ``default`` in a new namespace (pods
        are refused until then)."""
        deadline = time.monotonic() + 60
        path = f"/api/v1/namespaces/{namespace}/serviceaccounts/default"
        while self.plane.get(path)[0] != 200:
            if time.monotonic() > deadline:
                raise AssertionError(f"no ServiceAccount default in {namespace} after 60s")
            time.sleep(0.1)


def _make_node(plane: ControlPlane, index: int, workdir: Path) -> KubeletNode:
    name = NODE_NAMES[index]
    return KubeletNode(
        name,
        NodeSubnet(index),
        plane,
        plane.client_kubeconfig(f"kubelet-{name}"),
        cluster_dns=NodeSubnet(0).gateway,
        workdir=workdir / name,
    )


def _drain(plane: ControlPlane, nodes: list[KubeletNode], timeout: float = 90.0) -> None:
    """Cordon ``nodes``, delete every pod on them, and wait until their containers are gone,
    so each kubelet tears its sandboxes down (network, mounts) through CRI."""
    for node in nodes:
        plane.kubectl("cordon", node.name, check=False)
        plane.kubectl(
            "delete",
            "pods",
            "--all-namespaces",
            f"--field-selector=spec.nodeName={node.name}",
            "--grace-period=1",
            "--wait=false",
            check=False,
        )
    deadline = time.monotonic() + timeout
    for node in nodes:
        while node.kubelet.running and node.containerd.running and node.running_tasks():
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)


def _kube_proxy(plane: ControlPlane, workdir: Path) -> ServerProcess:
    healthz = free_port()
    config = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(plane.client_kubeconfig("kube-proxy"))},
        "mode": "iptables",
        "clusterCIDR": CLUSTER_CIDR,
        "hostnameOverride": NODE_NAMES[0],
        "healthzBindAddress": f"127.0.0.1:{healthz}",
        "metricsBindAddress": f"127.0.0.1:{free_port()}",
        "nodePortAddresses": [CLUSTER_CIDR],
        # Leave the machine's conntrack and localnet settings as they are.
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
        "iptables": {"localhostNodePorts": False},
    }
    (workdir / "kube-proxy.yaml").write_text(json.dumps(config, indent=2))
    process = ServerProcess(
        "kube-proxy",
        [str(binary_path("kube-proxy")), f"--config={workdir / 'kube-proxy.yaml'}", "--v=1"],
        workdir / "kube-proxy.log",
    )
    process.start()

    def healthy() -> bool:
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{healthz}/healthz", timeout=2) as r:
                return int(r.status) == 200
        except OSError:
            return False

    try:
        process.wait_until(healthy, "healthy (/healthz)", timeout=60)
    except ServerFailed:
        _stop_kube_proxy(process)
        raise
    return process


def _stop_kube_proxy(process: ServerProcess) -> None:
    process.stop()
    # Its iptables chains outlive it; --cleanup removes them.
    subprocess.run(
        [str(binary_path("kube-proxy")), "--cleanup"], capture_output=True, timeout=120, check=False
    )


def _kube_scheduler(plane: ControlPlane, workdir: Path) -> ServerProcess:
    port = free_port()
    process = ServerProcess(
        "kube-scheduler",
        [
            str(binary_path("kube-scheduler")),
            f"--kubeconfig={plane.client_kubeconfig('kube-scheduler')}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            "--v=1",
        ],
        workdir / "kube-scheduler.log",
    )
    process.start()
    try:
        process.wait_until(lambda: healthz_ok(port), "healthy (/healthz)", timeout=60)
    except ServerFailed:
        process.stop()
        raise
    return process


def _plane_options(pki: Path) -> PlaneOptions:
    clients: dict[str, tuple[str, str | None]] = {
        "kube-scheduler": ("system:kube-scheduler", None),
        "kube-proxy": ("system:kube-proxy", None),
        "kube-router": (POLICY_AGENT_USER, None),
        "apiserver-kubelet-client": ("kube-apiserver-kubelet-client", "system:masters"),
    }
    for name in NODE_NAMES:
        clients[f"kubelet-{name}"] = (f"system:node:{name}", "system:nodes")
    return PlaneOptions(
        address=NodeSubnet(0).gateway,
        clients=clients,
        service_accounts=True,
        authorization="Node,RBAC",
        apiserver_args=(
            "--enable-admission-plugins=NodeRestriction",
            f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
            "--kubelet-preferred-address-types=InternalIP",
        ),
    )


def _check_machine() -> dict[str, Image]:
    """The images, once everything the node needs is known to be here."""
    if os.geteuid() != 0:
        missing("the real node", f"it needs root (containerd, kubelet, iptables): {_HOW_TO_FIX}")
    try:
        for name in (
            "kubelet",
            "kube-scheduler",
            "kube-proxy",
            "kube-controller-manager",
            "kube-router",
        ):
            binary_path(name)
        absent = missing_packages()
    except ProvisioningError as error:
        missing("the real node's binaries", f"{_HOW_TO_FIX}: {error}")
    if absent:
        missing(f"the real node's packages ({', '.join(absent)})", _HOW_TO_FIX)
    try:
        return ensure_images()
    except ProvisioningError as error:
        missing("the real node's images", f"{_HOW_TO_FIX}: {error}")


def start_cluster(stack: ExitStack, workdir: Path, images: dict[str, Image]) -> RealCluster:
    """Start the whole cluster (see the module docstring); ``stack`` stops it."""
    stack.enter_context(_machine_lock())
    network = HostNetwork()
    stack.callback(network.restore)
    network.apply()
    first = NodeSubnet(0)
    stack.callback(first.delete)
    first.create()  # the apiserver listens on it

    pki = workdir / "plane" / "pki"  # where start_control_plane writes the certificates
    plane = start_control_plane(stack, workdir / "plane", _plane_options(pki))
    controllers = start_controller_manager(
        plane,
        "*",
        f"--root-ca-file={plane.ca_file}",
        f"--service-account-private-key-file={pki / 'sa.key'}",
        f"--cluster-cidr={CLUSTER_CIDR}",
    )
    stack.callback(controllers.stop)
    scheduler = _kube_scheduler(plane, workdir)
    stack.callback(scheduler.stop)

    def list_services() -> list[dict[str, object]]:
        status, body = plane.get("/api/v1/services")
        if status != 200:
            raise RuntimeError(f"listing Services: HTTP {status}")
        items: list[dict[str, object]] = json.loads(body)["items"]
        return items

    workdir.chmod(0o711)  # dnsmasq, no longer root, reads its hosts file below it
    names = ServiceNames(first.gateway, workdir, list_services)
    stack.callback(names.stop)
    names.start()

    cluster = RealCluster(plane, images, workdir)
    node = _make_node(plane, 0, workdir)
    cluster.nodes[node.name] = node
    stack.callback(cluster.stop_nodes)
    node.start([images["pause"], images["alpineagents"], images["minio"]])
    # After the node: kube-proxy takes its address from the Node (healthy only then).
    proxy = _kube_proxy(plane, workdir)
    stack.callback(_stop_kube_proxy, proxy)
    # After the node too: the agent guards the pods whose host address is the Node's.
    agent = PolicyAgent(plane, plane.client_kubeconfig("kube-router"), node.name, workdir)
    agent.start()
    stack.callback(agent.stop)
    cluster.policy_agent = agent
    cluster.wait_for_default_service_account("default")
    return cluster


@contextlib.contextmanager
def _machine_lock() -> Iterator[None]:
    """One real node per machine at a time: its bridges, firewall chain, cgroups and image
    store have fixed names. A second test session waits here for the first one."""
    with open("/run/alpineagents-real-node.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def real_node() -> Iterator[RealCluster]:
    """The real cluster with node ``node-0`` Ready and our images on it (see the module
    docstring); torn down at the end of the session."""
    images = _check_machine()
    workdir = Path(tempfile.mkdtemp(prefix="alpineagents-real-node-"))
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        try:
            cluster = start_cluster(stack, workdir, images)
        except (ServerFailed, ProvisioningError, RuntimeError) as error:
            pytest.fail(f"the real node did not start (logs in {workdir}): {error}")
        yield cluster
