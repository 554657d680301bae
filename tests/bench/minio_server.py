"""A real MinIO server for tests, on a free loopback port with a temporary data dir.

Fixtures:

- ``minio`` (session): an :class:`S3Server`; ``minio.bucket`` is a bucket made for the
  whole session, ``minio.unique_prefix()`` gives a fresh key prefix inside it.
- ``minio_bucket`` (function): the name of a fresh, empty bucket on that server, removed
  after the test. It also makes sure the server is running before the test and restarts
  it afterwards if the test left it stopped, so one test's outage does not leak.

``stop()``/``start()`` stop and restart the same server on the same port and data dir,
for tests of "the object store went away mid-run and came back".
"""

from __future__ import annotations

import io
import shutil
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.bench.infra import free_port, missing
from tests.bench.server_process import ServerFailed, ServerProcess
from tests.bench.testbin import ProvisioningError, binary_path

# Readiness probes write here, never into a bucket a test looks at.
_PROBE_BUCKET = "bench-readiness-probe"


class S3Server:
    """An S3-compatible server process plus the credentials and names tests use.

    MinIO and SeaweedFS fixtures both yield this, so a test can be run against either.
    """

    def __init__(
        self,
        kind: str,
        process: ServerProcess,
        port: int,
        access_key: str,
        secret_key: str,
        ready_path: str,
        workdir: Path,
        after_stop: Callable[[], None] | None = None,
    ) -> None:
        self.kind = kind
        """"minio" or "seaweedfs"."""
        self.process = process
        self.endpoint = f"127.0.0.1:{port}"
        """host:port, as ``minio.Minio(endpoint, secure=False)`` takes it."""
        self.access_key = access_key
        self.secret_key = secret_key
        self.workdir = workdir
        self.bucket = f"session-{uuid.uuid4().hex[:12]}"
        """A bucket created when the server first came up, shared by the session."""
        self._ready_path = ready_path
        self._after_stop = after_stop

    @property
    def url(self) -> str:
        """The endpoint as an http URL (for clients that want one, like boto3)."""
        return f"http://{self.endpoint}"

    @property
    def running(self) -> bool:
        """Whether the server process is up (it may still be starting)."""
        return self.process.running

    def client(self) -> Any:
        """A ``minio.Minio`` client for this server (plain http)."""
        from minio import Minio

        return Minio(
            self.endpoint,
            access_key=self.access_key,
            secret_key=self.secret_key,
            secure=False,
            region="us-east-1",
        )

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + self._ready_path, timeout=2) as response:
                return int(response.status) == 200
        except (urllib.error.URLError, OSError):
            return False

    def _probe_client(self) -> Any:
        import urllib3
        from minio import Minio

        # No retries and short timeouts: each readiness poll must fail fast.
        return Minio(
            self.endpoint,
            access_key=self.access_key,
            secret_key=self.secret_key,
            secure=False,
            region="us-east-1",
            http_client=urllib3.PoolManager(timeout=5.0, retries=False),
        )

    def _serves_data(self) -> bool:
        """Whether a write and a read of an object go through (SeaweedFS answers S3
        listing calls before its volume server has re-registered, and 503s data)."""
        import urllib3
        from minio.error import MinioException

        client = self._probe_client()
        try:
            if not client.bucket_exists(_PROBE_BUCKET):
                client.make_bucket(_PROBE_BUCKET)
            client.put_object(_PROBE_BUCKET, "probe", io.BytesIO(b"ok"), 2)
            response = client.get_object(_PROBE_BUCKET, "probe")
            try:
                return bool(response.read() == b"ok")
            finally:
                response.close()
                response.release_conn()
        except (MinioException, urllib3.exceptions.HTTPError, OSError, ValueError):
            return False

    def start(self, timeout: float = 60.0) -> None:
        """Start (or restart) the server on the same port and data dir; wait until it
        stores and serves objects."""
        self.process.start()
        self.process.wait_until(self._ready, f"ready ({self._ready_path})", timeout=timeout)
        self.process.wait_until(self._serves_data, "serving objects", timeout=timeout)

    def stop(self) -> None:
        """Stop the server (its data stays); requests fail until :meth:`start`."""
        self.process.stop()
        if self._after_stop is not None:
            self._after_stop()

    def unique_prefix(self) -> str:
        """A fresh key prefix (ending in "/"), for isolating a test inside ``bucket``."""
        return f"t-{uuid.uuid4().hex[:12]}/"

    def fresh_bucket(self) -> str:
        """Create a new empty bucket and return its name."""
        name = f"t-{uuid.uuid4().hex[:16]}"
        self.client().make_bucket(name)
        return name

    def remove_bucket(self, name: str) -> None:
        """Delete every object in the bucket, then the bucket."""
        from minio.deleteobjects import DeleteObject
        from minio.error import S3Error

        client = self.client()
        if not client.bucket_exists(name):
            return
        # A MinioStore's background merge may still write one object after the test:
        # empty the bucket again until it stays empty (a merge ends within its budget).
        for attempt in range(100):
            objects = [
                DeleteObject(item.object_name)
                for item in client.list_objects(name, recursive=True)
                if item.object_name is not None
            ]
            for error in client.remove_objects(name, objects):
                raise AssertionError(f"could not clean bucket {name}: {error}")
            try:
                client.remove_bucket(name)
                return
            except S3Error as error:
                if error.code != "BucketNotEmpty" or attempt == 99:
                    raise
                time.sleep(0.2)  # backoff while a merge still writes


