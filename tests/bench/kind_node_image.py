"""A kind node image assembled here, from Debian's packages and the binaries we build.

Run ``python -m tests.bench.kind_node_image`` to build (or find) it. kind's own node image
cannot be pulled here and its base image's Dockerfile clones repositories and downloads a
Go toolchain, so this follows the same recipe with what we have:

- the root file system: ``mmdebstrap`` of Debian bookworm with systemd, Debian's
  containerd (1.6), runc (1.1) and CNI plugins, and the tools kind's base image installs;
  kind's own files (entrypoint, ``/kind/bin``, systemd units, containerd config) taken
  unmodified from the kind module the Go proxy served for :data:`KIND_VERSION`; kubeadm,
  kubelet and kubectl v1.35.4 built by :mod:`tests.bench.testbin` in ``/usr/bin``, crictl
  v1.34.0 (the proxy refuses cri-tools v1.35) in ``/usr/local/bin``;
- the images kubeadm and the node need, preloaded into the node's containerd (unpacked
  on first use, as kind does), each made here and tagged exactly as kubeadm v1.35.4 and
  kind v0.33 name them: the control plane's binaries in ``FROM scratch`` images, kube-proxy
  and the storage helper on a small Debian with iptables, CoreDNS and the local-path
  provisioner built from the Go proxy, our pause program;
- instead of kindnet (its module is refused by the proxy), a bridge conflist in
  ``/etc/cni/net.d`` for the default pod subnet, and a ``/kind/manifests/default-cni.yaml``
  that only records that (a ConfigMap), so a config without ``disableDefaultCNI`` works.

How it differs from kind's own ``kindest/node`` v1.35 image:

- Debian bookworm, not trixie; Debian's containerd 1.6.20 (config version 2, which kind's
  file still is), runc 1.1.5 and CNI plugins 1.1.1 (all of them, linked into
  ``/opt/cni/bin``), not containerd 2.x, runc 1.4 and four plugins built from source;
  crictl v1.34.0, not v1.36; no fuse-overlayfs snapshotter, nfs-common or open-iscsi
  (rootless docker and NFS/iSCSI volumes are not supported); no ``/LICENSES``.
- No kindnet: one bridge for :data:`NODE_POD_SUBNET`, so pods of a second node would not
  reach the first, a ``podSubnet`` in the config is not followed, and NetworkPolicies are
  not enforced (kindnet enforces them).
- The images: binaries alone ``FROM scratch`` (no distroless base; CoreDNS runs as root),
  kube-proxy on Debian's iptables (nft) without iptables-wrapper, etcd v3.6.16 under
  kubeadm's ``etcd:3.6.6-0`` tag, pause is our own program, local-path-provisioner
  v0.0.30 and a Debian helper under kind's image names. ctr 1.6 cannot label them
  pinned, so the kubelet may collect them unless ``imageGCHighThresholdPercent: 100``.
- Kubernetes is built with ``go build -trimpath`` from the proxy's k8s.io/kubernetes
  v1.35.4 (version stamped by ldflags), not by Kubernetes' release tooling.

The image lives in the kind daemon's data folder (:mod:`tests.bench.kind_cluster`), tagged
``alpineagents-bench/kind-node:<hash of everything it is made from>``; a warm run finds the
tag and builds nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.bench.images import (
    Docker,
    Image,
    apt_source_files,
    base_inputs,
    ensure_images,
    images_root,
    plan,
)
from tests.bench.infra import provisioning_failed
from tests.bench.testbin import (
    COREDNS_VERSION,
    CRICTL_VERSION,
    ETCD_VERSION,
    KIND_VERSION,
    KUBERNETES_VERSION,
    LOCAL_PATH_PROVISIONER_VERSION,
    ProvisioningError,
    binary_path,
    module_source,
    pinned_path,
)

# Raise it when the recipe below changes what goes into the image (its tag hashes this
# and the versions, packages and files it is made from, not this file's text).
RECIPE = "kind-node-recipe-1"
SUITE = "bookworm"
# kind's base image (images/base/Dockerfile) installs these; Debian's containerd, runc and
# CNI plugins stand in for the ones it builds from source.
NODE_PACKAGES = (
    "systemd",
    "dbus",
    "containerd",
    "runc",
    "containernetworking-plugins",
    "conntrack",
    "iptables",
    "nftables",
    "iproute2",
    "ethtool",
    "util-linux",
    "mount",
    "kmod",
    "libseccomp2",
    "pigz",
    "e2fsprogs",
    "bash",
    "ca-certificates",
    "curl",
    "jq",
    "procps",
    "socat",
)
# kube-proxy's image (the official one is distroless with iptables) and the storage helper.
TOOLS_PACKAGES = ("iptables", "conntrack", "ipset", "kmod", "ca-certificates")

REGISTRY = "registry.k8s.io"
# kubeadm v1.35.4 `config images list`: etcd 3.6.6-0 is served by our etcd build (3.6.16).
ETCD_TAG = "3.6.6-0"
COREDNS_TAG = "v1.13.1"
PAUSE_TAGS = ("3.10.1", "3.10")  # kubeadm's, and the sandbox_image of kind's containerd config
POD_SUBNET = "10.244.0.0/16"  # kind's default podSubnet
NODE_POD_SUBNET = "10.244.0.0/24"  # the first node's podCIDR (one node: the bridge's range)

_SCRATCH_DOCKERFILE = (
    "FROM scratch\nARG NAME\nCOPY ${NAME} /usr/local/bin/${NAME}\n"
    "ENV PATH=/usr/local/bin:/usr/bin:/bin\n"
)
_TOOLS_DOCKERFILE = "ARG BASE\nFROM ${BASE}\nARG NAME\nCOPY ${NAME} /usr/local/bin/${NAME}\n"
_COREDNS_DOCKERFILE = 'FROM scratch\nCOPY coredns /coredns\nENTRYPOINT ["/coredns"]\n'
_CONFLIST = {
    "cniVersion": "0.4.0",
    "name": "kind-bridge",
    "plugins": [
        {
            "type": "bridge",
            "bridge": "kindbr0",
            "isGateway": True,
            "ipMasq": True,
            "hairpinMode": True,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": NODE_POD_SUBNET}]],
                "routes": [{"dst": "0.0.0.0/0"}],
            },
        },
        {"type": "portmap", "capabilities": {"portMappings": True}},
    ],
}
_DEFAULT_CNI_MANIFEST = f"""\
# The node image's CNI is the bridge conflist in /etc/cni/net.d/10-kind-bridge.conflist
# (pods on {NODE_POD_SUBNET}, one node only): kindnet cannot be built here.
apiVersion: v1
kind: ConfigMap
metadata:
  name: kind-node-cni
  namespace: kube-system
