"""One real Kubernetes node on this machine: its own containerd and a kubelet (v1.35).

:class:`KubeletNode` runs containerd (Debian's 1.6, with runc) with its own config,
state, socket and image store, loads the bench's images into it, and a kubelet with its
own root folder, ports, cgroup (``/alpineagents-<name>``) and pod subnet
(:class:`~tests.bench.node_network.NodeSubnet`). Several may run side by side.

This machine's quirks (see the project's notes on the real node): root lacks
CAP_SYS_RESOURCE, so containerd's CRI must not lower any ``oom_score_adj``
(``restrict_oom_score_adj``); the machine is on cgroup v1, which kubelet 1.35 refuses
unless ``failCgroupV1: false``; the loaded images must never be garbage-collected (no
registry to pull them back from), so image GC starts only at a full disk.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

from tests.bench.control_plane import ControlPlane
from tests.bench.host_cleanup import (
    Sysctls,
    cgroup_pids,
    kill_cgroup,
    make_cgroup,
    remove_cgroup,
    unmount_below,
)
from tests.bench.images import Image, cached_refs
from tests.bench.infra import free_port
from tests.bench.node_network import CLUSTER_DOMAIN, NodeSubnet
from tests.bench.server_process import ServerFailed, ServerProcess
from tests.bench.testbin import binary_path, cache_root

# What the kubelet changes at start (setupKernelTunables); given back at teardown.
_KUBELET_SYSCTLS = (
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
)
CNI_PLUGINS = Path("/usr/lib/cni")
# What tests.bench.images names its images, as containerd spells them.
_BENCH_REPOSITORIES = ("docker.io/library/alpineagents:bench-", "docker.io/alpineagents-bench/")


def _containerd_config(root: Path, state: Path, socket: Path, cni: Path, pause: Image) -> str:
    return f"""version = 2
root = "{root}"
state = "{state}"

[grpc]
  address = "{socket}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{root}/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause.ref}"
  # Root cannot lower oom_score_adj here (no CAP_SYS_RESOURCE): every sandbox would fail
  # with "can't get final child's PID from pipe: EOF".
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_cdi = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_PLUGINS}"
    conf_dir = "{cni}"
    max_conf_num = 1