def start_session_server(server: S3Server) -> None:
    """Start a session server and its session bucket; stop it again if that fails."""
    try:
        server.start()
        server.client().make_bucket(server.bucket)
    except ServerFailed as error:
        server.stop()
        pytest.fail(f"the test {server.kind} server did not start: {error}")
    except BaseException:
        server.stop()
        raise


def fresh_bucket_fixture(server: S3Server) -> Iterator[str]:
    """Body of the ``*_bucket`` fixtures: a fresh bucket, the server up around the test."""
    if not server.running:
        server.start()
    name = server.fresh_bucket()
    yield name
    if not server.running:  # the test stopped it and did not (or could not) restart it
        server.start()
    server.remove_bucket(name)


def start_minio(workdir: Path, access_key: str, secret_key: str) -> S3Server:
    """Start a MinIO server in ``workdir`` (the caller stops it)."""
    binary = binary_path("minio")
    port, console_port = free_port(), free_port()
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(workdir),
        "MINIO_ROOT_USER": access_key,
        "MINIO_ROOT_PASSWORD": secret_key,
        # No web console, no update checks, no phoning home: only the S3 API is tested.
        "MINIO_BROWSER": "off",
        "MINIO_UPDATE": "off",
        "MINIO_CALLHOME_ENABLE": "off",
    }
    process = ServerProcess(
        "minio",
        [
            str(binary),
            "server",
            "--quiet",
            f"--address=127.0.0.1:{port}",
            f"--console-address=127.0.0.1:{console_port}",
            str(workdir / "data"),
        ],
        workdir / "minio.log",
        env=env,
    )
    server = S3Server(
        "minio", process, port, access_key, secret_key, "/minio/health/ready", workdir
    )
    start_session_server(server)
    return server


def session_server_fixture(
    start: Callable[[Path, str, str], S3Server], kind: str
) -> Iterator[S3Server]:
    """Body of the session fixtures: a server in a temp dir, stopped and removed after."""
    workdir = Path(tempfile.mkdtemp(prefix=f"alpineagents-{kind}-"))
    server: S3Server | None = None
    try:
        server = start(workdir, "bench-access", "bench-secret-" + uuid.uuid4().hex[:16])
        yield server
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def minio() -> Iterator[S3Server]:
    """A real MinIO server for the whole session (see the module docstring)."""
    try:
        binary_path("minio")
    except ProvisioningError as error:
        missing("MinIO", f"run `python -m tests.bench.testbin minio`: {error}")
    yield from session_server_fixture(start_minio, "minio")


@pytest.fixture
def minio_bucket(minio: S3Server) -> Iterator[str]:
    """A fresh empty bucket on the session MinIO, removed after the test."""
    yield from fresh_bucket_fixture(minio)
