"""Provision the real server binaries the test bench runs, pinned by version.

Run ``python -m tests.bench.testbin`` from the repository root to build (or reuse)
everything; fixtures call :func:`binary_path` and get the same binaries.

Binaries are cached outside the repository under
``${XDG_CACHE_HOME:-~/.cache}/alpineagents/testbin/<name>-<version>/<name>``. A binary
already on ``PATH`` (or in ``$KUBEBUILDER_ASSETS``) is used instead when its version
fits. Everything is built from source with the ordinary Go client through the Go
module proxy (no release downloads): ``go build`` of a tiny generated wrapper module for
etcd and the Kubernetes servers (their own go.mod files carry ``replace`` directives,
which ``go install pkg@version`` refuses), ``go install`` for MinIO, helm, promtool and
kube-router, and the collector's own builder (ocb) for the OpenTelemetry Collector.

A build writes into a temporary file next to its final place and renames it there, so
an interrupted build never leaves half a binary, and a per-binary lock file keeps two
test processes from building the same thing at once.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ETCD_VERSION = "v3.6.16"
KUBERNETES_VERSION = "v1.35.4"
# The staging modules (k8s.io/api, k8s.io/apiserver, ...) are tagged v0.<minor>.<patch>.
_KUBERNETES_STAGING_VERSION = "v0." + KUBERNETES_VERSION.removeprefix("v1.")
HELM_VERSION = "v3.22.0"
# kind and what its node image runs besides Kubernetes (tests/bench/kind_node_image.py):
# CoreDNS (the tag kubeadm v1.35 deploys) and the storage provisioner kind's images ship.
KIND_VERSION = "v0.33.0"
COREDNS_VERSION = "v1.13.1"
LOCAL_PATH_PROVISIONER_VERSION = "v0.0.30"
# crictl (kind load asks it for a node's images); the proxy refuses v1.35.x of cri-tools.
CRICTL_VERSION = "v1.34.0"
# MinIO tags releases as RELEASE.<date>, which is not semver, so Go knows its commits only
# as pseudo-versions. The module proxy reachable here serves this one (master, February
# 2026, after the last community release RELEASE.2025-10-15T17-29-55Z); older release
# commits are refused by it.
MINIO_VERSION = "v0.0.0-20260212201848-7aac2a2c5b7c"
# The OpenTelemetry Collector the tracing tests export to: a build of our own by the
# collector's builder (ocb) with only the OTLP receiver and the file exporter, far
# lighter than otelcol-contrib. The core and contrib modules share this version.
OTELCOL_VERSION = "v0.165.0"
# promtool checks and unit-tests the chart's alert rules. Prometheus v3 tags its Go
# module v0.3xx.y (v3.16.0 is v0.316.0).
PROMETHEUS_VERSION = "v0.316.0"
# The real node's NetworkPolicy agent (tests/bench/policy_agent.py): kube-router's firewall
# alone (iptables and ipset). kube-network-policies, which kind's networking uses, queues
# packets with nftables' `queue` expression, which this machine's kernel lacks
# (CONFIG_NFT_QUEUE is off). The proxy serves kube-router v2 only at v2.1.0.
KUBE_ROUTER_VERSION = "v2.1.0"
# Kueue's controller (tests/bench/kueue_controller.py), which admits AgentRuns labelled with
# a LocalQueue through its Workload API; its CRDs are copied from the same module.
KUEUE_VERSION = "v0.17.0"

_DEFAULT_GO = "/usr/local/go/bin/go"
# The control plane's servers, kubectl, and what a node runs (tests/bench/real_node.py).
_KUBERNETES_COMMANDS = (
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kubelet",
    "kube-proxy",
)
# kubeadm sets up a kind node; it gets a wrapper module of its own so that checkouts whose
# list above differs do not re-tidy a shared module back and forth.
_KUBEADM_COMMANDS = ("kubeadm",)


class ProvisioningError(RuntimeError):
    """A binary is neither available nor buildable on this machine."""


@dataclass(frozen=True)
class _Binary:
    name: str
    version: str
    build: Callable[[Path], None]
    """Build the binary into the given path (a temporary name in its final folder)."""
    fits: Callable[[Path], bool]
    """Whether a binary found on PATH (or in KUBEBUILDER_ASSETS) can be used instead."""


def cache_root() -> Path:
    """Where built binaries (and the wrapper modules they are built from) are kept."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "alpineagents" / "testbin"


