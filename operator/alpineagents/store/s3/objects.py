"""The requests MinioStore sends: each one bounded by its operation's budget and retried
only when that is safe (idempotent requests, and creates whose 412 the caller checks)."""

from __future__ import annotations

import builtins
import functools
import io
import random
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import urllib3
from minio import Minio
from minio.deleteobjects import DeleteObject
from minio.error import InvalidResponseError, S3Error, ServerError

from ...errors import StoreUnavailableError

__all__ = ["FETCH_THREADS", "BoundedPool", "Objects", "Vanished"]

T = TypeVar("T")

FETCH_THREADS = 8
_MIN_PART = 5 << 20  # S3's smallest multipart part; minio's put_object needs at least this
_TRANSIENT_CODES = {"SlowDown", "RequestTimeout", "InternalError", "ServiceUnavailable"}

# The deadline of the operation running on this thread, read by BoundedPool.
_operation = threading.local()


class BoundedPool(urllib3.PoolManager):
    """A PoolManager whose socket timeouts never outlast the current operation's budget."""

    def __init__(self, timeout: float, **options: Any) -> None:
        super().__init__(
            timeout=urllib3.Timeout(connect=timeout, read=timeout),
            retries=False,  # MinioStore retries itself, knowing which requests are safe to
            **options,
        )
        self._timeout = timeout

    def urlopen(  # type: ignore[override]  # the signature of PoolManager.urlopen
        self, method: str, url: str, redirect: bool = True, **kw: Any
    ) -> urllib3.BaseHTTPResponse:
        deadline: float | None = getattr(_operation, "deadline", None)
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise urllib3.exceptions.TimeoutError("the store's retry budget is spent")
            wait = min(self._timeout, left)
            kw["timeout"] = urllib3.Timeout(connect=wait, read=wait)
        return super().urlopen(method, url, redirect=redirect, **kw)


class Vanished(Exception):
    """A listed object was deleted (by a merge) before it was fetched."""