data:
  conflist: '{json.dumps(_CONFLIST)}'
"""
_ENTRYPOINT_CHANGES = (
    'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]',
    "ENV container=docker",
)
# docker import and commit cannot set a stop signal: a last build step does (systemd
# shuts down on SIGRTMIN+3, as in kind's image).
_STOPSIGNAL_DOCKERFILE = "ARG NODE\nFROM ${NODE}\nSTOPSIGNAL SIGRTMIN+3\n"


def kind_module() -> Path:
    """kind's module source (its node files), as the Go module proxy serves it."""
    return module_source("sigs.k8s.io/kind", KIND_VERSION)


def _digest(*parts: str | Path) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.read_bytes() if isinstance(part, Path) else part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def _pause() -> Image:
    """The bench's pause image (tests/bench/images.py), built first if it is not cached."""
    pause = plan()["pause"]
    return pause if pause.archive.exists() else ensure_images()["pause"]


def node_image_ref() -> str:
    """The node image's tag for the current inputs (built or not)."""
    pause = _pause()
    inputs: list[str | Path] = [
        RECIPE,
        KIND_VERSION,
        KUBERNETES_VERSION,
        ETCD_VERSION,
        COREDNS_VERSION,
        LOCAL_PATH_PROVISIONER_VERSION,
        CRICTL_VERSION,
        *NODE_PACKAGES,
        *TOOLS_PACKAGES,
        _DEFAULT_CNI_MANIFEST,
        pause.ref,
        *(str(part) for part in base_inputs()),
    ]
    return f"alpineagents-bench/kind-node:{_digest(*inputs)}"


# --------------------------------------------------------------------------- root file systems


def _mmdebstrap(packages: tuple[str, ...], out: Path) -> None:
    if shutil.which("mmdebstrap") is None:
        raise ProvisioningError("mmdebstrap is not installed")
    command = [
        "mmdebstrap",
        "--variant=minbase",
        "--quiet",
        f"--include={','.join(packages)}",
        "--dpkgopt=path-exclude=/usr/share/doc/*",
        "--dpkgopt=path-exclude=/usr/share/man/*",
        "--dpkgopt=path-exclude=/usr/share/locale/*",
        SUITE,
        str(out),
        *(str(p) for p in apt_source_files()),
    ]
    _run(command)


