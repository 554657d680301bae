"""Kueue's controller, built from its Go module (:mod:`tests.bench.testbin`), run as a
process outside the cluster against the bench's kube-apiserver.

- ``kueue`` (session fixture, needs ``control_plane``): its CRDs installed, the controller
  running and ready.

Kueue 0.17 serves its webhooks and manages their certificates itself. The operator makes
its Workloads directly, so no job webhook is needed: no webhook configuration is
registered, and the webhook server only listens on loopback. Its certificate manager
still runs (without it, Kueue reads the metrics server's certificate from a fixed path
under /etc): it fills a Secret in ``kueue-system`` and waits for the certificate to
appear in its ``certDir``, where a kubelet would mount that Secret; here the fixture
copies it there. Kueue also injects its CA into the CRDs' conversion webhooks, so the
CRDs that convert get a conversion stanza pointing at its (never created) Service, as in
Kueue's own install; nothing here asks for the older API version, so it is never called.
"""

from __future__ import annotations

import base64
import json
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.bench.control_plane import ControlPlane
from tests.bench.infra import free_port, missing
from tests.bench.server_process import ServerFailed, ServerProcess
from tests.bench.testbin import ProvisioningError, binary_path, kueue_crds

NAMESPACE = "kueue-system"
_SERVICE = "kueue-webhook-service"
_SECRET = "kueue-webhook-server-cert"
_CONVERTED = ("localqueues", "clusterqueues", "workloads", "cohorts", "multikueueclusters")
"""The CRDs Kueue's certificate manager injects its CA into (pkg/util/cert)."""


@dataclass(frozen=True)
class Kueue:
    """The running controller."""

    process: ServerProcess
    health_port: int


def install_crds(plane: ControlPlane, folder: Path) -> list[str]:
    """Apply Kueue's CRDs (copies in ``folder``, with the conversion stanzas)."""
    folder.mkdir(parents=True, exist_ok=True)
    for source in sorted(kueue_crds().glob("*.yaml")):
        crd = yaml.safe_load(source.read_text())
        if crd["spec"]["names"]["plural"] in _CONVERTED:
            crd["spec"]["conversion"] = {
                "strategy": "Webhook",
                "webhook": {
                    "conversionReviewVersions": ["v1"],
                    "clientConfig": {
                        "service": {"name": _SERVICE, "namespace": NAMESPACE, "path": "/convert"}
                    },
                },
            }
        (folder / source.name).write_text(yaml.safe_dump(crd))
    return plane.apply_crds(folder)


def _config(cert_dir: Path, webhook_port: int, health_port: int) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "namespace": NAMESPACE,
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
            "metrics": {"bindAddress": "0"},
            "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {
                "enable": True,
                "webhookServiceName": _SERVICE,
                "webhookSecretName": _SECRET,
            },
            # The operator makes Workloads itself; only the default framework is set up
            # (it needs nothing beyond the core APIs).
            "integrations": {"frameworks": ["batch/job"]},
            "featureGates": {"VisibilityOnDemand": False},
            # Admission fair sharing, for a ClusterQueue whose admissionScope asks for it
            # (tests/bench/kueue_fair_share.py; the others are as without it): usage
            # sampled each second (the default, 5 minutes, is for hour-long jobs), and a
            # half-life longer than a test, so what is compared is the usage so far.
            "admissionFairSharing": {"usageHalfLifeTime": "10m", "usageSamplingInterval": "10s"},
        }
    )


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
            return int(response.status) == 200
    except OSError:
        return False


def _mount_certificate(plane: ControlPlane, cert_dir: Path, stop: threading.Event) -> None:
    """Copy the certificate Kueue writes into its Secret to its certDir, as a kubelet's
    Secret volume would."""
    while not stop.is_set():
        found = plane.kubectl("get", "secret", _SECRET, "-n", NAMESPACE, "-o", "json", check=False)
        data = (json.loads(found.stdout or "{}").get("data") or {}) if found.returncode == 0 else {}
        if "tls.crt" in data and "tls.key" in data:
            for key in ("tls.key", "tls.crt"):  # the key first: Kueue waits for the crt
                path = cert_dir / key
                path.write_bytes(base64.b64decode(data[key]))
                path.chmod(0o600)
            return
        stop.wait(0.5)


def start_kueue(plane: ControlPlane, workdir: Path) -> Kueue:
    """Install Kueue's CRDs on ``plane`` and start its controller; returns once it is
    ready. The caller stops the process."""
    binary = binary_path("kueue")
    install_crds(plane, workdir / "kueue-crds")
    plane.kubectl("create", "namespace", NAMESPACE, check=False)
    plane.kubectl("create", "secret", "generic", _SECRET, "-n", NAMESPACE, check=False)
    cert_dir = workdir / "kueue-certs"
    cert_dir.mkdir(mode=0o700, exist_ok=True)
    health_port = free_port()
    config = workdir / "kueue-config.yaml"
    config.write_text(_config(cert_dir, free_port(), health_port))
    process = ServerProcess(
        "kueue",
        [str(binary), f"--config={config}", "--zap-log-level=2"],
        workdir / "kueue.log",
        env={"KUBECONFIG": str(plane.kubeconfig), "PATH": "/usr/bin:/bin"},
    )
    process.start()
    stop = threading.Event()
    mounting = threading.Thread(target=_mount_certificate, args=(plane, cert_dir, stop))
    mounting.start()
    try:
        process.wait_until(lambda: _ready(health_port), "ready (/readyz)", timeout=180)
    except ServerFailed:
        process.stop()
        raise
    finally:
        stop.set()
        mounting.join()
    return Kueue(process, health_port)


@pytest.fixture(scope="session")
def kueue(control_plane: ControlPlane) -> Iterator[Kueue]:
    """Kueue's controller on the session's control plane (CRDs installed, ready)."""
    try:
        binary_path("kueue")
    except ProvisioningError as error:
        missing("Kueue's controller", f"run `python -m tests.bench.testbin kueue`: {error}")
    try:
        running = start_kueue(control_plane, control_plane.workdir)
    except ServerFailed as error:
        pytest.fail(f"Kueue's controller did not start: {error}")
    try:
        yield running
    finally:
        running.process.stop()