"""


class KubeletNode:
    """containerd and a kubelet joined to ``plane`` as node ``name`` (see the module doc).

    ``kubeconfig`` is the kubelet's identity (``system:node:<name>``); ``cluster_dns`` the
    nameserver pods get.
    """

    def __init__(
        self,
        name: str,
        subnet: NodeSubnet,
        plane: ControlPlane,
        kubeconfig: Path,
        cluster_dns: str,
        workdir: Path,
    ) -> None:
        self.name = name
        # The image store outlives the session, so a warm run imports nothing (the
        # containers in it do not: see stop()).
        self.image_store = cache_root().parent / "real-node" / name / "containerd"
        self.subnet = subnet
        self.plane = plane
        self.workdir = workdir
        self.cgroup = f"alpineagents-{name}"
        # Short: socket paths have a length limit.
        self.run_dir = Path("/run") / f"alpineagents-{name}"
        self.socket = self.run_dir / "containerd.sock"
        self._sysctls = Sysctls(*_KUBELET_SYSCTLS)
        self.containerd = ServerProcess(
            f"containerd ({name})",
            ["containerd", f"--config={workdir / 'containerd.toml'}", "--log-level=warn"],
            workdir / "containerd.log",
            stop_grace=30,
        )
        self.kubelet_port = free_port()
        self.kubelet = ServerProcess(
            f"kubelet ({name})",
            [
                str(binary_path("kubelet")),
                f"--config={workdir / 'kubelet.yaml'}",
                f"--kubeconfig={kubeconfig}",
                f"--root-dir={workdir / 'kubelet'}",
                f"--cert-dir={workdir / 'kubelet-pki'}",
                f"--hostname-override={name}",
                f"--node-ip={subnet.gateway}",
                "--v=1",
            ],
            workdir / "kubelet.log",
            stop_grace=30,
        )
        self._cluster_dns = cluster_dns

    # ------------------------------------------------------------------ start

    def start(self, images: list[Image], source: KubeletNode | None = None) -> None:
        """Bring the node up with ``images`` loaded (from ``source``'s image store when
        given, else from their archives) and wait until it is Ready."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.subnet.create()
        make_cgroup(self.cgroup)
        self._start_containerd(next(i for i in images if i.name == "pause"))
        self.load_images(images, source)
        self._write_kubelet_config()
        self._sysctls.save()
        self.start_kubelet()

    def _start_containerd(self, pause: Image) -> None:
        cni = self.workdir / "cni"
        cni.mkdir(exist_ok=True)
        (cni / "10-alpineagents.conflist").write_text(self.subnet.cni_config(self.workdir / "ipam"))
        (self.workdir / "containerd.toml").write_text(
            _containerd_config(self.image_store, self.run_dir / "state", self.socket, cni, pause)
        )
        self.containerd.start()
        self.containerd.wait_until(
            lambda: self.ctr("version", check=False).returncode == 0, "answering", timeout=60
        )

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``ctr`` against this node's containerd, in the kubelet's namespace (k8s.io)."""
        command = ["ctr", f"--address={self.socket}", "--namespace=k8s.io", *args]
        result = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
        if check and result.returncode != 0:
            raise ServerFailed(f"`{' '.join(command)}` failed: {result.stderr.strip()}")
        return result

    def load_images(self, images: list[Image], source: KubeletNode | None = None) -> None:
        """Import the images the node does not have yet, and remove the bench's images
        whose archives left the cache (their content is then garbage-collected).

        With ``source`` they are copied from that node's store: the cache may have
        dropped an archive since (another checkout's build replaced it)."""
        wanted = {_normalized(image.ref) for image in images}
        kept = wanted | {_normalized(ref) for ref in cached_refs()}
        present = set(self.ctr("images", "list", "--quiet").stdout.split())
        stale = [ref for ref in present - kept if ref.startswith(_BENCH_REPOSITORIES)]
        if stale:
            self.ctr("images", "remove", *stale)
        for image in images:
            if _normalized(image.ref) in present:
                continue
            archive = image.archive
            if source is not None:
                archive = self.workdir / f"{image.name}.tar"
                source.ctr("images", "export", str(archive), _normalized(image.ref))
            self.ctr("images", "import", str(archive))
            if source is not None:
                archive.unlink()

    def _write_kubelet_config(self) -> None:
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": self.subnet.gateway,
            "port": self.kubelet_port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": free_port(),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(self.plane.ca_file)},
            },
            "authorization": {"mode": "Webhook"},
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": f"/{self.cgroup}",
            # This machine is on cgroup v1 (hybrid); kubelet 1.35 refuses it by default.
            "failCgroupV1": False,
            "failSwapOn": False,
            # No registry could give a collected image back.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            # A shared machine's disk and memory are not this node's to police.
            "evictionHard": {
                "memory.available": "50Mi",
                "nodefs.available": "1%",
                "nodefs.inodesFree": "1%",
                "imagefs.available": "1%",
            },
            "clusterDNS": [self._cluster_dns],
            "clusterDomain": CLUSTER_DOMAIN,
            # Pods get only the cluster's nameserver and search path, nothing of the host's.
            "resolvConf": "",
            "podLogsDir": str(self.workdir / "pod-logs"),
            "serializeImagePulls": False,
            "nodeStatusUpdateFrequency": "2s",
            "nodeStatusReportFrequency": "10s",
            "syncFrequency": "10s",
        }
        (self.workdir / "kubelet.yaml").write_text(json.dumps(config, indent=2))

    def start_kubelet(self, timeout: float = 120.0) -> None:
        """Start the kubelet and wait until the Node is Ready."""
        self.kubelet.start()
        self.kubelet.wait_until(self.ready, f"Node {self.name} Ready", timeout=timeout)

    def ready(self) -> bool:
        status, body = self.plane.get(f"/api/v1/nodes/{self.name}")
        if status != 200:
            return False
        conditions = json.loads(body).get("status", {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    # ------------------------------------------------------------------ disruptions

    def stop_kubelet(self) -> None:
        """SIGTERM the kubelet (its containers keep running, as with the real one)."""
        self.kubelet.stop()

    def power_off(self) -> None:
        """The machine dies: the kubelet and every container process are SIGKILLed."""
        pid = self.kubelet.pid
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.kubelet.stop()  # reaps it
        kill_cgroup(self.cgroup)

    def _network_namespaces(self, containers: list[str]) -> list[Path]:
        """The network namespace files of these containers (their sandboxes' netns)."""
        paths = set()
        for container in containers:
            info = self.ctr("containers", "info", container, check=False)
            with contextlib.suppress(ValueError, KeyError, TypeError):
                spec = json.loads(info.stdout)["Spec"]
                for namespace in spec["linux"]["namespaces"]:
                    path = str(namespace.get("path") or "")
                    if namespace["type"] == "network" and "/netns/" in path:
                        paths.add(Path(path))
        return sorted(paths)

    def running_tasks(self) -> list[str]:
        """Ids of this node's containers (and sandboxes) whose processes run."""
        listing = self.ctr("tasks", "list", check=False).stdout.splitlines()[1:]
        return [line.split()[0] for line in listing if "RUNNING" in line.split()]

    # ------------------------------------------------------------------ teardown

    def stop(self) -> None:
        """Stop everything and give the machine back as it was (see the module doc).

        The caller deletes the node's pods first (so the kubelet tears their sandboxes
        down through CRI); what still runs after that is killed here.
        """
        self.kubelet.stop()
        kill_cgroup(self.cgroup)
        deadline = time.monotonic() + 30
        while cgroup_pids(self.cgroup) and time.monotonic() < deadline:
            time.sleep(0.1)
        namespaces: list[Path] = []
        if self.containerd.running:
            for task in self.running_tasks():
                self.ctr("tasks", "delete", "--force", task, check=False)
            # The image store is kept for the next session; its containers are not.
            containers = self.ctr("containers", "list", "--quiet", check=False).stdout.split()
            namespaces = self._network_namespaces(containers)
            if containers:
                self.ctr("containers", "delete", *containers, check=False)
        self.containerd.stop()
        # A sandbox the kubelet could not stop (its node was powered off) keeps its
        # network namespace, bind-mounted under /run/netns.
        unmount_below(self.workdir, self.run_dir, self.image_store, *namespaces)
        for path in namespaces:
            path.unlink(missing_ok=True)
        remove_cgroup(self.cgroup)
        self._sysctls.restore()
        self.subnet.delete()
        subprocess.run(["rm", "-rf", str(self.run_dir)], check=False)


def _normalized(ref: str) -> str:
    """An image reference as containerd names it (docker.io/library/... for short ones)."""
    name = ref.split("/", 1)
    if len(name) == 1:
        return f"docker.io/library/{ref}"
    if "." not in name[0] and ":" not in name[0] and name[0] != "localhost":
        return f"docker.io/{ref}"
    return ref
