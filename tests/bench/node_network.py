"""The real node's network: one Linux bridge per node, firewall rules that keep pod traffic
on those bridges, and DNS for Service names.

Pod addresses are 10.88.<n>.0/24 on bridge ``aabr<n>`` (gateway 10.88.<n>.1, the node's
own address; tests' own servers listen on :data:`TEST_SERVERS_ADDRESS`); Service
addresses 10.96.0.0/16 exist only as kube-proxy's rules. Forwarding is accepted between
the bench's bridges and dropped to or from anything else, so a pod can reach other pods,
Services and this machine, and nothing outside it (no NAT either), as far as the
NetworkPolicies that select it allow (:mod:`tests.bench.policy_agent` enforces them).

Service names (``<svc>.<ns>.svc.cluster.local``) are answered by a ``dnsmasq`` on the
first bridge from a hosts file that :class:`ServiceNames` rewrites whenever the
Services change; it has no upstream server, so no name outside the cluster resolves.
"""

from __future__ import annotations

import collections
import contextlib
import ipaddress
import json
import shlex
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.bench.server_process import ServerProcess

CLUSTER_CIDR = "10.88.0.0/16"
SERVICE_CIDR = "10.96.0.0/16"
CLUSTER_DOMAIN = "cluster.local"
BRIDGE_PREFIX = "aabr"
TEST_SERVERS_ADDRESS = "10.88.255.1"
"""Where tests' own servers on this machine listen for pods (a model, MCP servers, the
tool gate): an address of the first bridge that is not the node's, so the bench's
NetworkPolicy can let run pods reach these servers and still close the node itself."""
_CHAIN = "ALPINEAGENTS-FORWARD"
_IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
_BRIDGE_NF = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")


class NetworkError(RuntimeError):
    """The machine's network could not be set up for the node; the message says why."""