def _run(command: list[str]) -> str:
    result = subprocess.run(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False
    )
    if result.returncode != 0:
        tail = "\n".join(result.stdout.splitlines()[-40:])
        raise ProvisioningError(f"`{' '.join(command)}` failed:\n{tail}")
    return result.stdout


def _copy_tree(source: Path, target: Path, mode: int) -> None:
    for path in sorted(source.rglob("*")):
        destination = target / path.relative_to(source)
        if path.is_dir():
            destination.mkdir(mode=0o755, parents=True, exist_ok=True)
        else:
            destination.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            shutil.copyfile(path, destination)
            destination.chmod(mode)


def _customize_node(root: Path, kind: Path) -> None:
    """What kind's base and node image builds add to the packages (see the module doc)."""
    files = kind / "images" / "base" / "files"
    _copy_tree(files / "usr" / "local" / "bin", root / "usr" / "local" / "bin", 0o755)
    _copy_tree(files / "kind", root / "kind", 0o644)
    _copy_tree(files / "kind" / "bin", root / "kind" / "bin", 0o755)
    _copy_tree(files / "etc", root / "etc", 0o644)
    # kind's units run its own builds from /usr/local; Debian's are in /usr/bin, /usr/sbin.
    (root / "usr" / "local" / "bin" / "containerd").symlink_to("/usr/bin/containerd")
    (root / "usr" / "local" / "sbin" / "runc").symlink_to("/usr/sbin/runc")
    cni_bin = root / "opt" / "cni" / "bin"
    cni_bin.mkdir(parents=True, exist_ok=True)
    for plugin in sorted((root / "usr" / "lib" / "cni").iterdir()):
        (cni_bin / plugin.name).symlink_to(f"/usr/lib/cni/{plugin.name}")
    # What kind's base Dockerfile does after installing its packages.
    systemd = root / "lib" / "systemd" / "system"
    (systemd / "sysinit.target.wants" / "systemd-tmpfiles-setup.service").unlink(missing_ok=True)
    for wants in [
        *systemd.glob("multi-user.target.wants/*"),
        *(root / "etc" / "systemd" / "system").glob("*.wants/*"),
        *systemd.glob("local-fs.target.wants/*"),
        *systemd.glob("sockets.target.wants/*udev*"),
        *systemd.glob("sockets.target.wants/*initctl*"),
        *systemd.glob("basic.target.wants/*"),
    ]:
        wants.unlink()
    with (root / "etc" / "systemd" / "journald.conf").open("a") as journald:
        journald.write("ReadKMsg=no\n")
    init = root / "sbin" / "init"
    init.unlink(missing_ok=True)
    init.symlink_to("/usr/lib/systemd/systemd")
    _run(
        [
            "systemctl",
            f"--root={root}",
            "enable",
            "kubelet.service",
            "containerd.service",
            "undo-mount-hacks.service",
        ]
    )
    _run(["systemctl", f"--root={root}", "mask", "systemd-binfmt.service"])
    (root / "etc" / "kubernetes" / "manifests").mkdir(parents=True, exist_ok=True)
    # containerd's default OCI spec, with kind's product-files hook and no rlimits.
    spec = json.loads(
        subprocess.run(["ctr", "oci", "spec"], capture_output=True, text=True, check=True).stdout
    )
    spec.setdefault("hooks", {}).setdefault("createContainer", []).append(
        {"path": "/kind/bin/mount-product-files.sh"}
    )
    spec["process"].pop("rlimits", None)
    (root / "etc" / "containerd" / "cri-base.json").write_text(json.dumps(spec, indent=2))
    # What `kind build node-image` adds: the Kubernetes binaries, the version, manifests.
    for name in ("kubeadm", "kubelet", "kubectl"):
        target = root / "usr" / "bin" / name
        shutil.copyfile(pinned_path(name), target)
        target.chmod(0o755)
    crictl = root / "usr" / "local" / "bin" / "crictl"
    shutil.copyfile(pinned_path("crictl"), crictl)
    crictl.chmod(0o755)
    (root / "kind" / "version").write_text(KUBERNETES_VERSION)
    manifests = root / "kind" / "manifests"
    manifests.mkdir(parents=True, exist_ok=True)
    (manifests / "default-cni.yaml").write_text(_DEFAULT_CNI_MANIFEST)
    (manifests / "default-storage.yaml").write_text(_storage_manifest(kind))
    net_d = root / "etc" / "cni" / "net.d"
    net_d.mkdir(parents=True, exist_ok=True)
    (net_d / "10-kind-bridge.conflist").write_text(json.dumps(_CONFLIST, indent=2))


