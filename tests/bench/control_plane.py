"""A real Kubernetes control plane for tests: etcd plus kube-apiserver on loopback.

Fixtures:

- ``control_plane`` (session): a :class:`ControlPlane` with an admin kubeconfig. There
  are no nodes and no kubelet, so pods are stored but never run; the ServiceAccount
  admission plugin is off so pods can be created without the service-account controller.
- ``controller_manager`` (session, opt-in): kube-controller-manager running only the
  garbage collector and namespace controllers against ``control_plane``, for tests that
  need owner-reference cascading deletes or namespace deletion to finish.

The admin identity is a client certificate in group ``system:masters``, so it is
authorized by RBAC's bootstrap policy without any binding.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import shutil
import ssl
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.bench.infra import free_port, missing
from tests.bench.server_process import ServerFailed, ServerProcess
from tests.bench.testbin import ProvisioningError, binary_path
from tests.paths import REPO

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

_SERVICE_CIDR = "10.96.0.0/16"
_HOW_TO_FIX = "run `python -m tests.bench.testbin` (needs Go and the Go module proxy)"


@dataclass(frozen=True)
class _Pem:
    cert: bytes
    key: bytes


@dataclass(frozen=True)
class _Certificates:
    ca: _Pem
    serving: _Pem
    admin: _Pem
    controller_manager: _Pem
    service_account_key: bytes
    service_account_public: bytes
    clients: dict[str, _Pem] = field(default_factory=dict)
    """More client certificates, by the name the caller gave each."""


ClientIdentity = tuple[str, str | None]
"""A client certificate's user (common name) and group (organization, or None)."""

_SERVING_NAMES = ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc")
_SERVING_IPS = ("127.0.0.1", "10.96.0.1")  # loopback, and the service CIDR's first address


def _make_certificates(
    scratch: Path,
    serving_ips: tuple[str, ...] = (),
    clients: Mapping[str, ClientIdentity] | None = None,
) -> _Certificates:
    """A throwaway CA, its serving and client certificates, and a service-account key.

    ``serving_ips`` are more addresses the serving certificate is valid for; ``clients``
    more client certificates to issue. Made with the ``cryptography`` package when it is
    installed (no dependency of this project pulls it in), else with the ``openssl``
    command line in ``scratch``.
    """
    ips = (*_SERVING_IPS, *serving_ips)
    try:
        import cryptography  # noqa: F401
    except ImportError:
        if shutil.which("openssl") is None:
            missing("certificate tooling", "pip install cryptography, or install openssl")
        return _make_certificates_with_openssl(scratch, ips, dict(clients or {}))
    return _make_certificates_with_cryptography(ips, dict(clients or {}))


def _make_certificates_with_openssl(
    scratch: Path, serving_ips: tuple[str, ...], clients: dict[str, ClientIdentity]
) -> _Certificates:
    scratch.mkdir(parents=True, exist_ok=True)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=scratch, capture_output=True, check=True)

    ec_key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl(
        "req", "-x509", *ec_key, "-keyout", "ca.key", "-out", "ca.crt", "-days", "7",
        "-subj", "/CN=alpineagents-bench-ca",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
    )  # fmt: skip

    def issue(stem: str, subject: str, server: bool) -> _Pem:
        openssl("req", "-new", *ec_key, "-keyout", f"{stem}.key", "-out", f"{stem}.csr",
                "-subj", subject)  # fmt: skip
        extensions = ["basicConstraints=critical,CA:FALSE"]
        if server:
            alt_names = [f"DNS:{n}" for n in _SERVING_NAMES] + [f"IP:{i}" for i in serving_ips]
            extensions += ["extendedKeyUsage=serverAuth", "subjectAltName=" + ",".join(alt_names)]
        else:
            extensions.append("extendedKeyUsage=clientAuth")
        (scratch / f"{stem}.ext").write_text("\n".join(extensions) + "\n")
        openssl(
            "x509", "-req", "-in", f"{stem}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "7", "-out", f"{stem}.crt", "-extfile", f"{stem}.ext",
        )  # fmt: skip
        return _Pem((scratch / f"{stem}.crt").read_bytes(), (scratch / f"{stem}.key").read_bytes())

    serving = issue("serving", "/CN=kube-apiserver", server=True)
    admin = issue("admin", "/CN=bench-admin/O=system:masters", server=False)
    # system:masters: see _make_certificates_with_cryptography.
    controller_manager = issue(
        "controller-manager", "/CN=system:kube-controller-manager/O=system:masters", server=False
    )
    openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", "sa.key")
    openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub")
    return _Certificates(
        ca=_Pem((scratch / "ca.crt").read_bytes(), (scratch / "ca.key").read_bytes()),
        serving=serving,
        admin=admin,
        controller_manager=controller_manager,
        service_account_key=(scratch / "sa.key").read_bytes(),
        service_account_public=(scratch / "sa.pub").read_bytes(),
        clients={
            key: issue(
                f"client-{index}",
                f"/CN={user}" + (f"/O={group}" if group else ""),
                server=False,
            )
            for index, (key, (user, group)) in enumerate(clients.items())
        },
    )


