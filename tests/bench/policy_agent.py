"""The real node's NetworkPolicy agent: kube-router's firewall, nothing else of it.

Every pod the kubelet starts is under the NetworkPolicies that select it, as on a cluster
whose network plugin enforces them: kube-router (``--run-firewall`` only; no routing, no
service proxy, no CNI) turns each policy into iptables chains and ipsets on this machine.
kube-network-policies, which kind's networking uses, cannot run here: it queues packets
with nftables' ``queue`` expression and this machine's kernel is built without it
(``CONFIG_NFT_QUEUE`` is off).

One agent serves the machine: both nodes' bridges live in this one network namespace, and
two agents would each delete the other's chains as stale. It enforces for the pods of
``node-0``, where every test's runs are scheduled (kube-router picks the pods whose host
address is its node's); pods on ``node-1`` (only the node-loss tests bring it up) are not
under policy.

The agent reads pods, namespaces, policies, nodes and services with its own client
identity (``system:kube-router``) and the read-only ClusterRole below. :meth:`stop` stops
it by pid, then removes its chains (``KUBE-ROUTER-*``, ``KUBE-POD-FW-*``, ``KUBE-NWPLCY-*``)
and its ipsets; kube-router's own ``--cleanup-config`` is not used, since it also flushes
IPVS and routing state that the machine may hold for others.
"""

from __future__ import annotations

import subprocess
import urllib.request
from pathlib import Path

from tests.bench.control_plane import ControlPlane
from tests.bench.infra import free_port
from tests.bench.node_network import SERVICE_CIDR, kube_chains, remove_chains
from tests.bench.server_process import ServerFailed, ServerProcess
from tests.bench.testbin import binary_path

USER = "system:kube-router"
"""The agent's client identity (its certificate's common name)."""

# The agent's chains: its top-level ones, one per pod it guards, one per policy.
_CHAIN_PREFIXES = ("KUBE-ROUTER-", "KUBE-POD-FW-", "KUBE-NWPLCY-")
_RBAC = f"""
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: bench-policy-agent
rules:
  - apiGroups: [""]
    resources: [pods, namespaces, nodes, services, endpoints]
    verbs: [get, list, watch]
  - apiGroups: [networking.k8s.io]
    resources: [networkpolicies]
    verbs: [get, list, watch]
  - apiGroups: [discovery.k8s.io]
    resources: [endpointslices]
    verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: bench-policy-agent
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: bench-policy-agent
subjects:
  - apiGroup: rbac.authorization.k8s.io
    kind: User
    name: {USER}
"""


def _ipsets() -> set[str]:
    listing = subprocess.run(
        ["ipset", "list", "-name"], capture_output=True, text=True, check=False
    ).stdout
    return {name for name in listing.split() if name}


def _rules() -> str:
    return subprocess.run(
        ["iptables-save", "-t", "filter"], capture_output=True, text=True, check=False
    ).stdout


class PolicyAgent:
    """kube-router's firewall for node ``node_name`` (see the module docstring)."""

    def __init__(self, plane: ControlPlane, kubeconfig: Path, node_name: str, workdir: Path):
        self._plane = plane
        self._health_port = free_port()
        self._chains_before: set[tuple[str, str, str]] = set()
        self._ipsets_before: set[str] = set()
        self.process = ServerProcess(
            "kube-router",
            [
                str(binary_path("kube-router")),
                f"--kubeconfig={kubeconfig}",
                f"--hostname-override={node_name}",
                "--run-firewall=true",
                "--run-router=false",
                "--run-service-proxy=false",
                "--enable-cni=false",
                "--enable-ipv6=false",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                f"--health-port={self._health_port}",
                "--metrics-port=0",
                "--v=1",
            ],
            workdir / "kube-router.log",
        )

    def start(self) -> None:
        """Grant its ClusterRole, start it, and wait until it reports healthy."""
        self._plane.kubectl("apply", "-f", "-", input=_RBAC)
        self._chains_before = kube_chains()
        self._ipsets_before = _ipsets()
        self.process.start()
        try:
            self.process.wait_until(self._healthy, "healthy (/healthz)", timeout=120)
        except ServerFailed:
            self.stop()
            raise

    def _healthy(self) -> bool:
        url = f"http://127.0.0.1:{self._health_port}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return int(response.status) == 200
        except OSError:
            return False

    def guards(self, namespace: str, pod: str) -> bool:
        """Whether the agent's firewall chain for this pod is in place: its last rule, which
        rejects what no policy allowed, names the pod in its comment."""
        rejects = f"rule to REJECT traffic destined for POD name:{pod} namespace: {namespace}"
        return rejects in _rules()

    def stop(self) -> None:
        """Stop it and remove the chains and ipsets it made."""
        self.process.stop()
        mine = {
            chain
            for chain in kube_chains() - self._chains_before
            if chain[2].startswith(_CHAIN_PREFIXES)
        }
        remove_chains(mine)
        for name in sorted(_ipsets() - self._ipsets_before):
            subprocess.run(["ipset", "destroy", name], capture_output=True, check=False)