class Objects:
    """Requests to one bucket through one ``minio`` client, retried within a deadline.

    ``owner`` names the store in errors (its repr, never a secret).
    """

    def __init__(self, client: Minio, bucket: str, retry_budget: float, owner: str) -> None:
        self.client = client
        self.bucket = bucket
        self.retry_budget = retry_budget
        self.owner = owner
        self._guard = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    def deadline(self) -> float:
        return time.monotonic() + self.retry_budget

    def request(
        self, what: str, call: Callable[[], T], deadline: float, *, retry: bool = True
    ) -> T:
        """Run one request (idempotent, or conditional), retrying transient failures."""
        attempts = 0
        while True:
            attempts += 1
            _operation.deadline = deadline
            try:
                return call()
            except Exception as error:
                if not _transient(error):
                    raise
                failure = error
            finally:
                _operation.deadline = None
            pause = min(1.0, 0.05 * 2**attempts) * random.uniform(0.5, 1.0)
            if not retry or time.monotonic() + pause >= deadline:
                raise StoreUnavailableError(
                    f"{self.owner} did not answer {what} within its budget of "
                    f"{self.retry_budget:g}s ({attempts} attempts): "
                    f"{type(failure).__name__}: {failure}"
                ) from failure
            time.sleep(pause)  # backoff between attempts

    def get(
        self, key: str, deadline: float, *, length: int = 0, retry: bool = True
    ) -> tuple[bytes, str] | None:
        """The body (its first ``length`` bytes, if given) and ETag of ``key``; None if absent."""

        def get() -> tuple[bytes, str] | None:
            try:
                response = self.client.get_object(self.bucket, key, length=length)
            except S3Error as error:
                if error.code == "NoSuchKey":
                    return None
                raise
            try:
                return response.read(), str(response.headers.get("ETag", ""))
            finally:
                response.close()
                response.release_conn()

        return self.request(f"GET {key}", get, deadline, retry=retry)

    def put_conditional(
        self,
        key: str,
        body: bytes,
        deadline: float,
        *,
        if_match: str | None = None,
        content_type: str = "application/json",
        retry: bool = True,
    ) -> str | None:
        """PUT ``If-None-Match: *`` (a create), or ``If-Match: <etag>``.

        Returns the new ETag, or None when the condition failed (412, or 404 for an
        ``If-Match`` on a deleted object). A retried request whose first attempt landed
        gets 412 for its own success: the caller checks whose object it is. The public
        ``put_object`` cannot send these headers, hence the client's lower-level
        ``_execute``.
        """
        headers: dict[str, str | builtins.list[str] | tuple[str]] = {"Content-Type": content_type}
        if if_match is not None:
            headers["If-Match"] = if_match
        else:
            headers["If-None-Match"] = "*"

        def put() -> str | None:
            try:
                response = self.client._execute("PUT", self.bucket, key, body=body, headers=headers)
            except S3Error as error:
                if error.code == "PreconditionFailed" or (
                    if_match is not None and error.code == "NoSuchKey"
                ):
                    return None
                raise
            return str(response.headers.get("ETag", ""))

        return self.request(f"PUT {key}", put, deadline, retry=retry)

    def put(self, key: str, body: bytes, deadline: float, *, retry: bool = True) -> None:
        """A plain PUT (for objects whose key always holds the same bytes)."""
        self.request(
            f"PUT {key}",
            lambda: self.client.put_object(
                self.bucket,
                key,
                io.BytesIO(body),
                len(body),
                content_type="application/x-ndjson",
                # One PUT whatever the size (up to S3's 5 GiB): a multipart upload cut
                # short would leave parts behind that nobody lists.
                part_size=max(len(body), _MIN_PART),
            ),
            deadline,
            retry=retry,
        )

    def list(
        self, prefix: str, deadline: float, *, recursive: bool = True, retry: bool = True
    ) -> builtins.list[tuple[str, int, bool]]:
        """(key, size, is a folder) of each object under ``prefix``."""
        return self.request(
            f"LIST {prefix}",
            lambda: [
                (str(item.object_name), int(item.size or 0), bool(item.is_dir))
                for item in self.client.list_objects(
                    self.bucket, prefix=prefix, recursive=recursive
                )
                if item.object_name
            ],
            deadline,
            retry=retry,
        )

    def remove(self, keys: Iterable[str], deadline: float, *, retry: bool = True) -> None:
        doomed = builtins.list(keys)
        for start in range(0, len(doomed), 1000):  # S3's most per DeleteObjects
            batch = doomed[start : start + 1000]

            def remove(batch: builtins.list[str] = batch) -> None:
                objects = [DeleteObject(key) for key in batch]
                for error in self.client.remove_objects(self.bucket, objects):
                    if error.code != "NoSuchKey":
                        raise RuntimeError(
                            f"deleting {error.name} from {self.owner} failed: {error}"
                        )

            self.request(f"DELETE {len(batch)} objects", remove, deadline, retry=retry)

    def in_parallel(self, calls: builtins.list[Callable[[], T]]) -> builtins.list[T]:
        if len(calls) <= 1:
            return [call() for call in calls]
        with self._guard:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="minio-store")
            pool = self._pool
        return builtins.list(pool.map(lambda call: call(), calls))

    def fetch_all(
        self, keys: Iterable[str], deadline: float, *, retry: bool = True
    ) -> dict[str, bytes]:
        """GET each key (in parallel); raise Vanished for one that is gone."""

        def body(key: str) -> bytes:
            got = self.get(key, deadline, retry=retry)
            if got is None:
                raise Vanished(key)
            return got[0]

        wanted = builtins.list(keys)
        bodies = self.in_parallel([functools.partial(body, key) for key in wanted])
        return dict(zip(wanted, bodies, strict=True))


def _transient(error: BaseException) -> bool:
    """Whether a failed request may succeed when sent again."""
    if isinstance(error, S3Error):
        status = int(getattr(error.response, "status", 0) or 0)
        return status >= 500 or error.code in _TRANSIENT_CODES
    if isinstance(error, ServerError):
        return error.status_code >= 500
    if isinstance(error, InvalidResponseError):
        return int(getattr(error, "_code", 0) or 0) >= 500
    return isinstance(error, urllib3.exceptions.HTTPError | ConnectionError | TimeoutError)


def checked_prefix(prefix: str) -> str:
    """``""`` or ``"a/b/"``; refuses parts that could climb out (``..``) or be ambiguous."""
    stripped = prefix.strip("/")
    if not stripped:
        return ""
    parts = stripped.split("/")
    for part in parts:
        if part in ("", ".", "..") or "\\" in part or "\x00" in part:
            raise ValueError(
                f"MinioStore prefix {prefix!r} is not a plain key prefix (no empty, '.' or "
                f"'..' parts, no backslash or NUL)"
            )
    return stripped + "/"