def _storage_constants(kind: Path) -> dict[str, str]:
    source = (kind / "pkg" / "build" / "nodeimage" / "const_storage.go").read_text()
    return dict(re.findall(r'^const (\w+Image) = "([^"]+)"', source, re.M))


def _storage_manifest(kind: Path) -> str:
    """kind's default storage manifest (local-path-provisioner), as its node images ship."""
    source = (kind / "pkg" / "build" / "nodeimage" / "const_storage.go").read_text()
    for name, image in _storage_constants(kind).items():
        source = source.replace(f"` + {name} + `", image)
    found = re.search(r"const defaultStorageManifest = `(.*?)`\s*$", source, re.S | re.M)
    if found is None or "`" in found.group(1):
        raise ProvisioningError("kind's default storage manifest was not found in its source")
    return found.group(1)


def _import(docker: Docker, root: Path, ref: str, changes: tuple[str, ...] = ()) -> None:
    """``docker import`` of a root file system folder."""
    archive = root.with_name(root.name + ".tar")
    try:
        _run(["tar", "--numeric-owner", "--xattrs", "-C", str(root), "-cf", str(archive), "."])
        docker.run("import", *(f"--change={change}" for change in changes), str(archive), ref)
    finally:
        archive.unlink(missing_ok=True)


# --------------------------------------------------------------------------- the images it holds


def _build(docker: Docker, ref: str, dockerfile: str, files: dict[str, Path], *args: str) -> None:
    with tempfile.TemporaryDirectory(prefix=".kind-context-", dir=images_root()) as context:
        (Path(context) / "Dockerfile").write_text(dockerfile)
        for name, source in files.items():
            shutil.copyfile(source, Path(context) / name)
            (Path(context) / name).chmod(0o755)
        docker.run("build", "--network=none", f"--tag={ref}", *args, context)


def _preloaded_images(docker: Docker, kind: Path, tools: str) -> list[str]:
    """Build and tag every image the node holds; returns their references."""
    refs = []
    for name in ("kube-apiserver", "kube-controller-manager", "kube-scheduler"):
        ref = f"{REGISTRY}/{name}:{KUBERNETES_VERSION}"
        _build(
            docker, ref, _SCRATCH_DOCKERFILE, {name: pinned_path(name)}, f"--build-arg=NAME={name}"
        )
        refs.append(ref)
    etcd = f"{REGISTRY}/etcd:{ETCD_TAG}"
    _build(
        docker, etcd, _SCRATCH_DOCKERFILE, {"etcd": binary_path("etcd")}, "--build-arg=NAME=etcd"
    )
    proxy = f"{REGISTRY}/kube-proxy:{KUBERNETES_VERSION}"
    _build(
        docker,
        proxy,
        _TOOLS_DOCKERFILE,
        {"kube-proxy": pinned_path("kube-proxy")},
        "--build-arg=NAME=kube-proxy",
        f"--build-arg=BASE={tools}",
    )
    coredns = f"{REGISTRY}/coredns/coredns:{COREDNS_TAG}"
    _build(docker, coredns, _COREDNS_DOCKERFILE, {"coredns": pinned_path("coredns")})
    storage = _storage_constants(kind)
    provisioner = storage["storageProvisionerImage"]
    _build(
        docker,
        provisioner,
        _SCRATCH_DOCKERFILE,
        {"local-path-provisioner": pinned_path("local-path-provisioner")},
        "--build-arg=NAME=local-path-provisioner",
    )
    helper = storage["storageHelperImage"]
    docker.run("tag", tools, helper)
    refs += [etcd, proxy, coredns, provisioner, helper]
    pause = _pause()
    if not docker.has(pause.ref):
        docker.run("load", "--input", str(pause.archive))
    for tag in PAUSE_TAGS:
        docker.run("tag", pause.ref, f"{REGISTRY}/pause:{tag}")
        refs.append(f"{REGISTRY}/pause:{tag}")
    return refs


