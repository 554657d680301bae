"""Every kind of store, fresh and empty, for suites that must hold for all of them.

Fixtures:

- ``store`` (function), parametrized with ids ``file``, ``memory``, ``minio``,
  ``seaweedfs``, ``file+encrypted``, ``minio+encrypted``, ``seaweedfs+encrypted``: a fresh
  empty :class:`~alpineagents.Store`. ``file`` is a FileStore in ``tmp_path``; ``memory``
  the spec page's MemoryStore, as ``alpineagents.testing`` ships it; ``minio``/``seaweedfs``
  a MinioStore with prefix ``runs/`` in a fresh bucket of the session server (started only
  when a test of that id runs); ``+encrypted`` that store in an EncryptedStore with
  :data:`TEST_KEYRING_TEXT`.
- ``s3`` (function), parametrized with ids ``minio``, ``seaweedfs``: an :class:`S3Place`,
  a fresh bucket on that server, to make MinioStores with the options a test needs.
- ``child_store`` (function): a :class:`ChildStore`, how a child process opens the same
  store as this test's ``store`` (a URL for ``open_store`` and the environment it needs).
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from alpineagents import FileStore, Store
from alpineagents.store import Record
from alpineagents.testing import MemoryStore
from tests.bench.minio_server import S3Server

STORE_KINDS = (
    "file",
    "memory",
    "minio",
    "seaweedfs",
    "file+encrypted",
    "minio+encrypted",
    "seaweedfs+encrypted",
)
S3_KINDS = ("minio", "seaweedfs")
TEST_KEYRING_TEXT = (
    "old:"
    + base64.b64encode(bytes(range(32))).decode()
    + ",new:"
    + base64.b64encode(bytes(range(32, 64))).decode()
)
"""Two keys (``new`` writes): the encrypted stores of the suites, and what tests rotate."""


@dataclass
class S3Place:
    """A fresh bucket on a real S3 server, and how to make MinioStores in it."""

    server: S3Server
    bucket: str

    @property
    def kind(self) -> str:
        """ "minio" or "seaweedfs"."""
        return self.server.kind

    def store(self, prefix: str = "runs", **options: Any) -> Any:
        """A new MinioStore (its own client, bounded timeouts) on this bucket.

        ``options`` go to ``MinioStore.connect`` (``retry_budget``, ``timeout``, ...).
        """
        from alpineagents.store.s3 import MinioStore

        return MinioStore.connect(
            self.server.endpoint,
            self.bucket,
            prefix,
            access_key=self.server.access_key,
            secret_key=self.server.secret_key,
            secure=False,
            **options,
        )

    def object_keys(self) -> list[str]:
        """Every object key in the bucket."""
        client = self.server.client()
        return sorted(
            str(item.object_name)
            for item in client.list_objects(self.bucket, recursive=True)
            if item.object_name
        )


def _s3_place(request: pytest.FixtureRequest, kind: str) -> S3Place:
    server: S3Server = request.getfixturevalue(kind)
    bucket: str = request.getfixturevalue(f"{kind}_bucket")
    return S3Place(server, bucket)


@pytest.fixture(params=STORE_KINDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A fresh empty store of each kind (see the module docstring)."""
    kind, _, wrapper = str(request.param).partition("+")
    inner: Store
    if kind == "file":
        inner = FileStore(tmp_path / "runs")
    elif kind == "memory":
        inner = MemoryStore()
    else:
        inner = _s3_place(request, kind).store()
    if wrapper == "encrypted":
        from alpineagents.store.encrypted import EncryptedStore, Keyring

        yield EncryptedStore(inner, Keyring.from_text(TEST_KEYRING_TEXT))
    else:
        yield inner


@dataclass(frozen=True)
class ChildStore:
    """How a child process reaches the ``store`` of this test.

    ``url`` is for ``alpineagents.store.open_store``, or ``"memory"``: the MemoryStore
    lives in one process only, so the child makes its own and reports what it holds.
    ``env`` holds the credentials an ``s3://`` URL needs.
    """

    url: str
    env: dict[str, str]


@pytest.fixture
def child_store(request: pytest.FixtureRequest, store: Store) -> ChildStore:
    """How a child process opens this test's ``store`` (see :class:`ChildStore`)."""
    kind, _, wrapper = str(request.node.callspec.params["store"]).partition("+")
    if wrapper == "encrypted":
        # The child opens the same wrapper through the URL, with the test's keys.
        from alpineagents.store.encrypted import KEYS_ENV, EncryptedStore

        assert isinstance(store, EncryptedStore)
        plain = _child_store(request, kind, store.inner)
        if plain.url == "memory":
            return plain
        joiner = "&" if "?" in plain.url else "?"
        return ChildStore(
            f"{plain.url}{joiner}encrypted=true", {**plain.env, KEYS_ENV: TEST_KEYRING_TEXT}
        )
    return _child_store(request, kind, store)


def _child_store(request: pytest.FixtureRequest, kind: str, store: Store) -> ChildStore:
    if kind == "file":
        assert isinstance(store, FileStore)
        return ChildStore(f"file://{store.folder}", {})
    if kind == "memory":
        return ChildStore("memory", {})
    server: S3Server = request.getfixturevalue(kind)
    url = (
        f"s3://{store.bucket}/{store.prefix}?endpoint={server.endpoint}&secure=false"  # type: ignore[attr-defined]
        "&retry_budget=60"
    )
    credentials = {
        "AWS_ACCESS_KEY_ID": server.access_key,
        "AWS_SECRET_ACCESS_KEY": server.secret_key,
    }
    return ChildStore(url, credentials)


@pytest.fixture(params=S3_KINDS)
def s3(request: pytest.FixtureRequest) -> S3Place:
    """A fresh bucket on the session MinIO, then on the session SeaweedFS."""
    return _s3_place(request, request.param)


class AsyncMemory(Store):
    """An async-only store (``awrite``/``aread`` and nothing else), kept in a dict."""

    def __init__(self) -> None:
        self.records: dict[str, Record] = {}

    async def awrite(
        self,
        state_id: str,
        entries: list[dict[str, Any]],
        info: dict[str, Any],
        *,
        create: bool = False,
    ) -> None:
        kept = self.records[state_id].entries if state_id in self.records else []
        self.records[state_id] = Record(
            kept + [e for e in entries if e["seq"] >= len(kept)], dict(info)
        )

    async def aread(self, state_id: str) -> Record | None:
        return self.records.get(state_id)