def _make_certificates_with_cryptography(
    serving_ips: tuple[str, ...], clients: dict[str, ClientIdentity]
) -> _Certificates:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    not_before = now - datetime.timedelta(minutes=5)  # tolerate small clock differences
    not_after = now + datetime.timedelta(days=7)

    def key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    def name(common: str, organization: str | None = None) -> x509.Name:
        attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common)]
        if organization:
            attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
        return x509.Name(attributes)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = name("alpineagents-bench-ca")
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )

    def issue(subject: x509.Name, server: bool) -> _Pem:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [
                        *(x509.DNSName(dns) for dns in _SERVING_NAMES),
                        *(x509.IPAddress(ipaddress.ip_address(ip)) for ip in serving_ips),
                    ]
                ),
                critical=False,
            )
        cert = builder.sign(ca_key, hashes.SHA256())
        return _Pem(cert.public_bytes(serialization.Encoding.PEM), key_pem(key))

    service_account = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return _Certificates(
        ca=_Pem(ca_cert.public_bytes(serialization.Encoding.PEM), key_pem(ca_key)),
        serving=issue(name("kube-apiserver"), server=True),
        admin=issue(name("bench-admin", "system:masters"), server=False),
        # system:masters rather than RBAC's own kube-controller-manager role: with
        # --use-service-account-credentials=false every controller acts as this one
        # identity, and the bench runs no token controller to give each its own.
        controller_manager=issue(
            name("system:kube-controller-manager", "system:masters"), server=False
        ),
        service_account_key=key_pem(service_account),
        service_account_public=service_account.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
        clients={
            key: issue(name(user, group), server=False) for key, (user, group) in clients.items()
        },
    )


def _kubeconfig(server: str, ca: bytes, client: _Pem, user: str) -> str:
    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    # JSON is YAML, and every kubeconfig reader (kubectl, helm, the python client) takes it.
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "bench",
                    "cluster": {"server": server, "certificate-authority-data": b64(ca)},
                }
            ],
            "users": [
                {
                    "name": user,
                    "user": {
                        "client-certificate-data": b64(client.cert),
                        "client-key-data": b64(client.key),
                    },
                }
            ],
            "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": user}}],
            "current-context": "bench",
        },
        indent=2,
    )