def _preload(docker: Docker, rootfs: str, refs: list[str], ref: str, scratch: Path) -> None:
    """Import ``refs`` into the node's containerd (as kind's node build does) and commit."""
    archive = scratch / "images.tar"
    docker.run("save", "--output", str(archive), *refs)
    container = docker.run(
        "run",
        "--detach",
        "--privileged",
        "--network=none",
        "--entrypoint=sleep",
        rootfs,
        "infinity",
    ).strip()
    try:
        docker.run("exec", container, "bash", "-c", "nohup containerd >/dev/null 2>&1 &")
        docker.run(
            "exec",
            container,
            "bash",
            "-c",
            "for i in $(seq 120); do ctr version >/dev/null 2>&1 && exit 0; sleep 1; done; exit 1",
        )
        with archive.open("rb") as images:
            result = subprocess.run(
                [
                    "/usr/bin/docker",
                    "exec",
                    "--interactive",
                    container,
                    "ctr",
                    "--namespace=k8s.io",
                    "images",
                    "import",
                    "--all-platforms",
                    "--no-unpack",
                    "--digests",
                    "-",
                ],
                stdin=images,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=docker.env,
                check=False,
            )
        if result.returncode != 0:
            raise ProvisioningError(f"importing the node's images failed:\n{result.stdout}")
        docker.run(
            "exec",
            container,
            "bash",
            "-c",
            # sleep, the container's first process, reaps nobody: a zombie is gone enough.
            "pkill -x containerd; for i in $(seq 60); do"
            " ps -C containerd -o stat= | grep -qv '^Z' || exit 0; sleep 1; done; exit 1",
        )
        committed = f"{ref}-committed"
        docker.run("commit", *(f"--change={c}" for c in _ENTRYPOINT_CHANGES), container, committed)
    finally:
        docker.run("rm", "--force", "--volumes", container)
    _build(docker, ref, _STOPSIGNAL_DOCKERFILE, {}, f"--build-arg=NODE={committed}")
    docker.run("rmi", committed)


def build_node_image(docker: Docker, ref: str) -> None:
    """Assemble the node image as ``ref`` in ``docker`` (see the module doc)."""
    kind = kind_module()
    tag = ref.rsplit(":", 1)[1]
    with tempfile.TemporaryDirectory(prefix=".kind-node-", dir=images_root()) as scratch:
        tools_root = Path(scratch) / "tools"
        _mmdebstrap(TOOLS_PACKAGES, tools_root)
        tools = f"alpineagents-bench/kind-tools:{tag}"
        _import(docker, tools_root, tools)
        shutil.rmtree(tools_root)
        node_root = Path(scratch) / "node"
        _mmdebstrap(NODE_PACKAGES, node_root)
        _customize_node(node_root, kind)
        rootfs = f"alpineagents-bench/kind-node-rootfs:{tag}"
        _import(docker, node_root, rootfs, _ENTRYPOINT_CHANGES)
        shutil.rmtree(node_root)
        refs = _preloaded_images(docker, kind, tools)
        _preload(docker, rootfs, refs, ref, Path(scratch))
    for stale in (rootfs, *refs, tools):
        docker.run("rmi", "--force", stale)
    _forget_older(docker, ref)


def _forget_older(docker: Docker, ref: str) -> None:
    """Remove node images of earlier inputs, keeping the newest two (several checkouts
    share the daemon, each maybe with its own inputs), and the build cache."""
    repository = ref.rsplit(":", 1)[0]
    listed = docker.run(
        "image", "ls", "--format={{.Repository}}:{{.Tag}} {{.CreatedAt}}", repository
    ).splitlines()
    older = sorted((line.split(" ", 1) for line in listed if line), key=lambda p: p[1])
    for old_ref, _ in older[:-2]:
        if old_ref != ref:
            docker.run("rmi", "--force", old_ref)
    docker.run("image", "prune", "--force")
    docker.run("builder", "prune", "--force")


def ensure_node_image(docker: Docker, report: bool = False) -> str:
    """The node image's reference, built in ``docker`` first unless it is there already."""
    started = time.monotonic()
    ref = node_image_ref()
    how = "cached"
    if not docker.has(ref):
        how = "built"
        build_node_image(docker, ref)
    if report:
        print(f"{'kind node image':<24} {ref:<52} {how:<7} {time.monotonic() - started:7.1f}s")
    return ref


def main(argv: list[str] | None = None) -> int:
    """Command line: build (or find) the node image in the kind daemon, and print it."""
    from tests.bench.kind_cluster import kind_docker

    parser = argparse.ArgumentParser(
        prog="python -m tests.bench.kind_node_image", description=__doc__.split("\n\n")[0]
    )
    parser.parse_args(argv)
    try:
        if os.geteuid() != 0:
            raise ProvisioningError("kind's dockerd runs as root here: run this as root")
        with kind_docker() as docker:
            ensure_node_image(docker, report=True)
    except ProvisioningError as error:
        return provisioning_failed(error, "kind")
    return 0


if __name__ == "__main__":
    os.umask(0o022)
    sys.exit(main())
