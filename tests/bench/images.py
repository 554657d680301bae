"""The container images the real node runs, built locally and cached by content.

Run ``python -m tests.bench.images`` (``scripts/test`` does) to install the Debian packages
the node needs (:mod:`tests.bench.host_packages`) and build (or reuse) every image; the
``real_node`` fixture imports the same archives into its containerd.

- ``python-base``: Debian bookworm's own CPython 3.11 (``/usr/bin/python3``, packages in
  ``/usr/lib/python3``), made by ``mmdebstrap`` from Debian's mirror, since no container
  registry is reachable here. It is *not* the official ``python:3.11-slim-bookworm`` image
  the Dockerfile defaults to (that one has its own CPython in ``/usr/local``).
- ``alpineagents``: the project's own ``Dockerfile``, unmodified, with the base passed as
  the ``PYTHON_IMAGE`` build argument.
- ``upgrade``: our image once more with the next version (``ALPINEAGENTS_VERSION`` and
  its version label bumped to :data:`UPGRADE_VERSION`, nothing else changed), for tests
  that upgrade the chart from one image to another while runs go on.
- ``pause``: the pod sandbox process (``node/pause.c``, static) alone in a scratch image.
- ``minio``: the MinIO binary that :mod:`tests.bench.testbin` builds, on the base, for the
  chart's bundled MinIO (``minio.image`` in the chart's values).

Each image is a ``docker save`` archive under
``${XDG_CACHE_HOME:-~/.cache}/alpineagents/images/``, named by a hash of everything it is
made from (the Dockerfile, the build context, the base's recipe and the machine's CA
certificates, the MinIO binary), so a warm run builds nothing and starts no daemon. A
cold run starts a private ``dockerd`` (its own sockets and data folder, no iptables rules,
no bridge: builds use the host's network) and stops it by pid when it is done.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.bench.host_cleanup import remove_cgroup
from tests.bench.host_packages import ensure_packages
from tests.bench.infra import provisioning_failed
from tests.bench.server_process import ServerFailed, ServerProcess
from tests.bench.testbin import ProvisioningError, binary_path, cache_root
from tests.paths import REPO

NODE_FILES = Path(__file__).resolve().parent / "node"

BASE_SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-pip", "python-is-python3", "ca-certificates")
# The machine's own CA certificates (an intercepting proxy's, for one): without them pip
# inside `docker build` cannot reach the package index.
EXTRA_CA_CERTIFICATES = Path("/usr/local/share/ca-certificates")
APT_SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))

_PAUSE_DOCKERFILE = 'FROM scratch\nCOPY pause /pause\nUSER 65535:65535\nENTRYPOINT ["/pause"]\n'
UPGRADE_VERSION = "0.1.1-upgrade"
"""The version the ``upgrade`` image reports (ours reports the project's own)."""
_UPGRADE_DOCKERFILE = (
    "ARG BASE\nFROM ${BASE}\n"
    f'LABEL org.opencontainers.image.version="{UPGRADE_VERSION}"\n'
    f"ENV ALPINEAGENTS_VERSION={UPGRADE_VERSION}\n"
)
_MINIO_DOCKERFILE = "ARG BASE\nFROM ${BASE}\nCOPY minio /usr/local/bin/minio\nUSER 65532:65532\n"
# Where the build containers' cgroups go (removed again when the daemon stops).
_CGROUP = "alpineagents-images"
# Debian's CLI: it has BuildKit built in (the newer CLI in /usr/local/bin wants buildx).
_DOCKER_CLI = "/usr/bin/docker"


@dataclass(frozen=True)
class Image:
    """One image: its reference (repository:tag) and the archive holding it."""

    name: str
    ref: str
    archive: Path

    @property
    def repository(self) -> str:
        return self.ref.rsplit(":", 1)[0]

    @property
    def tag(self) -> str:
        return self.ref.rsplit(":", 1)[1]


def images_root() -> Path:
    """Where image archives (and the private dockerd's data) are kept."""
    return cache_root().parent / "images"


# --------------------------------------------------------------------------- content hashes


def _files(root: Path, patterns: list[str]) -> list[Path]:
    """Files under ``root`` a build context with this .dockerignore holds (``*`` first,
    then ``!include`` and exclude lines, the Dockerfile's own rules in their order)."""
    chosen = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        relative = path.relative_to(root).as_posix()
        keep = True
        for pattern in patterns:
            negated = pattern.startswith("!")
            body = pattern.removeprefix("!").rstrip("/")
            glob = body.replace("**/", "*")
            if fnmatch.fnmatch(relative, glob) or relative.startswith(body + "/"):
                keep = negated
        if keep:
            chosen.append(path)
    return chosen


def _digest(*parts: bytes | str | Path) -> str:
    digest = hashlib.sha256()
    for part in parts:
        if isinstance(part, Path):
            # The name inside the checkout, not where the checkout is: every worktree of
            # one machine shares the cache, and equal content must give equal images.
            name = part.relative_to(REPO) if part.is_relative_to(REPO) else part.name
            digest.update(str(name).encode() + b"\0")
            with part.open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
        else:
            digest.update(part.encode() if isinstance(part, str) else part)
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def base_inputs() -> list[bytes | str | Path]:
    """What the base image is made from (its recipe, apt sources, extra CA certificates)."""
    sources: list[Path] = []
    for place in APT_SOURCES:
        sources += sorted(place.glob("*")) if place.is_dir() else [place] if place.exists() else []
    certificates = (
        sorted(EXTRA_CA_CERTIFICATES.glob("*.crt")) if EXTRA_CA_CERTIFICATES.is_dir() else []
    )
    return ["base-recipe-1", BASE_SUITE, *BASE_PACKAGES, *sources, *certificates]


def _context_files() -> list[Path]:
    ignore = REPO / ".dockerignore"
    patterns = [
        line.strip()
        for line in (ignore.read_text().splitlines() if ignore.exists() else [])
        if line.strip() and not line.startswith("#")
    ]
    return _files(REPO, patterns)


def plan() -> dict[str, Image]:
    """Every image with the reference and archive its current inputs give it."""
    root = images_root()
    base = _digest(*base_inputs())
    ours = _digest(base, REPO / "Dockerfile", *_context_files())
    upgrade = _digest(ours, _UPGRADE_DOCKERFILE)
    pause = _digest(_PAUSE_DOCKERFILE, NODE_FILES / "pause.c")
    minio = _digest(base, _MINIO_DOCKERFILE, binary_path("minio"))
    return {
        "python-base": Image(
            "python-base",
            f"alpineagents-bench/python-base:{base}",
            root / f"python-base-{base}.tar",
        ),
        "alpineagents": Image(
            "alpineagents", f"alpineagents:bench-{ours}", root / f"alpineagents-{ours}.tar"
        ),
        "upgrade": Image(
            "upgrade", f"alpineagents-bench/upgrade:{upgrade}", root / f"upgrade-{upgrade}.tar"
        ),
        "pause": Image("pause", f"alpineagents-bench/pause:{pause}", root / f"pause-{pause}.tar"),
        "minio": Image("minio", f"alpineagents-bench/minio:{minio}", root / f"minio-{minio}.tar"),
    }


# --------------------------------------------------------------------------- the builder


class Docker:
    """A private dockerd for builds, started on first use and stopped by :meth:`stop`.

    The defaults are the image builds' daemon; :mod:`tests.bench.kind_cluster` runs another
    one (its own folders and cgroup, a bridge for kind's network, a runtime of its own).
    """

    def __init__(
        self,
        run_dir: Path = Path("/run/alpineagents-images"),
        data: Path | None = None,
        cgroup: str = _CGROUP,
        daemon_args: tuple[str, ...] = (
            # Builds only: no rules in the machine's firewall, no bridge, no NAT.
            "--iptables=false",
            "--ip-forward=false",
            "--ip-masq=false",
            "--bridge=none",
        ),
    ) -> None:
        self.run_dir = run_dir
        self.socket = self.run_dir / "docker.sock"
        self.data = data or images_root() / "docker"
        self.cgroup = cgroup
        self.daemon_args = daemon_args
        self._daemon: ServerProcess | None = None
        self._borrowed = False

    @property
    def env(self) -> dict[str, str]:
        """Environment for a docker CLI (or kind) talking to this daemon."""
        return {
            **os.environ,
            "DOCKER_HOST": f"unix://{self.socket}",
            "DOCKER_BUILDKIT": "1",
            "DOCKER_CONFIG": str(self.run_dir / "cli"),
        }

    def _command(self, *args: str) -> list[str]:
        return [_DOCKER_CLI, f"--host=unix://{self.socket}", *args]

    def run(self, *args: str, cwd: Path | None = None) -> str:
        """Run the docker CLI against the private daemon (started if needed)."""
        self.start()
        result = subprocess.run(
            self._command(*args),
            cwd=cwd,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            tail = "\n".join(result.stdout.splitlines()[-40:])
            raise ProvisioningError(f"`docker {' '.join(args)}` failed:\n{tail}")
        return result.stdout

    def has(self, ref: str) -> bool:
        self.start()
        result = subprocess.run(
            self._command("image", "inspect", ref), capture_output=True, check=False
        )
        return result.returncode == 0

    def _answers(self) -> bool:
        probe = self._command("version", "--format={{.Server.Version}}")
        return subprocess.run(probe, capture_output=True, check=False).returncode == 0

    def start(self) -> None:
        """Start the daemon; one another process started on this socket is used as it is
        (and left running by :meth:`stop`)."""
        if self._daemon is not None or self._borrowed:
            return
        if not Path(_DOCKER_CLI).exists() or shutil.which("dockerd") is None:
            raise ProvisioningError(f"docker.io is not installed ({_DOCKER_CLI}, dockerd)")
        if self.socket.exists() and self._answers():
            self._borrowed = True
            return
        self.run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.data.mkdir(mode=0o700, parents=True, exist_ok=True)
        daemon = ServerProcess(
            "dockerd",
            [
                "dockerd",
                f"--host=unix://{self.socket}",
                f"--data-root={self.data}",
                f"--exec-root={self.run_dir / 'exec'}",
                f"--pidfile={self.run_dir / 'dockerd.pid'}",
                *self.daemon_args,
                "--storage-driver=overlay2",
                "--exec-opt=native.cgroupdriver=cgroupfs",
                f"--cgroup-parent={self.cgroup}",
            ],
            self.data.parent / f"{self.data.name}d.log",
            stop_grace=30,
        )
        self._daemon = daemon
        daemon.start()
        try:
            daemon.wait_until(self._answers, "answering", timeout=120)
        except ServerFailed as error:
            self.stop()
            raise ProvisioningError(str(error)) from error

    def stop(self) -> None:
        self._borrowed = False
        if self._daemon is not None:
            self._daemon.stop()
            self._daemon = None
            remove_cgroup(self.cgroup)
            shutil.rmtree(self.run_dir, ignore_errors=True)


def _save(docker: Docker, image: Image) -> None:
    """Save ``image`` as its archive; earlier builds of it go, from the cache and docker."""
    partial = image.archive.with_name(f".{image.archive.name}.partial-{os.getpid()}")
    try:
        docker.run("save", "--output", str(partial), image.ref)
        partial.replace(image.archive)
    finally:
        partial.unlink(missing_ok=True)
    _forget_earlier(image)
    docker.run("image", "prune", "--force")


KEEP_BUILDS = 3
"""Archives kept per image: several checkouts (git worktrees) of one machine share the
cache, each with its own build of our image, and must not rebuild each other's."""


def _forget_earlier(image: Image) -> None:
    """Delete this image's archives beyond the newest :data:`KEEP_BUILDS`."""
    builds = sorted(
        image.archive.parent.glob(f"{image.name}-*.tar"),
        key=lambda path: path.stat().st_mtime,
        reverse=True,
    )
    for archive in builds[KEEP_BUILDS:]:
        if archive != image.archive:
            archive.unlink(missing_ok=True)


def cached_refs() -> set[str]:
    """References of every image archive in the cache (any checkout's builds)."""
    refs = set()
    for archive in images_root().glob("*-*.tar"):
        name, _, digest = archive.stem.rpartition("-")
        refs.add(
            f"alpineagents:bench-{digest}"
            if name == "alpineagents"
            else f"alpineagents-bench/{name}:{digest}"
        )
    return refs


def _build_base(image: Image) -> None:
    """mmdebstrap a minimal Debian with its Python, ready for pip (see the module doc)."""
    if shutil.which("mmdebstrap") is None:
        raise ProvisioningError("mmdebstrap is not installed")
    partial = image.archive.with_name(f".{image.archive.name}.partial-{os.getpid()}.tar")
    command = [
        "mmdebstrap",
        "--variant=minbase",
        "--quiet",
        f"--include={','.join(BASE_PACKAGES)}",
        "--dpkgopt=path-exclude=/usr/share/doc/*",
        "--dpkgopt=path-exclude=/usr/share/man/*",
        "--dpkgopt=path-exclude=/usr/share/locale/*",
        # Debian marks its Python as managed by apt; in an image pip owns /usr/local.
        '--customize-hook=rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED',
        f"--customize-hook=if [ -d {EXTRA_CA_CERTIFICATES} ]; then cp -r"
        f' {EXTRA_CA_CERTIFICATES}/. "$1"/usr/local/share/ca-certificates/; fi',
        '--customize-hook=chroot "$1" update-ca-certificates',
        BASE_SUITE,
        str(partial),
    ]
    # The mirrors this machine's apt uses (deb822 .sources files or a sources.list).
    command += [str(p) for p in apt_source_files()]
    try:
        result = subprocess.run(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False
        )
        if result.returncode != 0:
            tail = "\n".join(result.stdout.splitlines()[-40:])
            raise ProvisioningError(f"`{' '.join(command)}` failed:\n{tail}")
        partial.replace(image.archive)
    finally:
        partial.unlink(missing_ok=True)
    _forget_earlier(image)


def apt_source_files() -> list[Path]:
    """The apt source files of this machine, which mmdebstrap builds use as their mirrors."""
    files = []
    for place in APT_SOURCES:
        if place.is_dir():
            files += sorted(p for p in place.iterdir() if p.suffix in (".list", ".sources"))
        elif place.exists() and place.read_text().strip():
            files.append(place)
    return files


def _ensure_base_in(docker: Docker, base: Image) -> None:
    if not docker.has(base.ref):
        docker.run("import", str(base.archive), base.ref)


def _build_ours(docker: Docker, image: Image, base: Image) -> None:
    _ensure_base_in(docker, base)
    docker.run(
        "build",
        "--network=host",
        f"--build-arg=PYTHON_IMAGE={base.ref}",
        f"--tag={image.ref}",
        "--file",
        str(REPO / "Dockerfile"),
        str(REPO),
    )
    _save(docker, image)


def _build_small(
    docker: Docker, image: Image, dockerfile: str, files: dict[str, Path], *args: str
) -> None:
    with tempfile.TemporaryDirectory(prefix=".context-", dir=images_root()) as context:
        (Path(context) / "Dockerfile").write_text(dockerfile)
        for name, source in files.items():
            shutil.copy2(source, Path(context) / name)
        docker.run("build", "--network=host", f"--tag={image.ref}", *args, context)
    _save(docker, image)


def _build_pause(docker: Docker, image: Image) -> None:
    with tempfile.TemporaryDirectory(prefix=".pause-", dir=images_root()) as scratch:
        binary = Path(scratch) / "pause"
        compiler = shutil.which("cc") or shutil.which("gcc")
        if compiler is None:
            raise ProvisioningError("no C compiler (cc) for the pause image: apt-get install gcc")
        result = subprocess.run(
            [
                compiler,
                "-static",
                "-Os",
                "-s",
                "-Wall",
                "-o",
                str(binary),
                str(NODE_FILES / "pause.c"),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise ProvisioningError(f"compiling pause.c failed:\n{result.stderr}")
        _build_small(docker, image, _PAUSE_DOCKERFILE, {"pause": binary})


def _build_upgrade(docker: Docker, image: Image, ours: Image) -> None:
    if not docker.has(ours.ref):
        docker.run("load", "--input", str(ours.archive))
    _build_small(docker, image, _UPGRADE_DOCKERFILE, {}, f"--build-arg=BASE={ours.ref}")


def _build_minio(docker: Docker, image: Image, base: Image) -> None:
    _ensure_base_in(docker, base)
    _build_small(
        docker,
        image,
        _MINIO_DOCKERFILE,
        {"minio": binary_path("minio")},
        f"--build-arg=BASE={base.ref}",
    )


@contextlib.contextmanager
def images_lock(name: str = ".lock") -> Iterator[None]:
    """An exclusive lock on the file ``name`` in the images' folder, across processes
    (two checkouts or test sessions building or using the same images)."""
    import fcntl

    images_root().mkdir(parents=True, exist_ok=True)
    with (images_root() / name).open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def ensure_images(report: bool = False) -> dict[str, Image]:
    """Build whatever image is not cached yet; with ``report``, print a line for each."""
    images = plan()
    with images_lock():
        docker = Docker()
        try:
            for name, image in images.items():
                started = time.monotonic()
                how = "cached"
                if not image.archive.exists():
                    how = "built"
                    if name == "python-base":
                        _build_base(image)
                    elif name == "alpineagents":
                        _build_ours(docker, image, images["python-base"])
                    elif name == "upgrade":
                        _build_upgrade(docker, image, images["alpineagents"])
                    elif name == "pause":
                        _build_pause(docker, image)
                    else:
                        _build_minio(docker, image, images["python-base"])
                if report:
                    elapsed = time.monotonic() - started
                    print(f"{name:<24} {image.ref:<52} {how:<7} {elapsed:7.1f}s", flush=True)
        finally:
            docker.stop()
    return images


def main(argv: list[str] | None = None) -> int:
    """Command line: the node's packages and images, a line each."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.bench.images", description=__doc__.split("\n\n")[0]
    )
    parser.parse_args(argv)
    started = time.monotonic()
    try:
        installed = ensure_packages()
        print(
            f"{'packages':<24} {', '.join(installed) or 'all present':<52} "
            f"{'built' if installed else 'cached':<7} {time.monotonic() - started:7.1f}s",
            flush=True,
        )
        ensure_images(report=True)
    except ProvisioningError as error:
        return provisioning_failed(error, "real-node")
    print(f"{'total':<93} {time.monotonic() - started:7.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