def _go_env() -> dict[str, str]:
    env = dict(os.environ)
    env["GOTOOLCHAIN"] = "local"  # never download a toolchain: only the module proxy is reachable
    env["GOFLAGS"] = "-mod=mod"
    env["CGO_ENABLED"] = "0"
    return env


def _go() -> str:
    go = shutil.which("go")
    if go is None and os.access(_DEFAULT_GO, os.X_OK):
        # Where Go's own installer puts it; a CI shell may not have it on PATH.
        go = _DEFAULT_GO
    if go is None:
        raise ProvisioningError("the Go toolchain (`go`) is not on PATH")
    return go


def _run_go(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    command = [_go(), *args]
    result = subprocess.run(
        command,
        cwd=cwd,
        env=env or _go_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        tail = "\n".join(result.stdout.splitlines()[-40:])
        raise ProvisioningError(f"`{' '.join(command)}` failed in {cwd}:\n{tail}")
    return result.stdout


def _write_if_changed(path: Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


# --- etcd -----------------------------------------------------------------------------


def _etcd_module() -> Path:
    module = cache_root() / "src" / f"etcd-{ETCD_VERSION}"
    module.mkdir(parents=True, exist_ok=True)
    _write_if_changed(
        module / "main.go",
        "package main\n\n"
        'import (\n\t"os"\n\n\t"go.etcd.io/etcd/server/v3/etcdmain"\n)\n\n'
        "func main() { etcdmain.Main(os.Args) }\n",
    )
    go_mod = module / "go.mod"
    if not go_mod.exists():
        _write_if_changed(go_mod, "module alpineagents.dev/testbin/etcd\n\ngo 1.24\n")
        _run_go(["get", f"go.etcd.io/etcd/server/v3@{ETCD_VERSION}"], module)
        _run_go(["mod", "tidy"], module)
    return module


def _build_etcd(out: Path) -> None:
    module = _etcd_module()
    _run_go(["build", "-trimpath", "-ldflags=-s -w", "-o", str(out), "."], module)


# --- Kubernetes servers ---------------------------------------------------------------


def _kubernetes_module(commands: tuple[str, ...] = _KUBERNETES_COMMANDS, suffix: str = "") -> Path:
    """A wrapper module requiring k8s.io/kubernetes, with its staging modules pinned.

    k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces them with
    ./staging/...; a module that depends on it has to replace each one with the
    published v0.<minor>.<patch> of the same release.
    """
    module = cache_root() / "src" / f"kubernetes-{KUBERNETES_VERSION}{suffix}"
    module.mkdir(parents=True, exist_ok=True)
    # tidy keeps every requirement the commands need (the build tag hides the file from
    # builds while tidy still sees its imports). A cache made when fewer commands were
    # listed is tidied again, under a lock, since builds of several commands share it.
    tools = (
        "//go:build tools\n\npackage tools\n\nimport (\n"
        + "".join(f'\t_ "k8s.io/kubernetes/cmd/{name}"\n' for name in commands)
        + ")\n"
    )
    with _build_lock(f"kubernetes-module-{KUBERNETES_VERSION}{suffix}"):
        go_mod = module / "go.mod"
        tools_go = module / "tools.go"
        if (
            go_mod.exists()
            and (module / "go.sum").exists()
            and tools_go.exists()
            and tools_go.read_text() == tools
        ):
            return module
        if not go_mod.exists():
            _write_go_mod(module)
        _write_if_changed(tools_go, tools)
        _run_go(["mod", "tidy"], module)
    return module


def _write_go_mod(module: Path) -> None:
    info = json.loads(
        _run_go(["mod", "download", "-json", f"k8s.io/kubernetes@{KUBERNETES_VERSION}"], module)
    )
    upstream = Path(info["GoMod"]).read_text()
    staging = sorted(set(re.findall(r"^\s*(k8s\.io/[\w.-]+)\s*=>\s*\./staging/", upstream, re.M)))
    if not staging:
        raise ProvisioningError(f"no staging replace directives found in {info['GoMod']}")
    go_line = re.search(r"^go (\S+)", upstream, re.M)
    lines = [
        "module alpineagents.dev/testbin/kubernetes",
        "",
        f"go {go_line.group(1) if go_line else '1.25.0'}",
        "",
        f"require k8s.io/kubernetes {KUBERNETES_VERSION}",
        "",
        "replace (",
        *(f"\t{name} => {name} {_KUBERNETES_STAGING_VERSION}" for name in staging),
        ")",
        "",
    ]
    pending = module / "go.mod.pending"
    pending.write_text("\n".join(lines))
    pending.replace(module / "go.mod")


def _kubernetes_ldflags() -> str:
    major, minor = KUBERNETES_VERSION.removeprefix("v").split(".")[:2]
    flags = ["-s", "-w"]
    # Both packages report versions: /version reads component-base, clients read client-go.
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {package}.gitVersion={KUBERNETES_VERSION}",
            f"-X {package}.gitMajor={major}",
            f"-X {package}.gitMinor={minor}",
            f"-X {package}.gitTreeState=clean",
        ]
    return " ".join(flags)


def _kubernetes_builder(command: str) -> Callable[[Path], None]:
    def build(out: Path) -> None:
        module = (
            _kubernetes_module(_KUBEADM_COMMANDS, "-kubeadm")
            if command in _KUBEADM_COMMANDS
            else _kubernetes_module()
        )
        _run_go(
            [
                "build",
                "-trimpath",
                f"-ldflags={_kubernetes_ldflags()}",
                "-o",
                str(out),
                f"k8s.io/kubernetes/cmd/{command}",
            ],
            module,
        )

    return build


# --- go install: MinIO and helm -------------------------------------------------------


def _go_install_builder(package: str, version: str, ldflags: str) -> Callable[[Path], None]:
    def build(out: Path) -> None:
        with tempfile.TemporaryDirectory(prefix=".gobin-", dir=out.parent) as gobin:
            env = _go_env()
            env["GOBIN"] = gobin
            # go install pkg@version ignores the current module; run it outside any.
            _run_go(
                ["install", "-trimpath", f"-ldflags={ldflags}", f"{package}@{version}"],
                Path(gobin),
                env,
            )
            built = Path(gobin) / package.rsplit("/", 1)[-1]
            built.replace(out)

    return build


# --- Kueue: the controller by go install, its CRDs from the same module ----------------


_KUEUE_MODULE = "sigs.k8s.io/kueue"


def _build_kueue(out: Path) -> None:
    _go_install_builder(
        f"{_KUEUE_MODULE}/cmd/kueue",
        KUEUE_VERSION,
        f"-s -w -X {_KUEUE_MODULE}/pkg/version.GitVersion={KUEUE_VERSION}",
    )(out)
    _copy_kueue_crds(out.parent / "crds")


def _copy_kueue_crds(folder: Path) -> None:
    source = module_source(_KUEUE_MODULE, KUEUE_VERSION) / "config" / "components" / "crd"
    partial = folder.parent / f".crds.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(source / "bases", partial)
    partial.chmod(0o755)  # the module cache's folders and files are read-only
    for path in partial.iterdir():
        path.chmod(0o644)
    partial.replace(folder)


def kueue_crds() -> Path:
    """The folder of Kueue's CRDs (one YAML file each), of the pinned version, cached
    beside its controller; provisions the controller if need be."""
    folder = pinned_path("kueue").parent / "crds"
    if not folder.is_dir():
        with _build_lock("kueue-crds"):
            if not folder.is_dir():
                _copy_kueue_crds(folder)
    return folder


# --- the OpenTelemetry Collector: ocb builds a distribution from a manifest ------------


_OTELCOL_MODULES = (
    "go.opentelemetry.io/collector/receiver/otlpreceiver",
    "github.com/open-telemetry/opentelemetry-collector-contrib/exporter/fileexporter",
)
"""The collector's components: the OTLP receiver and the file exporter."""


def _otelcol_manifest(out_dir: Path) -> str:
    receiver, exporter = _OTELCOL_MODULES
    return "\n".join(
        [
            "dist:",
            "  name: otelcol",
            "  description: OTLP in, a file out (the alpineagents tracing tests)",
            f"  version: {OTELCOL_VERSION.removeprefix('v')}",
            f"  output_path: {out_dir}",
            "receivers:",
            f"  - gomod: {receiver} {OTELCOL_VERSION}",
            "exporters:",
            f"  - gomod: {exporter} {OTELCOL_VERSION}",
            "",
        ]
    )


def _build_otelcol(out: Path) -> None:
    builder_out = out.parent / ".ocb"
    builder_out.mkdir(exist_ok=True)
    _go_install_builder("go.opentelemetry.io/collector/cmd/builder", OTELCOL_VERSION, "-s -w")(
        builder_out / "builder"
    )
    source = cache_root() / "src" / f"otelcol-{OTELCOL_VERSION}"
    source.mkdir(parents=True, exist_ok=True)
    manifest = source / "manifest.yaml"
    _write_if_changed(manifest, _otelcol_manifest(source / "dist"))
    # ocb only writes the sources here: its own `go mod tidy` also resolves the tests of
    # every dependency, and the module proxy refuses one of those (fileexporter's tests
    # import contrib's otlpencodingextension, "403 not available"). `go build -mod=mod`
    # resolves only what the binary imports.
    result = subprocess.run(
        [
            str(builder_out / "builder"),
            f"--config={manifest}",
            "--skip-compilation",
            "--skip-get-modules",
        ],
        cwd=source,
        env=_go_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        tail = "\n".join(result.stdout.splitlines()[-40:])
        raise ProvisioningError(f"the collector builder (ocb) failed in {source}:\n{tail}")
    dist = source / "dist"
    if not (dist / "go.mod").exists():
        # With --skip-get-modules this ocb writes no go.mod: a module requiring the two
        # components at the collector's version (their go.mod pins the core modules).
        _run_go(["mod", "init", "otelcol"], dist)
        _run_go(["get", *(f"{module}@{OTELCOL_VERSION}" for module in _OTELCOL_MODULES)], dist)
    _run_go(["build", "-trimpath", "-ldflags=-s -w", "-o", str(out), "."], dist)


# --- version checks for binaries found on PATH -----------------------------------------


def _output(args: list[str]) -> str:
    try:
        result = subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return result.stdout + result.stderr


def _minor(version: str) -> tuple[int, int] | None:
    found = re.search(r"v?(\d+)\.(\d+)", version)
    return (int(found.group(1)), int(found.group(2))) if found else None


def _same_minor(pinned: str, version_args: list[str], pattern: str) -> Callable[[Path], bool]:
    def fits(path: Path) -> bool:
        found = re.search(pattern, _output([str(path), *version_args]))
        return found is not None and _minor(found.group(1)) == _minor(pinned)

    return fits


def _kubectl_fits(path: Path) -> bool:
    # The machine image ships kubectl 1.32; everything the bench asks of kubectl (apply,
    # dry-run=server, wait, version) works across this skew, so any 1.30+ is accepted
    # rather than spending a cold build on it.
    found = re.search(
        r'"gitVersion":\s*"v(\d+)\.(\d+)', _output([str(path), "version", "--client", "-o", "json"])
    )
    return found is not None and (int(found.group(1)), int(found.group(2))) >= (1, 30)


def _minio_fits(path: Path) -> bool:
    # Conditional writes (If-None-Match: *) arrived in MinIO in late 2024.
    found = re.search(r"RELEASE\.(\d{4})-(\d{2})", _output([str(path), "--version"]))
    return found is not None and (int(found.group(1)), int(found.group(2))) >= (2025, 1)


_BINARIES: dict[str, _Binary] = {
    "etcd": _Binary(
        "etcd",
        ETCD_VERSION,
        _build_etcd,
        _same_minor(ETCD_VERSION, ["--version"], r"etcd Version: (\S+)"),
    ),
    "kube-apiserver": _Binary(
        "kube-apiserver",
        KUBERNETES_VERSION,
        _kubernetes_builder("kube-apiserver"),
        _same_minor(KUBERNETES_VERSION, ["--version"], r"Kubernetes (v\S+)"),
    ),
    "kube-controller-manager": _Binary(
        "kube-controller-manager",
        KUBERNETES_VERSION,
        _kubernetes_builder("kube-controller-manager"),
        _same_minor(KUBERNETES_VERSION, ["--version"], r"Kubernetes (v\S+)"),
    ),
    "kubectl": _Binary(
        "kubectl", KUBERNETES_VERSION, _kubernetes_builder("kubectl"), _kubectl_fits
    ),
    # A node: tests/bench/real_node.py runs these against the control plane above.
    **{
        name: _Binary(
            name,
            KUBERNETES_VERSION,
            _kubernetes_builder(name),
            _same_minor(KUBERNETES_VERSION, ["--version"], r"Kubernetes (v\S+)"),
        )
        for name in ("kube-scheduler", "kube-proxy", "kubelet", "kubeadm")
    },
    "minio": _Binary(
        "minio",
        MINIO_VERSION,
        _go_install_builder("github.com/minio/minio", MINIO_VERSION, "-s -w"),
        _minio_fits,
    ),
    "helm": _Binary(
        "helm",
        HELM_VERSION,
        _go_install_builder(
            "helm.sh/helm/v3/cmd/helm",
            HELM_VERSION,
            f"-s -w -X helm.sh/helm/v3/internal/version.version={HELM_VERSION}",
        ),
        _same_minor(HELM_VERSION, ["version", "--short"], r"(v3\.\d+\.\d+)"),
    ),
    "otelcol": _Binary(
        "otelcol",
        OTELCOL_VERSION,
        _build_otelcol,
        lambda path: False,  # ours has exactly the receiver and exporter the tests use
    ),
    "promtool": _Binary(
        "promtool",
        PROMETHEUS_VERSION,
        _go_install_builder(
            "github.com/prometheus/prometheus/cmd/promtool", PROMETHEUS_VERSION, "-s -w"
        ),
        lambda path: False,  # the rule tests' syntax follows the pinned version
    ),
    # kind's own Makefile stamps only the version; the node image it wants by default is
    # irrelevant here (the bench always passes --image).
    "kind": _Binary(
        "kind",
        KIND_VERSION,
        _go_install_builder("sigs.k8s.io/kind", KIND_VERSION, "-s -w"),
        lambda path: _output([str(path), "version"]).startswith(f"kind {KIND_VERSION} "),
    ),
    "coredns": _Binary(
        "coredns",
        COREDNS_VERSION,
        _go_install_builder("github.com/coredns/coredns", COREDNS_VERSION, "-s -w"),
        lambda path: False,  # only ever copied into an image: always the pinned build
    ),
    "crictl": _Binary(
        "crictl",
        CRICTL_VERSION,
        _go_install_builder("sigs.k8s.io/cri-tools/cmd/crictl", CRICTL_VERSION, "-s -w"),
        lambda path: False,
    ),
    "local-path-provisioner": _Binary(
        "local-path-provisioner",
        LOCAL_PATH_PROVISIONER_VERSION,
        _go_install_builder(
            "github.com/rancher/local-path-provisioner", LOCAL_PATH_PROVISIONER_VERSION, "-s -w"
        ),
        lambda path: False,
    ),
    "kube-router": _Binary(
        "kube-router",
        KUBE_ROUTER_VERSION,
        _go_install_builder(
            "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router",
            KUBE_ROUTER_VERSION,
            "-s -w",
        ),
        lambda path: False,  # the bench's policy agent is always the pinned build
    ),
    "kueue": _Binary(
        "kueue",
        KUEUE_VERSION,
        _build_kueue,
        lambda path: False,  # its CRDs must be of the same version: always the pinned build
    ),
}

#: Every binary :func:`ensure_all` provisions, in build order.
NAMES: tuple[str, ...] = tuple(_BINARIES)


def cached_path(name: str) -> Path:
    """Where the pinned build of ``name`` lives in the cache (whether built yet or not)."""
    binary = _BINARIES[name]
    return cache_root() / f"{binary.name}-{binary.version}" / binary.name


def _found_elsewhere(binary: _Binary) -> Path | None:
    candidates: list[Path] = []
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets:
        candidates.append(Path(assets) / binary.name)
    on_path = shutil.which(binary.name)
    if on_path:
        candidates.append(Path(on_path))
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK) and binary.fits(candidate):
            return candidate
    return None


@contextmanager
def _build_lock(name: str) -> Iterator[None]:
    cache_root().mkdir(parents=True, exist_ok=True)
    with (cache_root() / f".{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _provision(name: str, reuse: bool = True) -> tuple[Path, str]:
    """The binary's path and how it was obtained ("cached", "reused", "built").

    Without ``reuse`` a fitting binary on PATH is ignored: the pinned build is made.
    """
    if name not in _BINARIES:
        raise KeyError(f"unknown test binary {name!r}; known: {', '.join(NAMES)}")
    binary = _BINARIES[name]
    final = cached_path(name)
    if final.is_file():
        return final, "cached"
    elsewhere = _found_elsewhere(binary) if reuse else None
    if elsewhere is not None:
        return elsewhere, "reused"
    with _build_lock(name):
        if final.is_file():  # another process built it while we waited for the lock
            return final, "cached"
        final.parent.mkdir(parents=True, exist_ok=True)
        partial = final.parent / f".{binary.name}.partial-{os.getpid()}"
        try:
            binary.build(partial)
            partial.chmod(0o755)
            partial.replace(final)
        finally:
            partial.unlink(missing_ok=True)
    return final, "built"


def binary_path(name: str) -> Path:
    """Path to a runnable ``name`` (etcd, kube-apiserver, ...), building it if missing.

    Raises :class:`ProvisioningError` when it is not available and cannot be built.
    """
    return _provision(name)[0]


def module_source(module: str, version: str) -> Path:
    """The folder of ``module@version`` in Go's module cache, downloaded from the proxy."""
    scratch = Path(tempfile.gettempdir())
    info = json.loads(_run_go(["mod", "download", "-json", f"{module}@{version}"], scratch))
    return Path(info["Dir"])


def pinned_path(name: str) -> Path:
    """Path to the pinned version of ``name`` built from source (never one from PATH),
    for what must be exactly that version, such as the binaries in a kind node image."""
    return _provision(name, reuse=False)[0]


def ensure_all(names: tuple[str, ...] = NAMES, report: bool = False) -> dict[str, Path]:
    """Provision every binary in ``names``; with ``report``, print what happened to each."""
    paths: dict[str, Path] = {}
    for name in names:
        started = time.monotonic()
        path, how = _provision(name)
        paths[name] = path
        if report:
            elapsed = time.monotonic() - started
            print(
                f"{name:<24} {_BINARIES[name].version:<36} {how:<7} {elapsed:7.1f}s  {path}",
                flush=True,
            )
    return paths


def main(argv: list[str] | None = None) -> int:
    """Command line: provision the named binaries (default: all) and print a line each."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.bench.testbin", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "names", nargs="*", help=f"binaries to provision (default: all of {', '.join(NAMES)})"
    )
    args = parser.parse_args(argv)
    names = tuple(args.names) or NAMES
    unknown = sorted(set(names) - set(NAMES))
    if unknown:
        parser.error(f"unknown binaries {', '.join(unknown)}; known: {', '.join(NAMES)}")
    started = time.monotonic()
    try:
        ensure_all(names, report=True)
    except ProvisioningError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"{'total':<69} {time.monotonic() - started:7.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
