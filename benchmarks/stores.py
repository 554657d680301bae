"""The stores under test, wherever this checkout keeps them, and the test bench's MinIO."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from alpineagents import Store


def minio_store_class() -> Any:
    """``MinioStore`` (imported when a benchmark needs it: it needs the ``minio`` extra)."""
    from alpineagents.store.s3 import MinioStore

    return MinioStore


def minio_store(server: Any, bucket: str, **options: Any) -> Store:
    """A new MinioStore (its own client, bounded timeouts) on ``bucket`` of ``server``."""
    store: Store = minio_store_class().connect(
        server.endpoint,
        bucket,
        "runs",
        access_key=server.access_key,
        secret_key=server.secret_key,
        secure=False,
        **options,
    )
    return store


class MinioUnavailable(RuntimeError):
    """The test bench's MinIO binary is not built (``python -m tests.bench.testbin minio``)."""


@contextlib.contextmanager
def minio_server() -> Iterator[Any]:
    """The test bench's MinIO on a loopback port in a temporary folder."""
    from tests.bench.minio_server import start_minio
    from tests.bench.testbin import ProvisioningError, binary_path

    try:
        binary_path("minio")
    except ProvisioningError as error:
        raise MinioUnavailable(f"MinIO is not built ({error})") from error
    folder = Path(tempfile.mkdtemp(prefix="alpineagents-bench-minio-"))
    server = start_minio(folder, "bench-access", "bench-secret-" + uuid.uuid4().hex[:16])
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)
