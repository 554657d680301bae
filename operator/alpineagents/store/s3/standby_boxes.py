"""Where a warm pool's standby pods get their runs: one small folder each in the store.

A standby pod waits for an :class:`~alpineagents.pod_contract.Assignment` under
``<store prefix>.standby/<its pod uid>/`` (:func:`~alpineagents.pod_contract.standby_prefix`);
the operator writes it there when it hands the pod a run. Nothing connects to the pod:
the standby asks the store, an outgoing request, as it does for every save.

Both sides use :class:`StandbyBoxes`: the operator with the store's key
(:meth:`~StandbyBoxes.put`, :meth:`~StandbyBoxes.clear`, :meth:`~StandbyBoxes.ids`,
:meth:`~StandbyBoxes.handed`), a
standby with credentials that reach its own folder only (:meth:`~StandbyBoxes.take`).
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping

import urllib3
from minio import Minio
from minio.credentials.providers import Provider
from minio.deleteobjects import DeleteObject
from minio.error import S3Error

from ...pod_contract import ASSIGNMENT_NAME, Assignment, standby_prefix
from ..url import s3_credentials, s3_location
from .credential_files import CredentialFiles

__all__ = ["StandbyBoxes"]

_CONNECTIONS = 32

_ABSENT = frozenset({"NoSuchKey", "NoSuchBucket"})
# Left beside a handed assignment, and there after the standby took it: an operator
# started later tells a standby handed a run but never relabelled (its predecessor
# stopped between the two) from a waiting one.
_HANDED_NAME = "handed"


class StandbyBoxes:
    """The standby folders under one ``s3://`` store."""

    def __init__(self, client: Minio, bucket: str, prefix: str) -> None:
        self.client = client
        self.bucket = bucket
        stripped = prefix.strip("/")
        self.base = stripped + "/" if stripped else ""
        """The store's prefix, ``""`` or ``"a/b/"``."""

    @classmethod
    def open(cls, store_url: str, env: Mapping[str, str], timeout: float = 5.0) -> StandbyBoxes:
        """The boxes of the store at ``store_url``, with the credentials ``env`` gives (as
        :func:`~alpineagents.store.open_store` reads them, ``*_FILE`` forms followed)."""
        where = s3_location(store_url, env)
        key = s3_credentials(store_url, env)
        provider: Provider | None = CredentialFiles(*key.files) if key.files else None
        client = Minio(
            where.endpoint,
            access_key=None if provider else key.access_key,
            secret_key=None if provider else key.secret_key,
            session_token=None if provider else key.session_token,
            credentials=provider,
            secure=where.secure,
            region=where.region,
            http_client=urllib3.PoolManager(
                # The operator hands many standbys at once (a drain): connections beyond
                # the pool's size are opened and thrown away, each with a warning.
                maxsize=_CONNECTIONS,
                timeout=urllib3.Timeout(connect=timeout, read=timeout),
                retries=urllib3.Retry(total=2, backoff_factor=0.1),
            ),
        )
        return cls(client, where.bucket, where.prefix)

    def key(self, standby_id: str) -> str:
        """The assignment's object key for standby ``standby_id``."""
        return self.base + standby_prefix(standby_id) + ASSIGNMENT_NAME

    def put(self, standby_id: str, assignment: Assignment) -> None:
        """Hand ``assignment`` to standby ``standby_id`` (marked as handed first, see
        :meth:`handed`)."""
        folder = self.base + standby_prefix(standby_id)
        self.client.put_object(self.bucket, folder + _HANDED_NAME, io.BytesIO(b""), 0)
        data = json.dumps(assignment.to_json(), ensure_ascii=False).encode()
        self.client.put_object(
            self.bucket,
            self.key(standby_id),
            io.BytesIO(data),
            len(data),
            content_type="application/json",
        )

    def take(self, standby_id: str) -> Assignment | None:
        """The assignment waiting for ``standby_id``, removed from the store (it holds the
        run's credentials: they stay nowhere but in the pod); None when there is none."""
        key = self.key(standby_id)
        try:
            response = self.client.get_object(self.bucket, key)
        except S3Error as error:
            if error.code in _ABSENT:
                return None
            raise
        try:
            data = response.read()
        finally:
            response.close()
            response.release_conn()
        self.client.remove_object(self.bucket, key)
        return Assignment.parse(data)

    def holds(self, standby_id: str) -> bool:
        """Whether an assignment waits for ``standby_id`` (not taken yet)."""
        try:
            self.client.stat_object(self.bucket, self.key(standby_id))
        except S3Error as error:
            if error.code in _ABSENT or error.code == "NoSuchObject":
                return False
            raise
        return True

    def handed(self) -> set[str]:
        """The standby ids ever handed an assignment here, taken or not (until
        :meth:`clear`)."""
        root = self.base + ".standby/"
        try:
            listed = list(self.client.list_objects(self.bucket, root, recursive=True))
        except S3Error as error:
            if error.code in _ABSENT:
                return set()
            raise
        ends = "/" + _HANDED_NAME
        return {
            str(o.object_name)[len(root) :].split("/", 1)[0]
            for o in listed
            if str(o.object_name).endswith(ends)
        }

    def unmark(self, standby_id: str) -> None:
        """Remove the mark :meth:`put` left (the standby is relabelled: its labels say it
        was handed a run), and nothing else: its assignment may not be taken yet."""
        self.client.remove_object(
            self.bucket, self.base + standby_prefix(standby_id) + _HANDED_NAME
        )

    def clear(self, standby_id: str) -> None:
        """Remove whatever is in ``standby_id``'s folder (its pod is gone or leaves the pool)."""
        folder = self.base + standby_prefix(standby_id)
        keys = [
            DeleteObject(str(o.object_name))
            for o in self.client.list_objects(self.bucket, folder, recursive=True)
        ]
        if keys:
            for failed in self.client.remove_objects(self.bucket, keys):
                raise RuntimeError(f"could not remove {failed.name}: {failed.message}")

    def ids(self) -> list[str]:
        """The standby ids that have a folder here."""
        root = self.base + ".standby/"
        try:
            listed = list(self.client.list_objects(self.bucket, root))
        except S3Error as error:
            if error.code in _ABSENT:
                return []
            raise
        return [str(o.object_name)[len(root) :].rstrip("/") for o in listed if o.is_dir]