def _run(*command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise NetworkError(f"`{' '.join(command)}` failed: {result.stderr.strip()}")
    return result


@dataclass(frozen=True)
class NodeSubnet:
    """Node ``index``'s bridge and pod subnet."""

    index: int

    @property
    def bridge(self) -> str:
        return f"{BRIDGE_PREFIX}{self.index}"

    @property
    def subnet(self) -> str:
        return f"10.88.{self.index}.0/24"

    @property
    def gateway(self) -> str:
        """The node's own address on its bridge (kubelet, apiserver and DNS listen here)."""
        return f"10.88.{self.index}.1"

    def create(self) -> None:
        """Create the bridge with the gateway address (kept when it is there already: the
        control plane may be listening on it); the first bridge also gets
        :data:`TEST_SERVERS_ADDRESS`."""
        if _run("ip", "link", "show", self.bridge, check=False).returncode != 0:
            _run("ip", "link", "add", self.bridge, "type", "bridge")
        shown = _run("ip", "-o", "addr", "show", "dev", self.bridge).stdout
        if f" {self.gateway}/24 " not in shown:
            _run("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        if self.index == 0 and f" {TEST_SERVERS_ADDRESS}/32 " not in shown:
            _run("ip", "addr", "add", f"{TEST_SERVERS_ADDRESS}/32", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")

    def delete(self) -> None:
        _run("ip", "link", "delete", self.bridge, "type", "bridge", check=False)

    def cni_config(self, ipam_dir: Path) -> str:
        """The CNI network config (a conflist) for containerd's CRI on this node."""
        return json.dumps(
            {
                "cniVersion": "1.0.0",
                "name": f"alpineagents-{self.index}",
                "plugins": [
                    {
                        "type": "bridge",
                        "bridge": self.bridge,
                        "isGateway": True,
                        # No NAT: pods reach nothing outside the machine.
                        "ipMasq": False,
                        # A pod may reach itself through a Service.
                        "hairpinMode": True,
                        "ipam": {
                            "type": "host-local",
                            "ranges": [[{"subnet": self.subnet, "gateway": self.gateway}]],
                            "routes": [{"dst": "0.0.0.0/0"}],
                            "dataDir": str(ipam_dir),
                        },
                    },
                    {"type": "portmap", "capabilities": {"portMappings": True}},
                ],
            },
            indent=2,
        )


class HostNetwork:
    """The machine-wide settings the nodes need, undone by :meth:`restore`.

    - IPv4 forwarding on (pod to Service traffic is routed through the host);
    - bridged traffic through iptables (the br_netfilter sysctl; kube-proxy's rules must
      see pod-to-pod replies on one bridge);
    - a FORWARD chain of our own, first in FORWARD: accept between the bench's bridges,
      drop everything else to or from them. Other FORWARD rules (dockerd's DROP policy,
      say) never see pod traffic.
    """

    def __init__(self) -> None:
        self._forward_before: str | None = None
        self._bridge_nf_before: str | None = None
        self._chain_added = False
        self._kube_chains_before: set[tuple[str, str, str]] | None = None

    def apply(self) -> None:
        if not _BRIDGE_NF.exists():
            _run("modprobe", "br_netfilter", check=False)
        if not _BRIDGE_NF.exists():
            raise NetworkError(
                "bridged traffic does not pass iptables (no br_netfilter module): "
                "modprobe br_netfilter"
            )
        self._kube_chains_before = kube_chains()
        self._forward_before = _IP_FORWARD.read_text().strip()
        _IP_FORWARD.write_text("1\n")
        self._bridge_nf_before = _BRIDGE_NF.read_text().strip()
        _BRIDGE_NF.write_text("1\n")
        self._remove_chain()  # a stale one from an interrupted run
        _run("iptables", "-w", "-N", _CHAIN)
        self._chain_added = True
        bridges = f"{BRIDGE_PREFIX}+"
        _run("iptables", "-w", "-A", _CHAIN, "-i", bridges, "-o", bridges, "-j", "ACCEPT")
        _run("iptables", "-w", "-A", _CHAIN, "-i", bridges, "-j", "DROP")
        _run("iptables", "-w", "-A", _CHAIN, "-o", bridges, "-j", "DROP")
        _run("iptables", "-w", "-I", "FORWARD", "1", "-j", _CHAIN)

    @staticmethod
    def _remove_chain() -> None:
        while _run("iptables", "-w", "-D", "FORWARD", "-j", _CHAIN, check=False).returncode == 0:
            pass
        _run("iptables", "-w", "-F", _CHAIN, check=False)
        _run("iptables", "-w", "-X", _CHAIN, check=False)

    def restore(self) -> None:
        """Undo :meth:`apply`, and remove the KUBE-* chains the kubelet and kube-proxy made
        (kube-proxy's ``--cleanup`` leaves the kubelet's, such as KUBE-FIREWALL) unless
        they were there before."""
        if self._kube_chains_before is not None:
            remove_chains(kube_chains() - self._kube_chains_before)
            self._kube_chains_before = None
        if self._chain_added:
            self._remove_chain()
            self._chain_added = False
        if self._forward_before is not None:
            _IP_FORWARD.write_text(self._forward_before + "\n")
            self._forward_before = None
        if self._bridge_nf_before is not None:
            _BRIDGE_NF.write_text(self._bridge_nf_before + "\n")
            self._bridge_nf_before = None


_TABLES = ("filter", "nat", "mangle", "raw")
_IPTABLES = ("iptables", "ip6tables")


def kube_chains() -> set[tuple[str, str, str]]:
    """(command, table, chain) of every chain named KUBE-*."""
    found = set()
    for command in _IPTABLES:
        for table in _TABLES:
            listing = _run(command, "-w", "-t", table, "-S", check=False).stdout
            for line in listing.splitlines():
                if line.startswith("-N KUBE-"):
                    found.add((command, table, line.split()[1]))
    return found


def remove_chains(chains: set[tuple[str, str, str]]) -> None:
    """Delete the rules that jump to ``chains``, then the chains themselves."""
    names: dict[tuple[str, str], set[str]] = collections.defaultdict(set)
    for command, table, chain in chains:
        names[(command, table)].add(chain)
    for (command, table), doomed in names.items():
        for line in _run(command, "-w", "-t", table, "-S", check=False).stdout.splitlines():
            parts = shlex.split(line)
            if parts[:1] == ["-A"] and "-j" in parts and parts[parts.index("-j") + 1] in doomed:
                _run(command, "-w", "-t", table, "-D", *parts[1:], check=False)
        for chain in doomed:
            _run(command, "-w", "-t", table, "-F", chain, check=False)
        for chain in doomed:
            _run(command, "-w", "-t", table, "-X", chain, check=False)


def hosts_file_text(services: list[dict[str, object]]) -> str:
    """``/etc/hosts`` lines for Services (the items of a Service list): each one's cluster
    IP and full name. Headless Services (no cluster IP) get none: nothing here uses them."""
    lines = []
    for service in sorted(services, key=lambda s: json.dumps(s.get("metadata"), sort_keys=True)):
        metadata = service.get("metadata") or {}
        spec = service.get("spec") or {}
        assert isinstance(metadata, dict) and isinstance(spec, dict)
        address = str(spec.get("clusterIP") or "")
        with contextlib.suppress(ValueError):
            ipaddress.ip_address(address)
            name, namespace = metadata["name"], metadata["namespace"]
            lines.append(f"{address} {name}.{namespace}.svc.{CLUSTER_DOMAIN}")
    return "".join(line + "\n" for line in lines)


class ServiceNames:
    """dnsmasq on ``address`` answering Service names, kept current by a thread that
    lists the Services (through ``list_services``) twice a second."""

    def __init__(
        self, address: str, workdir: Path, list_services: Callable[[], list[dict[str, object]]]
    ) -> None:
        self.address = address
        self.hosts_dir = workdir / "dns-hosts"
        self._list_services = list_services
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._written = ""
        self.process = ServerProcess(
            "dnsmasq",
            [
                "dnsmasq",
                "--keep-in-foreground",
                "--conf-file=/dev/null",
                "--no-resolv",
                "--no-hosts",
                "--no-poll",
                "--bind-interfaces",
                f"--listen-address={address}",
                "--port=53",
                f"--hostsdir={self.hosts_dir}",
                # Names in the cluster domain are only ever ours; all else is refused.
                f"--local=/{CLUSTER_DOMAIN}/",
                "--domain-needed",
                "--log-facility=-",
                "--pid-file=",
                # It binds port 53 as root, then runs as nobody.
                "--user=nobody",
                "--group=nogroup",
            ],
            workdir / "dnsmasq.log",
        )

    def start(self) -> None:
        # Readable by dnsmasq after it dropped root (the workdir must be traversable).
        self.hosts_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        self.hosts_dir.chmod(0o755)
        self._refresh()
        self.process.start()
        self._thread = threading.Thread(target=self._follow, name="service-names", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.process.stop()

    def _refresh(self) -> None:
        text = hosts_file_text(self._list_services())
        if text != self._written:
            partial = self.hosts_dir / ".services.partial"
            partial.write_text(text)
            partial.chmod(0o644)
            partial.replace(self.hosts_dir / "services")  # dnsmasq re-reads it on change
            self._written = text

    def _follow(self) -> None:
        while not self._stopping.wait(0.5):
            with contextlib.suppress(Exception):  # a restarting apiserver: try again
                self._refresh()
