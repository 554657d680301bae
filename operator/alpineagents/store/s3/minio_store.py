"""MinioStore: States in any S3-compatible object store (MinIO, SeaweedFS, AWS S3, ...).

Only plain S3 API calls are used (PUT/GET/HEAD/DELETE object, ListObjectsV2, DeleteObjects,
and conditional PUTs with ``If-None-Match: *`` / ``If-Match: <etag>``), never MinIO-only ones.

Layout
------
Under ``<prefix>`` (``""`` or ``"some/folder/"``) each State has a folder named by
:func:`~alpineagents.store.base.encode_id` (no ``/``, ``..`` or NUL can reach out of it)::

    <prefix><enc id>/info.json
    <prefix><enc id>/h-<incarnation>/<first seq:012d>-<last seq:012d>-<epoch:010d>.jsonl

``info.json`` is the commit point, a small JSON document::

    {"store": 1, "incarnation": "…", "epoch": 3, "writer": "…", "committed": 120,
     "segments": 7, "nonce": "…", "info": {…the Store info, kept as it is…}}

Each ``.jsonl`` object is a *segment*: entries ``first..last`` of the history, one JSON
line each. Segments are immutable: one key always holds the same bytes, because the same
``(first, last, epoch)`` is only ever written by one writer from one history.

What a read sees
----------------
``read`` GETs ``info.json``, lists ``h-<incarnation>/`` once, fetches the segments it needs
in parallel, and keeps, for each seq below ``committed``, the entry of the segment with the
highest epoch that holds it. Everything else is invisible:

- segments of another incarnation (a create that lost its race, a deleted State's writer
  that kept going, a create that crashed before its ``info.json``);
- entries at or after ``committed`` (a save whose ``info.json`` PUT never happened);
- for a seq below ``committed``, entries of lower epochs (a fenced writer's leftovers).

Why the highest epoch is right: a writer only writes seqs at or after the ``committed``
it saw when it claimed its epoch, and a claim is a compare-and-swap on ``info.json``, so a
fenced writer's leftovers always sit at seqs the next owner has not committed yet, and once
it commits them it does so with a higher epoch. Committed entries never change.

Saves (the hot path)
--------------------
A save PUTs one new segment with just the entries the store does not have (seqs below the
``committed`` this store instance holds are skipped: they were sent again after a failure),
then PUTs ``info.json`` with ``If-Match: <the ETag it wrote last>``. Two requests and
O(new entries) bytes, whatever the history's length. A crash between the two leaves a
segment past ``committed``: invisible, and the next save writes those entries again (the
Agent resends what was not saved), in a segment of the same epoch with identical content.

Creation
--------
``create=True`` lists the id's folder (an existing ``info.json`` is refused at once, with
nothing written), PUTs the segment of a fresh incarnation, then PUTs ``info.json`` with
``If-None-Match: *``. Losing that race (412) deletes the segment again and raises
``ValueError``. Either the whole State is visible or nothing is.

Fencing: one writer per State
-----------------------------
``info.json`` carries an ``epoch`` and the random ``writer`` token of the store instance
that owns it. Every ``info.json`` PUT is conditional on the ETag its writer saw last, and a
random ``nonce`` in each version makes every version's ETag unique (no ABA).

- :meth:`MinioStore.claim` takes a State over: it writes ``epoch + 1`` with a new writer
  token, ``If-Match`` the ETag it read. If this instance has read the State (``load``) and
  not written it since, the claim is conditional on *that* read, and fails with
  :class:`StateFencedError` if anyone wrote in between (load again). Otherwise it claims
  whatever is saved now, retrying on races (the operator does this before starting a
  replacement pod: the old pod's next save then fails).
- A write by an instance that does not own the State claims it implicitly first (so
  ``load`` in a new process, then saving, just works): one extra PUT, once. After a read,
  that claim is conditional on the read, and it refuses entries that start before what
  the read returned (they come from an older copy of the State).
- A writer whose ``If-Match`` fails finds another writer's token in ``info.json`` and raises
  :class:`StateFencedError`; its segment is invisible (past ``committed``, lower epoch). It
  stays fenced: every later write of that id through this instance raises too, until it
  loads the State again or calls :meth:`claim`.
- A conditional PUT retried after a lost response may get 412 for its own success; the
  store then GETs ``info.json`` and recognises its own writer token.

Merging
-------
Each save adds a segment; ``info.json`` counts them. When a save leaves more than
``merge_after`` (16) segments, the same save, after its two hot-path requests succeeded,
merges the newest segments into one (size-tiered: an older segment joins while it is at
most twice the size of what is merged so far, so each entry is rewritten O(log n) times and
a load fetches at most about ``merge_after`` segments). The merged segment is PUT first,
then the segments it covers are deleted, so a merge stopped at any point leaves every entry
readable exactly once (a reader skips segments that a segment of at least the same epoch
contains, and re-lists if one vanishes under it). A failed merge never fails the save; a
save a few segments later tries again. Merges use the segments this instance wrote from
memory (up to ``cache_bytes``) and GET only the others. A merging writer that has been
fenced without knowing it yet is harmless: it only merges and deletes seqs it committed,
which never change, and never touches segments of a newer epoch.

Deleting
--------
``delete`` removes ``info.json`` first (from then on readers see nothing and the writer's
next save raises ``LookupError``), then every object under the id's folder, except those
of a State created again with that id meanwhile. Segments left by a create that crashed
before its ``info.json`` are removed by the next create of that id, or by ``delete``.
(A create racing a delete of the same id may lose its first segment: not supported, as
two processes running one id are not.)

Timeouts and retries
--------------------
Every operation (``write``, ``read``, ``list``, ``delete``, ``claim``) has a budget of
``retry_budget`` seconds: idempotent requests and conditional PUTs (see fencing) are retried
with backoff on connection errors, timeouts and 5xx answers until it is spent, then
:class:`StoreUnavailableError` is raised. With a client built by :meth:`MinioStore.connect`
(or one given ``http_client=MinioStore.http_client()``), every socket wait is cut to what is
left of the budget, so an operation fails within ``retry_budget`` seconds even when the
server hangs. A client with its own ``urllib3.PoolManager`` keeps that pool's timeouts (the
``minio`` default is 5 minutes) and its retries; the store's retries come on top.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import io
import json
import logging
import random
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar
from urllib.parse import unquote

import urllib3
from minio import Minio
from minio.credentials.providers import Provider
from minio.deleteobjects import DeleteObject
from minio.error import InvalidResponseError, S3Error, ServerError

from ... import collection
from ...errors import (
    MissingBucketError,
    StateFencedError,
    StateFormatError,
    StateNotFoundError,
    StoreUnavailableError,
)
from ..base import Record, StateInfo, Store, encode_id, exists_error, not_found_error
from .segments import (
    Lines,
    Segment,
    checked_prefix,
    lines_bytes,
    lines_of,
    live_segments,
    new_entries,
    parse_lines,
    parse_segment_name,
    pick_entries,
    plan_merge,
    segment_name,
)

__all__ = [
    "MinioStore",
    "MissingBucketError",
    "StateFencedError",
    "StoreUnavailableError",
]

T = TypeVar("T")

_log = logging.getLogger(__name__)

_INFO = "info.json"
_LAYOUT = 1
_FETCH_THREADS = 8
_MIN_PART = 5 << 20  # S3's smallest multipart part; minio's put_object needs at least this
_READ_ATTEMPTS = 3  # a read re-lists when a merge deletes a segment under it
_TRANSIENT_CODES = {"SlowDown", "RequestTimeout", "InternalError", "ServiceUnavailable"}

# The deadline of the operation running on this thread, read by _BoundedPool.
_operation = threading.local()


class _BoundedPool(urllib3.PoolManager):
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


@dataclass
class _Held:
    """What this store instance knows of one State: the info.json version it saw last."""

    doc: dict[str, Any]
    etag: str
    token: str | None = None  # our writer token, when this instance owns the State
    fenced: bool = False
    merge_at: int = 0  # after a merge that could not shrink enough: wait for more segments

    @property
    def committed(self) -> int:
        return int(self.doc["committed"])

    @property
    def epoch(self) -> int:
        return int(self.doc["epoch"])

    @property
    def incarnation(self) -> str:
        return str(self.doc["incarnation"])


class MinioStore(Store):
    """Saves States in ``bucket`` under ``prefix`` of an S3-compatible object store.

    ``client`` is a ``minio.Minio`` client; :meth:`connect` builds one with bounded
    timeouts. ``retry_budget`` bounds every operation in seconds (see the module
    docstring), ``merge_after`` is the segment count that triggers a merge,
    ``create_bucket`` lets the store create a missing bucket, and ``cache_bytes`` bounds
    the segments kept in memory for merging.
    """

    def __init__(
        self,
        client: Minio,
        bucket: str,
        prefix: str = "",
        *,
        retry_budget: float = 10.0,
        merge_after: int = 16,
        create_bucket: bool = True,
        cache_bytes: int = 8 << 20,
    ) -> None:
        if not bucket:
            raise ValueError("a MinioStore needs a bucket name")
        if retry_budget <= 0:
            raise ValueError(f"retry_budget must be positive, not {retry_budget!r}")
        if merge_after < 2:
            raise ValueError(f"merge_after must be at least 2, not {merge_after!r}")
        self.client = client
        self.bucket = bucket
        self.prefix = checked_prefix(prefix)
        self.retry_budget = float(retry_budget)
        self.merge_after = merge_after
        self.create_bucket = create_bucket
        self.cache_bytes = cache_bytes
        base = client._base_url
        self.endpoint = f"{'https' if base.is_https else 'http'}://{base.host}"
        """Where the store is, as ``scheme://host:port`` (no credentials)."""
        self._bucket_ready = False
        self._held: dict[str, _Held] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self._cache: OrderedDict[str, Lines] = OrderedDict()
        self._cached_bytes = 0
        self._pool: ThreadPoolExecutor | None = None

    @classmethod
    def connect(
        cls,
        endpoint: str,
        bucket: str,
        prefix: str = "",
        *,
        access_key: str | None = None,
        secret_key: str | None = None,
        session_token: str | None = None,
        credentials: Provider | None = None,
        secure: bool = True,
        region: str | None = "us-east-1",
        timeout: float = 5.0,
        retry_budget: float = 10.0,
        merge_after: int = 16,
        create_bucket: bool = True,
    ) -> MinioStore:
        """A MinioStore with its own client: ``endpoint`` is ``host:port``.

        ``timeout`` bounds each socket wait (connect, or waiting for an answer), and
        ``retry_budget`` each whole operation. ``credentials`` (a ``minio`` credentials
        provider) replaces the three keys, e.g. to follow files that get renewed. ``region`` set saves the bucket-location
        request a client makes otherwise.
        """
        client = Minio(
            endpoint,
            access_key=access_key,
            secret_key=secret_key,
            session_token=session_token,
            credentials=credentials,
            secure=secure,
            region=region,
            http_client=cls.http_client(timeout),
        )
        return cls(
            client,
            bucket,
            prefix,
            retry_budget=retry_budget,
            merge_after=merge_after,
            create_bucket=create_bucket,
        )

    @staticmethod
    def http_client(timeout: float = 5.0, **options: Any) -> urllib3.PoolManager:
        """A ``urllib3.PoolManager`` for ``Minio(http_client=...)``.

        Each socket wait lasts at most ``timeout`` seconds and at most what is left of
        the running store operation's budget; it does not retry (the store does).
        ``options`` go to ``urllib3.PoolManager`` (e.g. ``ca_certs``).
        """
        options.setdefault("maxsize", _FETCH_THREADS + 2)
        return _BoundedPool(timeout, **options)

    def __repr__(self) -> str:
        return f"MinioStore('s3://{self.bucket}/{self.prefix}', endpoint={self.endpoint!r})"

    def same_as(self, other: Store) -> bool:
        return isinstance(other, MinioStore) and (other.endpoint, other.bucket, other.prefix) == (
            self.endpoint,
            self.bucket,
            self.prefix,
        )

    # ------------------------------------------------------------ Store interface
    def write(
        self,
        state_id: str,
        entries: builtins.list[dict[str, Any]],
        info: dict[str, Any],
        *,
        create: bool = False,
    ) -> None:
        deadline = self._deadline()
        folder = self._folder(state_id)
        with self._lock_of(state_id):
            self._ensure_bucket(deadline)
            if create:
                self._create(state_id, folder, entries, info, deadline)
                return
            held = self._held.get(state_id)
            if held is not None and held.fenced:
                raise StateFencedError(_fenced(state_id, self))
            if held is None or held.token is None:
                held = self._take_over(state_id, held, deadline, entries=entries)
            new = new_entries(state_id, entries, held.committed)
            segments = int(held.doc.get("segments", 0))
            if new:
                self._put_segment(folder, held.incarnation, held.epoch, new, deadline)
                segments += 1
            self._commit(state_id, held, info, held.committed + len(new), segments, deadline)
            if segments > max(self.merge_after, held.merge_at):
                self._merge_quietly(state_id, held, deadline)

    def read(self, state_id: str) -> Record | None:
        deadline = self._deadline()
        folder = self._folder(state_id)
        self._ensure_bucket(deadline)
        fetched: dict[str, Lines] = {}
        for attempt in range(_READ_ATTEMPTS):
            got = self._get_info(folder, deadline)
            if got is None:
                return None
            doc, etag = got
            committed = int(doc["committed"])
            listed = self._list_segments(folder, str(doc["incarnation"]), deadline)
            live = live_segments(listed, committed, int(doc["epoch"]))
            damaged = f"State {state_id!r} in {self!r} is damaged"
            try:
                self._fetch(live, fetched, deadline)
            except _Vanished:
                continue  # a merge replaced a segment between our listing and our GET
            except ValueError as error:
                raise StateFormatError(f"{damaged}: {error}") from None
            entries = pick_entries(((s, fetched[s.key]) for s in live), committed)
            if len(entries) == committed:
                self._remember_read(state_id, doc, etag)
                with collection.paused():
                    parsed = _entries(entries, damaged)
                return Record(parsed, dict(doc["info"]))
            if attempt == _READ_ATTEMPTS - 1:  # listed afresh each time: not a merge race
                missing = sorted(set(range(committed)) - {seq for seq, _ in entries})
                raise StateFormatError(
                    f"{damaged}: {committed} entries are committed, but its segments lack "
                    f"{len(missing)} of them (seqs {missing[:5]}...)"
                )
        raise StoreUnavailableError(
            f"State {state_id!r} in {self!r} kept changing while it was read; try again"
        )

    def read_since(self, state_id: str, seq: int) -> Record | None:
        # One GET of info.json when nothing is new; else one LIST and the GETs of the
        # segments that hold entries from ``seq`` on (after a merge, a bigger one).
        # Unlike read, it does not count as a read a later claim is conditional on.
        deadline = self._deadline()
        folder = self._folder(state_id)
        self._ensure_bucket(deadline)
        fetched: dict[str, Lines] = {}
        for attempt in range(_READ_ATTEMPTS):
            got = self._get_info(folder, deadline)
            if got is None:
                return None
            doc = got[0]
            committed = int(doc["committed"])
            if committed <= seq:
                return Record([], dict(doc["info"]))
            listed = self._list_segments(folder, str(doc["incarnation"]), deadline)
            live = [s for s in live_segments(listed, committed, int(doc["epoch"])) if s.last >= seq]
            try:
                self._fetch(live, fetched, deadline)
            except _Vanished:
                continue
            entries = [
                (n, line)
                for n, line in pick_entries(((s, fetched[s.key]) for s in live), committed)
                if n >= seq
            ]
            if len(entries) == committed - seq or attempt == _READ_ATTEMPTS - 1:
                return Record([json.loads(line) for _, line in entries], dict(doc["info"]))
        raise StoreUnavailableError(
            f"State {state_id!r} in {self!r} kept changing while it was read; try again"
        )

    def list(self) -> builtins.list[StateInfo]:
        deadline = self._deadline()
        self._ensure_bucket(deadline)
        folders = self._request(
            "list States",
            lambda: [
                item.object_name
                for item in self.client.list_objects(self.bucket, prefix=self.prefix)
                if item.is_dir and item.object_name
            ],
            deadline,
        )
        ids: dict[str, str] = {}
        for folder in folders:
            name = folder[len(self.prefix) :].rstrip("/")
            state_id = unquote(name)
            with contextlib.suppress(ValueError):
                if state_id and encode_id(state_id) == name:  # skip folders not made by us
                    ids[state_id] = folder
        docs = self._in_parallel(
            [functools.partial(self._listed_info, folder, deadline) for folder in ids.values()]
        )
        infos = []
        for state_id, got in zip(ids, docs, strict=True):
            if got is not None and isinstance(got[0].get("info"), dict):
                infos.append(StateInfo.from_info(state_id, got[0]["info"]))
        oldest = datetime.min.replace(tzinfo=UTC)
        return sorted(infos, key=lambda i: i.updated_at or oldest, reverse=True)

    def delete(self, state_id: str) -> None:
        deadline = self._deadline()
        folder = self._folder(state_id)
        with self._lock_of(state_id):
            self._ensure_bucket(deadline)
            # info.json first: from then on the State is gone for readers and writers.
            self._request(
                f"DELETE {folder}{_INFO}",
                lambda: self.client.remove_object(self.bucket, folder + _INFO),
                deadline,
            )
            self._hold(state_id, None)
            keys = self._list_keys(folder, deadline, recursive=True)
            again = self._get_info(folder, deadline)  # created again meanwhile: keep that one
            if again is not None:
                keep = f"{folder}h-{again[0]['incarnation']}/"
                keys = [k for k in keys if not k.startswith(keep) and k != folder + _INFO]
            self._remove(keys, deadline)

    def ensure_bucket(self) -> None:
        """Create the bucket if it is missing (and ``create_bucket`` allows it).

        Every operation does this on its own first use; call it where the credentials may
        (an operator with the store's key) before handing the store to those that may not
        (run pods with per-run credentials cannot create or even look at the bucket).
        """
        self._ensure_bucket(self._deadline())

    # ------------------------------------------------------------ fencing
    def claim(self, state_id: str) -> int:
        """Take the State over as its only writer and return the new epoch.

        If this store read the State (``load``) and has not written it since, the claim
        holds only if nobody wrote it in between; otherwise :class:`StateFencedError`
        (load it again). Otherwise it takes over whatever is saved now: the writer that
        had it is fenced, its next save raises :class:`StateFencedError`. Raises
        ``LookupError`` for an unknown id.
        """
        deadline = self._deadline()
        with self._lock_of(state_id):
            self._ensure_bucket(deadline)
            held = self._held.get(state_id)
            if held is not None and (held.token is not None or held.fenced):
                held = None  # an explicit claim takes over anew
            return self._take_over(state_id, held, deadline).epoch

    def _take_over(
        self,
        state_id: str,
        seen: _Held | None,
        deadline: float,
        entries: builtins.list[dict[str, Any]] | None = None,
    ) -> _Held:
        """Write epoch + 1 with a new writer token, conditional on the version seen."""
        folder = self._folder(state_id)
        token = secrets.token_hex(8)
        conditional = seen is not None  # on what this store read: a changed State is not ours
        if seen is not None and entries and min(int(e["seq"]) for e in entries) < seen.committed:
            # A State that this store read has that many entries; these come from an
            # older copy of it, and writing them would mix two histories.
            raise StateFencedError(
                f"State {state_id!r} in {self!r} has {seen.committed} entries, but these "
                f"start at seq {entries[0]['seq']}: they come from an older copy of the "
                f"State. Load it again to continue it."
            )
        while True:
            if seen is None:
                got = self._get_info(folder, deadline)
                if got is None:
                    raise not_found_error(state_id, self)
                seen = _Held(got[0], got[1])
            doc = {**seen.doc, "epoch": seen.epoch + 1, "writer": token}
            etag = self._put_info(folder, doc, deadline, if_match=seen.etag)
            if etag is not None:
                break
            got = self._get_info(folder, deadline)
            if got is None:
                raise not_found_error(state_id, self)
            if got[0].get("writer") == token:  # our own PUT, its answer was lost
                doc, etag = got
                break
            if conditional:
                raise StateFencedError(
                    f"State {state_id!r} in {self!r} was written by another writer since "
                    f"this store read it: load it again to continue it"
                )
            seen = _Held(got[0], got[1])  # someone claimed meanwhile: claim after them
        held = _Held(doc, etag, token)
        self._hold(state_id, held)
        return held

    def _commit(
        self,
        state_id: str,
        held: _Held,
        info: dict[str, Any],
        committed: int,
        segments: int,
        deadline: float,
    ) -> None:
        folder = self._folder(state_id)
        for _ in range(3):
            doc = {**held.doc, "committed": committed, "segments": segments, "info": info}
            etag = self._put_info(folder, doc, deadline, if_match=held.etag)
            if etag is not None:
                held.doc, held.etag = doc, etag
                return
            got = self._get_info(folder, deadline)
            if got is None:
                self._hold(state_id, None)
                raise StateNotFoundError(
                    f"no saved State with id {state_id!r} in {self!r} (it was deleted while saved)"
                )
            if got[0].get("writer") != held.token or got[0].get("incarnation") != (
                held.incarnation
            ):
                held.fenced = True
                raise StateFencedError(_fenced(state_id, self))
            # Our own earlier PUT landed though its answer was lost: go on from it.
            held.doc, held.etag = got
            committed = max(committed, held.committed)
        raise StoreUnavailableError(f"State {state_id!r} in {self!r}: info.json kept changing")

    # ------------------------------------------------------------ create
    def _create(
        self,
        state_id: str,
        folder: str,
        entries: builtins.list[dict[str, Any]],
        info: dict[str, Any],
        deadline: float,
    ) -> None:
        present = self._list_keys(folder, deadline, recursive=False)
        if folder + _INFO in present:
            raise exists_error(state_id, self)
        new = new_entries(state_id, entries, 0)
        incarnation, token = secrets.token_hex(8), secrets.token_hex(8)
        written = [self._put_segment(folder, incarnation, 1, new, deadline)] if new else []
        doc: dict[str, Any] = {
            "store": _LAYOUT,
            "incarnation": incarnation,
            "epoch": 1,
            "writer": token,
            "committed": len(new),
            "segments": len(written),
            "info": info,
        }
        etag = self._put_info(folder, doc, deadline, if_none_match=True)
        if etag is None:
            got = self._get_info(folder, deadline)
            if got is None or got[0].get("writer") != token:
                with contextlib.suppress(Exception):  # invisible anyway; delete is tidiness
                    self._remove(written, deadline)
                raise exists_error(state_id, self)
            doc, etag = got  # our own PUT, its answer was lost
        self._hold(state_id, _Held(doc, etag, token))
        # Folders of incarnations that never got their info.json (a create that crashed
        # between its two PUTs): invisible, removed now that this one owns the id.
        orphans = [k for k in present if k.startswith(folder + "h-")]
        if orphans:
            with contextlib.suppress(Exception):
                keys = []
                for orphan in orphans:
                    keys += self._list_keys(orphan, deadline, recursive=True)
                self._remove(keys, deadline)

    # ------------------------------------------------------------ merging
    def _merge_quietly(self, state_id: str, held: _Held, deadline: float) -> None:
        # Within the save's own budget: a slow store makes the merge give up, not the
        # save outlast its budget.
        try:
            self._merge(state_id, held, deadline)
        except Exception as error:  # the save itself succeeded; a later one merges
            _log.warning("merging the segments of %r in %r failed: %s", state_id, self, error)
            # Not at every save: a merge that cannot work (no delete permission, say)
            # would add three requests to each.
            held.merge_at = int(held.doc.get("segments", 0)) + self.merge_after // 2

    def _merge(self, state_id: str, held: _Held, deadline: float) -> None:
        folder = self._folder(state_id)
        listed = self._list_segments(folder, held.incarnation, deadline, retry=False)
        plan = plan_merge(listed, held.committed, held.epoch)
        if plan.inputs:
            fetched: dict[str, Lines] = {}
            self._fetch(plan.inputs, fetched, deadline, retry=False)
            lines = pick_entries(((s, fetched[s.key]) for s in plan.inputs), plan.last + 1)
            lines = [(seq, line) for seq, line in lines if seq >= plan.first]
            self._put_lines(folder, held.incarnation, held.epoch, lines, deadline, retry=False)
        self._remove([s.key for s in plan.drop], deadline, retry=False)
        merged = self._segment_key(folder, held.incarnation, plan.first, plan.last, held.epoch)
        remaining = {s.key for s in listed} - {s.key for s in plan.drop}
        if plan.inputs:
            remaining.add(merged)
        # The next save's info.json carries the new count.
        held.doc = {**held.doc, "segments": len(remaining)}
        held.merge_at = len(remaining) + self.merge_after // 2

    # ------------------------------------------------------------ requests
    def _deadline(self) -> float:
        return time.monotonic() + self.retry_budget

    def _request(
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
                    f"{self!r} did not answer {what} within its budget of "
                    f"{self.retry_budget:g}s ({attempts} attempts): "
                    f"{type(failure).__name__}: {failure}"
                ) from failure
            time.sleep(pause)  # backoff between attempts

    def _ensure_bucket(self, deadline: float) -> None:
        if self._bucket_ready:
            return
        try:
            exists = self._request(
                f"HEAD bucket {self.bucket}",
                lambda: self.client.bucket_exists(self.bucket),
                deadline,
            )
        except S3Error as error:
            if error.code != "AccessDenied":
                raise
            exists = True  # allowed to use objects, not to look at the bucket: go on
        if not exists:
            if not self.create_bucket:
                raise MissingBucketError(
                    f"bucket {self.bucket!r} does not exist at {self.endpoint}, and this "
                    f"MinioStore may not create it (create_bucket=False): create it first"
                )
            try:
                self._request(
                    f"create bucket {self.bucket}",
                    lambda: self.client.make_bucket(self.bucket),
                    deadline,
                )
            except S3Error as error:
                if error.code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                    raise MissingBucketError(
                        f"bucket {self.bucket!r} does not exist at {self.endpoint}, and "
                        f"creating it failed: {error.code}: {error.message}"
                    ) from error
        self._bucket_ready = True

    def _listed_info(self, folder: str, deadline: float) -> tuple[dict[str, Any], str] | None:
        try:
            return self._get_info(folder, deadline)
        except ValueError as error:  # one damaged State does not hide the others
            _log.warning("list() skips %s: %s", folder, error)
            return None

    def _get_info(self, folder: str, deadline: float) -> tuple[dict[str, Any], str] | None:
        key = folder + _INFO

        def get() -> tuple[bytes, str] | None:
            try:
                response = self.client.get_object(self.bucket, key)
            except S3Error as error:
                if error.code == "NoSuchKey":
                    return None
                raise
            try:
                return response.read(), str(response.headers.get("ETag", ""))
            finally:
                response.close()
                response.release_conn()

        got = self._request(f"GET {key}", get, deadline)
        if got is None:
            return None
        body, etag = got
        try:
            doc = json.loads(body)
            if not isinstance(doc, dict) or not isinstance(doc.get("info"), dict):
                raise ValueError("not a MinioStore info document")
            int(doc["committed"]), int(doc["epoch"]), str(doc["incarnation"])
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(f"{key} in {self!r} is damaged: {error}") from error
        return doc, etag

    def _put_info(
        self,
        folder: str,
        doc: dict[str, Any],
        deadline: float,
        *,
        if_match: str | None = None,
        if_none_match: bool = False,
    ) -> str | None:
        """The one conditional PUT: ``info.json``, ``If-Match`` or ``If-None-Match: *``.

        Returns the new ETag, or None when the condition failed (412, or 404 for an
        ``If-Match`` on a deleted object). The public ``put_object`` cannot send these
        headers, hence the client's lower-level ``_execute``.
        """
        key = folder + _INFO
        body = json.dumps({**doc, "nonce": secrets.token_hex(8)}).encode()
        headers: dict[str, str | builtins.list[str] | tuple[str]] = {
            "Content-Type": "application/json"
        }
        if if_match is not None:
            headers["If-Match"] = if_match
        if if_none_match:
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

        return self._request(f"PUT {key}", put, deadline)

    def _segment_key(self, folder: str, incarnation: str, first: int, last: int, epoch: int) -> str:
        return f"{folder}h-{incarnation}/{segment_name(first, last, epoch)}"

    def _put_segment(
        self,
        folder: str,
        incarnation: str,
        epoch: int,
        entries: builtins.list[dict[str, Any]],
        deadline: float,
    ) -> str:
        lines = lines_of(entries)
        return self._put_lines(folder, incarnation, epoch, lines, deadline)

    def _put_lines(
        self,
        folder: str,
        incarnation: str,
        epoch: int,
        lines: Lines,
        deadline: float,
        *,
        retry: bool = True,
    ) -> str:
        key = self._segment_key(folder, incarnation, lines[0][0], lines[-1][0], epoch)
        body = b"".join(line + b"\n" for _, line in lines)
        self._request(
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
        self._keep(key, lines, len(body))
        return key

    def _list_keys(self, prefix: str, deadline: float, *, recursive: bool) -> builtins.list[str]:
        return self._request(
            f"LIST {prefix}",
            lambda: [
                str(item.object_name)
                for item in self.client.list_objects(
                    self.bucket, prefix=prefix, recursive=recursive
                )
                if item.object_name
            ],
            deadline,
        )

    def _list_segments(
        self, folder: str, incarnation: str, deadline: float, *, retry: bool = True
    ) -> builtins.list[Segment]:
        prefix = f"{folder}h-{incarnation}/"
        keys = self._request(
            f"LIST {prefix}",
            lambda: [
                str(item.object_name)
                for item in self.client.list_objects(self.bucket, prefix=prefix, recursive=True)
                if item.object_name
            ],
            deadline,
            retry=retry,
        )
        segments = (parse_segment_name(key, prefix) for key in keys)
        return [segment for segment in segments if segment is not None]

    def _fetch(
        self,
        segments: Iterable[Segment],
        into: dict[str, Lines],
        deadline: float,
        *,
        retry: bool = True,
    ) -> None:
        """GET the segments not in ``into`` yet (in parallel); raise _Vanished for a 404."""
        wanted = []
        for segment in segments:
            if segment.key not in into:
                cached = self._cached(segment.key)
                if cached is not None:
                    into[segment.key] = cached
                else:
                    wanted.append(segment)

        def get(segment: Segment) -> Lines:
            def once() -> bytes:
                try:
                    response = self.client.get_object(self.bucket, segment.key)
                except S3Error as error:
                    if error.code == "NoSuchKey":
                        raise _Vanished(segment.key) from error
                    raise
                try:
                    return response.read()
                finally:
                    response.close()
                    response.release_conn()

            body = self._request(f"GET {segment.key}", once, deadline, retry=retry)
            return parse_lines(segment, body)

        for segment, lines in zip(
            wanted,
            self._in_parallel([functools.partial(get, s) for s in wanted]),
            strict=True,
        ):
            into[segment.key] = lines

    def _remove(self, keys: Iterable[str], deadline: float, *, retry: bool = True) -> None:
        doomed = builtins.list(keys)
        if not doomed:
            return

        def remove() -> None:
            batch = [DeleteObject(key) for key in doomed]
            for error in self.client.remove_objects(self.bucket, batch):
                if error.code != "NoSuchKey":
                    raise RuntimeError(f"deleting {error.name} from {self!r} failed: {error}")

        self._request(f"DELETE {len(doomed)} objects", remove, deadline, retry=retry)
        with self._guard:
            for key in doomed:
                lines = self._cache.pop(key, None)
                if lines is not None:
                    self._cached_bytes -= lines_bytes(lines)

    def _in_parallel(self, calls: builtins.list[Callable[[], T]]) -> builtins.list[T]:
        if len(calls) <= 1:
            return [call() for call in calls]
        with self._guard:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(_FETCH_THREADS, thread_name_prefix="minio-store")
            pool = self._pool
        return builtins.list(pool.map(lambda call: call(), calls))

    # ------------------------------------------------------------ memory
    def _hold(self, state_id: str, held: _Held | None) -> None:
        # Under the guard, so that a read finishing meanwhile cannot replace what a
        # claim or create just took with the older version it read.
        with self._guard:
            if held is None:
                self._held.pop(state_id, None)
            else:
                self._held[state_id] = held

    def _remember_read(self, state_id: str, doc: dict[str, Any], etag: str) -> None:
        with self._guard:
            held = self._held.get(state_id)
            if held is None or held.token is None or held.fenced:
                self._held[state_id] = _Held(doc, etag)

    def _keep(self, key: str, lines: Lines, size: int) -> None:
        if size > self.cache_bytes // 4:
            return
        with self._guard:
            if key in self._cache:
                return
            self._cache[key] = lines
            self._cached_bytes += lines_bytes(lines)
            while self._cached_bytes > self.cache_bytes and self._cache:
                _, dropped = self._cache.popitem(last=False)
                self._cached_bytes -= lines_bytes(dropped)

    def _cached(self, key: str) -> Lines | None:
        with self._guard:
            return self._cache.get(key)

    def _lock_of(self, state_id: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(state_id, threading.Lock())

    def _folder(self, state_id: str) -> str:
        return f"{self.prefix}{encode_id(state_id)}/"


def _entries(lines: Lines, damaged: str) -> builtins.list[dict[str, Any]]:
    entries = []
    for seq, line in lines:
        try:
            entries.append(json.loads(line))
        except ValueError as error:
            raise StateFormatError(f"{damaged}: entry {seq} is not JSON ({error})") from None
    return entries


class _Vanished(Exception):
    """A listed segment was deleted (by a merge) before it was fetched."""


# ------------------------------------------------------------ pure functions
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


def _fenced(state_id: str, store: Store) -> str:
    return (
        f"State {state_id!r} in {store!r} was taken over by another writer (a newer "
        f"claim, e.g. a replacement pod): this one must stop. Nothing it saved since is "
        f"visible. Load the State again (and claim it) to continue it here."
    )
