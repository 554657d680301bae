"""kind clusters on this machine: their dockerd, the test cluster config, create and delete.

kind runs each node as a ``--privileged`` container of the docker it finds through
``DOCKER_HOST``. Here that is a dockerd of our own (:func:`kind_docker`), separate from the
image builds' one in :mod:`tests.bench.images` (whose daemon starts and stops per build
and has no bridge), with:

- ``tests/bench/node/runc-without-sys-resource`` as its default runtime: root's capability
  bounding set lacks CAP_SYS_RESOURCE on our machines, and runc cannot start a privileged
  container that asks for it;
- no firewall rules of its own (``--iptables=false``): the real-node bench's forwarding
  rules stay as they are, and nodes reach nothing outside the machine; published ports
  (the API server's, ``extraPortMappings``) go through docker's userland proxy;
- kind's networks from 10.213.0.0/16, clear of the real node's pod and Service ranges.

Its data folder (with the node image, :mod:`tests.bench.kind_node_image`) is kept under
``${XDG_CACHE_HOME:-~/.cache}/alpineagents/images/kind-docker``.

The quirks of our machines that are the node's business go into the cluster config the
tests use (:func:`config_for_our_machines`), not into the users' ``kind-config.yaml``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import yaml

from tests.bench.images import Docker, images_lock, images_root
from tests.bench.testbin import ProvisioningError, binary_path

BENCH = Path(__file__).resolve().parent
RUNC_WRAPPER = BENCH / "node" / "runc-without-sys-resource"
RUNTIME = "alpineagents-runc"
ADDRESS_POOL = "base=10.213.0.0/16,size=24"

# The node's containerd: no process may lower its oom_score_adj here (the same missing
# capability), so every pod sandbox would fail with "can't get final child's PID from
# pipe: EOF" without this.
_CONTAINERD_PATCH = """\
[plugins."io.containerd.grpc.v1.cri"]
  restrict_oom_score_adj = true
"""
# Our machines have cgroup v1, which kubelet 1.35 refuses unless told; images loaded with
# `kind load` must not be garbage collected while a test still needs them.
_KUBELET_PATCH = """\
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
imageGCHighThresholdPercent: 100
"""


def kind_daemon() -> Docker:
    """The kind nodes' dockerd (not started yet)."""
    return Docker(
        run_dir=Path("/run/alpineagents-kind"),
        data=images_root() / "kind-docker",
        cgroup="alpineagents-kind",
        daemon_args=(
            "--iptables=false",
            "--ip-masq=false",
            # No docker0: kind makes a network of its own, and another dockerd may own it.
            "--bridge=none",
            f"--default-address-pool={ADDRESS_POOL}",
            f"--add-runtime={RUNTIME}={RUNC_WRAPPER}",
            f"--default-runtime={RUNTIME}",
        ),
    )


@contextlib.contextmanager
def kind_sessions_lock() -> Iterator[None]:
    """Held by a test session using kind clusters, so the next one waits for it."""
    with images_lock(".kind-sessions.lock"):
        yield


@contextlib.contextmanager
def kind_docker() -> Iterator[Docker]:
    """The kind nodes' dockerd, running for the ``with`` block, stopped by pid after."""
    docker = kind_daemon()
    try:
        docker.start()
        yield docker
    finally:
        docker.stop()


def config_for_our_machines(user_config: Path, out: Path) -> Path:
    """Write ``user_config`` plus the patches our machines need (see above) to ``out``."""
    config = yaml.safe_load(user_config.read_text())
    config.setdefault("containerdConfigPatches", []).append(_CONTAINERD_PATCH)
    config.setdefault("kubeadmConfigPatches", []).append(_KUBELET_PATCH)
    out.write_text(yaml.safe_dump(config, sort_keys=False))
    return out


def kind(docker: Docker, *args: str, kubeconfig: Path, timeout: float = 900) -> str:
    """Run the kind CLI against ``docker``, writing cluster credentials to ``kubeconfig``."""
    env = {**docker.env, "KUBECONFIG": str(kubeconfig)}
    command = [str(binary_path("kind")), *args]
    result = subprocess.run(
        command,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        check=False,
    )
    if result.returncode != 0:
        raise ProvisioningError(f"`kind {' '.join(args)}` failed:\n{result.stdout[-6000:]}")
    return result.stdout


def node_logs(docker: Docker, name: str) -> str:
    """The tail of a node's kubelet and containerd journals (for a failure's message)."""
    found = subprocess.run(
        [
            "/usr/bin/docker",
            "exec",
            f"{name}-control-plane",
            "journalctl",
            "--no-pager",
            "-n",
            "80",
            "-u",
            "kubelet",
            "-u",
            "containerd",
        ],
        env=docker.env,
        capture_output=True,
        text=True,
        check=False,
    )
    return found.stdout + found.stderr


def environment(docker: Docker, kubeconfig: Path) -> dict[str, str]:
    """The environment in which ``docker``, ``kind``, ``kubectl`` and ``helm`` reach the
    cluster the way a user's shell would after ``kind create cluster``."""
    kind_dir = str(binary_path("kind").parent)
    return {
        **docker.env,
        "KUBECONFIG": str(kubeconfig),
        "PATH": os.pathsep.join([kind_dir, os.environ.get("PATH", "")]),
    }