@dataclass
class ControlPlane:
    """A running etcd + kube-apiserver pair and the admin's way in."""

    kubeconfig: Path
    """Admin kubeconfig (client certificate in system:masters)."""
    server: str
    """The apiserver's URL, https://127.0.0.1:<port>."""
    kubectl_path: Path
    workdir: Path
    _ssl_context: ssl.SSLContext = field(repr=False)

    @property
    def ca_file(self) -> Path:
        """The CA certificate every certificate of this plane is issued by."""
        return self.workdir / "pki" / "ca.crt"

    def client_kubeconfig(self, key: str) -> Path:
        """The kubeconfig of a client identity given in :class:`PlaneOptions`."""
        return self.workdir / f"{key}.kubeconfig"

    def api_client(self) -> ApiClient:
        """A fresh ``kubernetes.client.ApiClient`` authenticated as the admin."""
        from kubernetes import config

        api: ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(self.kubeconfig)
        )
        return api

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None, timeout: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this control plane; raises on failure when ``check``."""
        command = [str(self.kubectl_path), f"--kubeconfig={self.kubeconfig}", *args]
        result = subprocess.run(
            command, input=input, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and result.returncode != 0:
            output = result.stdout + result.stderr
            command_line = " ".join(args)
            raise AssertionError(f"`kubectl {command_line}` exited {result.returncode}:\n{output}")
        return result

    def get(self, path: str) -> tuple[int, bytes]:
        """GET a raw API path as the admin: (HTTP status, body); status 0 when nothing
        answered (not listening yet, or stopped)."""
        request = urllib.request.Request(self.server + path)
        try:
            with urllib.request.urlopen(request, context=self._ssl_context, timeout=10) as response:
                return int(response.status), bytes(response.read())
        except urllib.error.HTTPError as error:
            return int(error.code), bytes(error.read())
        except OSError as error:  # URLError is an OSError: connection refused, reset, ...
            return 0, str(error).encode()

    def audit_events(self, user: str) -> list[dict[str, Any]]:
        """The audit events (metadata only) of the requests ``user`` made so far, e.g.
        ``system:serviceaccount:<namespace>:<name>``: verb, objectRef, responseStatus."""
        events = []
        path = self.workdir / "audit.log"
        text = path.read_text() if path.exists() else ""
        # The server may be writing the last line as we read: only whole lines count.
        for line in text[: text.rfind("\n") + 1].splitlines():
            event = json.loads(line)
            if event.get("user", {}).get("username") == user:
                events.append(event)
        return events

    def apply_crds(self, directory: Path | None = None, timeout: float = 60.0) -> list[str]:
        """Apply every YAML file in ``directory`` (default ``<repo>/crds``) and wait for
        each CustomResourceDefinition to be Established. Returns the CRD names."""
        directory = directory or REPO / "crds"
        files = sorted([*directory.glob("*.yaml"), *directory.glob("*.yml")])
        if not files:
            return []
        args = ["apply", "--server-side", "--force-conflicts", "-o", "name"]
        for path in files:
            args += ["-f", str(path)]
        applied = self.kubectl(*args).stdout.split()
        names = [
            item.split("/", 1)[1] for item in applied if item.startswith("customresourcedefinition")
        ]
        if names:
            self.kubectl(
                "wait",
                "--for=condition=Established",
                f"--timeout={int(timeout)}s",
                *(f"customresourcedefinition/{name}" for name in names),
            )
        return names


def _start_etcd(stack: ExitStack, workdir: Path) -> str:
    client_port, peer_port = free_port(), free_port()
    client_url = f"http://127.0.0.1:{client_port}"
    peer_url = f"http://127.0.0.1:{peer_port}"
    etcd = ServerProcess(
        "etcd",
        [
            str(binary_path("etcd")),
            "--name=bench",
            f"--data-dir={workdir / 'etcd-data'}",
            f"--listen-client-urls={client_url}",
            f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=bench={peer_url}",
            # A test cluster's data is thrown away anyway; fsync would only slow it down.
            "--unsafe-no-fsync",
            "--log-level=warn",
        ],
        workdir / "etcd.log",
    )
    stack.callback(etcd.stop)
    etcd.start()

    def healthy() -> bool:
        try:
            with urllib.request.urlopen(client_url + "/health", timeout=2) as response:
                return bool(json.loads(response.read()).get("health") == "true")
        except (OSError, ValueError):
            return False

    etcd.wait_until(healthy, "healthy", timeout=60)
    return client_url


@dataclass(frozen=True)
class PlaneOptions:
    """How a control plane that real nodes join differs from the default one.

    The default listens on loopback only and has no ServiceAccount admission (nothing
    would create the "default" ServiceAccounts it needs).
    """

    address: str = "127.0.0.1"
    """Where the apiserver listens and what it advertises (the ``kubernetes`` Service's
    endpoint): an address pods can reach, for a plane with nodes."""
    clients: Mapping[str, ClientIdentity] = field(default_factory=dict)
    """More client identities: each gets ``pki/<key>.crt``/``.key`` and
    ``<key>.kubeconfig`` in the workdir (see :meth:`ControlPlane.client_kubeconfig`)."""
    service_accounts: bool = False
    """Keep the ServiceAccount admission plugin (a controller-manager must then run)."""
    authorization: str = "RBAC"
    """The apiserver's --authorization-mode (with nodes: Node,RBAC, so each kubelet may
    touch only its own Node and pods)."""
    apiserver_args: tuple[str, ...] = ()


def start_control_plane(
    stack: ExitStack, workdir: Path, options: PlaneOptions | None = None
) -> ControlPlane:
    """Start etcd and kube-apiserver (and what ``options`` asks for) under ``workdir``.

    Stopped when ``stack`` closes. The session fixture and the real node call this; the
    operator-scale benchmark calls it for a plane of its own.
    """
    options = options or PlaneOptions()
    kube_apiserver = binary_path("kube-apiserver")
    kubectl = binary_path("kubectl")
    serving_ips = () if options.address in _SERVING_IPS else (options.address,)
    certificates = _make_certificates(workdir / "openssl", serving_ips, options.clients)
    pki = workdir / "pki"
    pki.mkdir(parents=True)
    files = {
        "ca.crt": certificates.ca.cert,
        "serving.crt": certificates.serving.cert,
        "serving.key": certificates.serving.key,
        "admin.crt": certificates.admin.cert,
        "admin.key": certificates.admin.key,
        "sa.key": certificates.service_account_key,
        "sa.pub": certificates.service_account_public,
    }
    for key, pem in certificates.clients.items():
        files[f"{key}.crt"] = pem.cert
        files[f"{key}.key"] = pem.key
    for filename, data in files.items():
        (pki / filename).write_bytes(data)
        (pki / filename).chmod(0o600)

    # Metadata-level audit (who did what to which object; never bodies, so no secrets):
    # tests compare what a ServiceAccount really called with what its Role grants.
    audit_policy = workdir / "audit-policy.yaml"
    audit_policy.write_text(
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\n"
        "rules:\n  - level: Metadata\n"
    )
    etcd_url = _start_etcd(stack, workdir)
    port = free_port()
    server = f"https://{options.address}:{port}"
    apiserver = ServerProcess(
        "kube-apiserver",
        [
            str(kube_apiserver),
            f"--etcd-servers={etcd_url}",
            f"--bind-address={options.address}",
            f"--advertise-address={options.address}",
            f"--secure-port={port}",
            f"--cert-dir={workdir / 'apiserver-certs'}",
            f"--tls-cert-file={pki / 'serving.crt'}",
            f"--tls-private-key-file={pki / 'serving.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-cluster-ip-range={_SERVICE_CIDR}",
            f"--authorization-mode={options.authorization}",
            # No controller-manager by default, so nothing would create the "default"
            # ServiceAccount that this plugin insists every pod's namespace has.
            *([] if options.service_accounts else ["--disable-admission-plugins=ServiceAccount"]),
            "--allow-privileged=true",
            "--profiling=false",
            f"--audit-policy-file={audit_policy}",
            f"--audit-log-path={workdir / 'audit.log'}",
            "--audit-log-format=json",
            "--v=1",
            *options.apiserver_args,
        ],
        workdir / "kube-apiserver.log",
    )
    stack.callback(apiserver.stop)
    apiserver.start()

    kubeconfig = workdir / "admin.kubeconfig"
    kubeconfig.write_text(
        _kubeconfig(server, certificates.ca.cert, certificates.admin, "bench-admin")
    )
    kubeconfig.chmod(0o600)
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    plane = ControlPlane(
        kubeconfig=kubeconfig,
        server=server,
        kubectl_path=kubectl,
        workdir=workdir,
        _ssl_context=context,
    )
    apiserver.wait_until(lambda: plane.get("/readyz")[0] == 200, "ready (/readyz)", timeout=120)
    # The apiserver's own bootstrap controller makes "default"; be sure before yielding.
    if plane.get("/api/v1/namespaces/default")[0] == 404:
        plane.kubectl("create", "namespace", "default", check=False)
    apiserver.wait_until(
        lambda: plane.get("/api/v1/namespaces/default")[0] == 200, "serving namespace default"
    )
    (workdir / "controller-manager.crt").write_bytes(certificates.controller_manager.cert)
    (workdir / "controller-manager.key").write_bytes(certificates.controller_manager.key)
    (workdir / "controller-manager.kubeconfig").write_text(
        _kubeconfig(
            server, certificates.ca.cert, certificates.controller_manager, "kube-controller-manager"
        )
    )
    for key, pem in certificates.clients.items():
        path = plane.client_kubeconfig(key)
        path.write_text(_kubeconfig(server, certificates.ca.cert, pem, key))
        path.chmod(0o600)
    return plane


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    """A real etcd + kube-apiserver (v1.35) on free loopback ports, torn down at the end."""
    try:
        binary_path("etcd")
        binary_path("kube-apiserver")
        binary_path("kubectl")
    except ProvisioningError as error:
        missing(
            "the Kubernetes control plane (etcd, kube-apiserver, kubectl)",
            f"{_HOW_TO_FIX}: {error}",
        )
    workdir = Path(tempfile.mkdtemp(prefix="alpineagents-control-plane-"))
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        try:
            plane = start_control_plane(stack, workdir)
        except ServerFailed as error:
            pytest.fail(f"the test control plane did not start: {error}")
        yield plane


def healthz_ok(port: int) -> bool:
    """Whether a Kubernetes server on loopback ``port`` answers ``/healthz`` with 200 (over
    TLS with the self-signed certificate it made for itself: only probed, never trusted)."""
    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(
            f"https://127.0.0.1:{port}/healthz", context=insecure, timeout=2
        ) as response:
            return int(response.status) == 200
    except OSError:
        return False


def start_controller_manager(
    plane: ControlPlane,
    controllers: str,
    *extra_args: str,
    log_name: str = "kube-controller-manager",
) -> ServerProcess:
    """Start kube-controller-manager on ``plane`` with ``controllers`` (its --controllers
    value) and wait until it is healthy; the caller stops the returned process."""
    binary = binary_path("kube-controller-manager")
    workdir = plane.workdir
    port = free_port()
    process = ServerProcess(
        "kube-controller-manager",
        [
            str(binary),
            f"--kubeconfig={workdir / 'controller-manager.kubeconfig'}",
            f"--controllers={controllers}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={workdir / 'controller-manager-certs'}",
            "--use-service-account-credentials=false",
            "--v=1",
            *extra_args,
        ],
        workdir / f"{log_name}.log",
    )
    process.start()
    try:
        process.wait_until(lambda: healthz_ok(port), "healthy (/healthz)", timeout=60)
    except ServerFailed:
        process.stop()
        raise
    return process


@dataclass(frozen=True)
class ControllerManager:
    """kube-controller-manager running the garbage collector and namespace controllers."""

    process: ServerProcess


@pytest.fixture(scope="session")
def controller_manager(control_plane: ControlPlane) -> Iterator[ControllerManager]:
    """Opt-in: owner-reference garbage collection and namespace deletion, for real."""
    try:
        binary_path("kube-controller-manager")
    except ProvisioningError as error:
        missing("kube-controller-manager", f"{_HOW_TO_FIX}: {error}")
    try:
        process = start_controller_manager(
            control_plane, "garbage-collector-controller,namespace-controller"
        )
    except ServerFailed as error:
        pytest.fail(f"kube-controller-manager did not start: {error}")
    try:
        yield ControllerManager(process)
    finally:
        process.stop()
