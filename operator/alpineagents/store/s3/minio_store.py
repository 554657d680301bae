"""MinioStore: States in any S3-compatible object store (MinIO, SeaweedFS, AWS S3, ...).

The layout, fencing, merging and retries are described at the package's door,
:mod:`alpineagents.store.s3`. This module is layout 2's saves, reads, listing, creates
and deletes; fencing (taking a State over, creating its next slot) is :mod:`.fencing`,
the background merges :mod:`.merges`, what an instance holds of each State
:mod:`.chains`, and layout 1 (read and converted, never written) all of :mod:`.legacy`.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import json
import logging
import secrets
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote

import urllib3
from minio import Minio
from minio.credentials.providers import Provider
from minio.error import S3Error

from ... import collection
from ...errors import (
    MissingBucketError,
    StateFencedError,
    StateFormatError,
    StoreUnavailableError,
)
from ..base import Record, StateInfo, Store, encode_id, exists_error
from . import legacy
from .chains import Chain, Chains, read_doc
from .fencing import CLAIM_ATTEMPTS, Fencing, fenced_message
from .merges import Merges
from .objects import FETCH_THREADS, BoundedPool, Objects, Vanished, checked_prefix
from .pieces import Pieces
from .slots import (
    INFO,
    LAYOUT,
    Header,
    Lines,
    cover,
    doc_bytes,
    encode_piece,
    lines_of,
    new_entries,
    slot_name,
)

__all__ = [
    "MinioStore",
    "MissingBucketError",
    "StateFencedError",
    "StoreUnavailableError",
]

_CONNECTIONS = 4 * FETCH_THREADS

_log = logging.getLogger(__name__)

_READ_ATTEMPTS = 10  # a read re-lists when a merge deletes an object under it


class MinioStore(Store):
    """Saves States in ``bucket`` under ``prefix`` of an S3-compatible object store.

    ``client`` is a ``minio.Minio`` client; :meth:`connect` builds one with bounded
    timeouts. ``retry_budget`` bounds every operation in seconds (see the module
    docstring), ``merge_after`` is the number of saves between background merges,
    ``merge_bytes`` the largest object a merge writes, ``create_bucket`` lets the store
    create a missing bucket, and ``cache_bytes`` bounds the slots kept in memory for
    merging.
    """

    def __init__(
        self,
        client: Minio,
        bucket: str,
        prefix: str = "",
        *,
        retry_budget: float = 10.0,
        merge_after: int = 16,
        merge_bytes: int = 1 << 20,
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
        self.merge_bytes = merge_bytes
        self.create_bucket = create_bucket
        self.cache_bytes = cache_bytes
        base = client._base_url
        self.endpoint = f"{'https' if base.is_https else 'http'}://{base.host}"
        """Where the store is, as ``scheme://host:port`` (no credentials)."""
        self._objects = Objects(client, bucket, self.retry_budget, repr(self))
        self._pieces = Pieces(self._objects, merge_bytes=merge_bytes, cache_bytes=cache_bytes)
        self._bucket_ready = False
        self._chains = Chains()
        self._fencing = Fencing(self, self._objects, self._pieces, self._chains)
        self._merges = Merges(self, self._objects, self._pieces, self._chains)

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
        merge_bytes: int = 1 << 20,
        create_bucket: bool = True,
    ) -> MinioStore:
        """A MinioStore with its own client: ``endpoint`` is ``host:port``.

        ``timeout`` bounds each socket wait (connect, or waiting for an answer), and
        ``retry_budget`` each whole operation. ``credentials`` (a ``minio`` credentials
        provider) replaces the three keys, e.g. to follow files that get renewed.
        ``region`` set saves the bucket-location request a client makes otherwise.
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
            merge_bytes=merge_bytes,
            create_bucket=create_bucket,
        )

    @staticmethod
    def http_client(timeout: float = 5.0, **options: Any) -> urllib3.PoolManager:
        """A ``urllib3.PoolManager`` for ``Minio(http_client=...)``.

        Each socket wait lasts at most ``timeout`` seconds and at most what is left of
        the running store operation's budget; it does not retry (the store does).
        ``options`` go to ``urllib3.PoolManager`` (e.g. ``ca_certs``).
        """
        # Connections are opened only as needed; past the pool's size each is thrown away
        # after its request, with a warning. One store may serve many threads at once
        # (the operator's reconcile steps in a burst of resumes), each fetching in parallel.
        options.setdefault("maxsize", _CONNECTIONS)
        return BoundedPool(timeout, **options)

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
        deadline = self._objects.deadline()
        folder = self._folder(state_id)
        with self._chains.lock_of(state_id):
            self._ensure_bucket(deadline)
            if create:
                self._create(state_id, folder, entries, info, deadline)
                return
            for _ in range(CLAIM_ATTEMPTS):
                chain = self._chains.get(state_id)
                if chain is not None and chain.fenced:
                    raise StateFencedError(fenced_message(state_id, self))
                looked = chain is None  # takes over what is saved now, not what it read
                if chain is None or chain.token is None:
                    chain = self._fencing.take_over(
                        state_id, folder, chain, deadline, entries=entries
                    )
                first_of_epoch = chain.post
                new = new_entries(state_id, entries, chain.count)
                try:
                    self._fencing.append(state_id, folder, chain, lines_of(new), info, deadline)
                    break
                except StateFencedError:
                    if not (looked and first_of_epoch):
                        raise
                    self._chains.hold(state_id, None)  # written since we looked: look again
            else:
                raise StoreUnavailableError(
                    f"State {state_id!r} in {self!r} kept changing while it was saved"
                )
            if chain.unmerged >= self.merge_after:
                chain.unmerged = 0
                self._merges.start(state_id, folder, chain.incarnation)

    def read(self, state_id: str) -> Record | None:
        got = self._read(state_id, since=0, remember=True)
        if got is None:
            return None
        lines, info = got
        damaged = f"State {state_id!r} in {self!r} is damaged"
        with collection.paused():
            return Record(_entries(lines, damaged), info)

    def read_since(self, state_id: str, seq: int) -> Record | None:
        # One GET of info.json, one listing, and the GETs of the newest objects, back to
        # the one that holds ``seq``: following a long run costs what is new. Unlike read,
        # it does not count as a read a later claim is conditional on.
        got = self._read(state_id, since=seq, remember=False)
        if got is None:
            return None
        lines, info = got
        return Record([json.loads(line) for n, line in lines if n >= seq], info)

    def list(self) -> builtins.list[StateInfo]:
        deadline = self._objects.deadline()
        self._ensure_bucket(deadline)
        folders = [
            key
            for key, _, is_dir in self._objects.list(self.prefix, deadline, recursive=False)
            if is_dir
        ]
        ids: dict[str, str] = {}
        for folder in folders:
            name = folder[len(self.prefix) :].rstrip("/")
            state_id = unquote(name)
            with contextlib.suppress(ValueError):
                if state_id and encode_id(state_id) == name:  # skip folders not made by us
                    ids[state_id] = folder
        infos = self._objects.in_parallel(
            [functools.partial(self._listed_info, folder, deadline) for folder in ids.values()]
        )
        listed = [
            StateInfo.from_info(state_id, info)
            for state_id, info in zip(ids, infos, strict=True)
            if info is not None
        ]
        oldest = datetime.min.replace(tzinfo=UTC)
        return sorted(listed, key=lambda i: i.updated_at or oldest, reverse=True)

    def delete(self, state_id: str) -> None:
        deadline = self._objects.deadline()
        folder = self._folder(state_id)
        self._merges.wait(state_id)
        with self._chains.lock_of(state_id):
            self._ensure_bucket(deadline)
            got = read_doc(self._objects, folder, deadline, repr(self))
            keep: set[str] = set()
            if got is not None and got[0].get("store") == LAYOUT:
                keep.add(self._fencing.plant_deleted(folder, str(got[0]["incarnation"]), deadline))
            # info.json next: from then on the State is gone for readers and writers.
            self._objects.request(
                f"DELETE {folder}{INFO}",
                lambda: self.client.remove_object(self.bucket, folder + INFO),
                deadline,
            )
            self._chains.hold(state_id, None)
            keys = [key for key, _, _ in self._objects.list(folder, deadline)]
            again = read_doc(
                self._objects, folder, deadline, repr(self)
            )  # created again meanwhile: keep that one
            if again is not None:
                kept_folder = f"{folder}h-{again[0]['incarnation']}/"
                keys = [k for k in keys if not k.startswith(kept_folder) and k != folder + INFO]
            self._objects.remove([k for k in keys if k not in keep], deadline)
            self._pieces.forget(keys)

    def ensure_bucket(self) -> None:
        """Create the bucket if it is missing (and ``create_bucket`` allows it).

        Every operation does this on its own first use; call it where the credentials may
        (an operator with the store's key) before handing the store to those that may not
        (run pods with per-run credentials cannot create or even look at the bucket).
        """
        self._ensure_bucket(self._objects.deadline())

    def tag_state(self, state_id: str, tags: dict[str, str]) -> int:
        """Set object ``tags`` on every object of the State, for a bucket lifecycle rule
        that filters on them (the operator's ``onDelete: Expire``); returns how many
        objects were tagged (0: no such State). Call it once no one writes the State."""
        from minio.commonconfig import Tags

        tagged = Tags.new_object_tags()
        tagged.update(tags)
        folder = self._folder(state_id)
        self._merges.wait(state_id)
        with self._chains.lock_of(state_id):
            listed = self._objects.list(folder, self._objects.deadline())
            keys = [key for key, _, is_folder in listed if not is_folder]
            for key in keys:
                self._objects.request(
                    f"TAG {key}",
                    functools.partial(self.client.set_object_tags, self.bucket, key, tagged),
                    self._objects.deadline(),
                )
        return len(keys)

    def wait_for_merges(self, timeout: float | None = None) -> None:
        """Wait until the merges this store started in the background are done."""
        self._merges.wait_all(timeout)

    # ------------------------------------------------------------ fencing
    def claim(self, state_id: str) -> int:
        """Take the State over as its only writer and return the new epoch.

        If this store read the State (``load``) and has not written it since, the claim
        holds only if nobody wrote it in between; otherwise :class:`StateFencedError`
        (load it again). Otherwise it takes over whatever is saved now: the writer that
        had it is fenced, its next save raises :class:`StateFencedError`. Raises
        ``LookupError`` for an unknown id.
        """
        deadline = self._objects.deadline()
        folder = self._folder(state_id)
        with self._chains.lock_of(state_id):
            self._ensure_bucket(deadline)
            chain = self._chains.get(state_id)
            if chain is not None and (chain.token is not None or chain.fenced):
                chain = None  # an explicit claim takes over anew
            for _ in range(CLAIM_ATTEMPTS):
                owned = self._fencing.take_over(state_id, folder, chain, deadline)
                if not owned.post:  # converted from layout 1: that was the claim
                    return owned.epoch
                try:  # the claim slot: the new epoch's fence post
                    self._fencing.append(
                        state_id, folder, owned, [], owned.info, deadline, kind="claim"
                    )
                    return owned.epoch
                except StateFencedError:
                    if chain is not None:
                        raise  # conditional on what this store read
                    # written between our look and our claim: look again
            raise StoreUnavailableError(
                f"State {state_id!r} in {self!r} kept changing while it was claimed; try again"
            )

    # ------------------------------------------------------------ create
    def _create(
        self,
        state_id: str,
        folder: str,
        entries: builtins.list[dict[str, Any]],
        info: dict[str, Any],
        deadline: float,
    ) -> None:
        present = [key for key, _, _ in self._objects.list(folder, deadline, recursive=False)]
        if folder + INFO in present:
            raise exists_error(state_id, self)
        lines = lines_of(new_entries(state_id, entries, 0))
        incarnation, token = secrets.token_hex(8), secrets.token_hex(8)
        key = f"{folder}h-{incarnation}/{slot_name(0)}"
        header = Header(0, len(lines) - 1, 1, token, info, "save", True)
        body = encode_piece(header, (line for _, line in lines))
        self._objects.put(key, body, deadline)
        doc = {"store": LAYOUT, "incarnation": incarnation, "writer": token}
        if self._objects.put_conditional(folder + INFO, doc_bytes(doc), deadline) is None:
            got = read_doc(self._objects, folder, deadline, repr(self))
            if got is None or got[0].get("writer") != token:
                with contextlib.suppress(Exception):  # invisible anyway; delete is tidiness
                    self._objects.remove([key], deadline)
                raise exists_error(state_id, self)
            # our own PUT, its answer was lost
        chain = Chain(incarnation, 1, len(lines), 1, info, token=token, unmerged=1)
        self._chains.hold(state_id, chain)
        self._pieces.keep(key, header, lines, len(body))
        # Folders of incarnations without an info.json (a create that crashed between its
        # two PUTs, a deleted State's fence): invisible, removed now that this one owns it.
        orphans = [k for k in present if k.startswith(folder + "h-")]
        if orphans:
            with contextlib.suppress(Exception):
                keys = []
                for orphan in orphans:
                    keys += [k for k, _, _ in self._objects.list(orphan, deadline)]
                self._objects.remove(keys, deadline)

    def _read(
        self, state_id: str, *, since: int, remember: bool
    ) -> tuple[Lines, dict[str, Any]] | None:
        """The entries (all, or from seq ``since`` on, give or take) and the info."""
        deadline = self._objects.deadline()
        folder = self._folder(state_id)
        self._ensure_bucket(deadline)
        damaged = f"State {state_id!r} in {self!r} is damaged"
        seen: dict[str, tuple[Header, Lines]] = {}  # objects are immutable: kept across tries
        for _ in range(_READ_ATTEMPTS):
            got = read_doc(self._objects, folder, deadline, repr(self))
            if got is None:
                return None
            doc, etag = got
            try:
                if doc.get("store") != LAYOUT:
                    lines = legacy.read_lines(self._objects, folder, doc, deadline)
                    if lines is None:
                        continue
                    if remember:
                        self._chains.remember_read(
                            state_id,
                            Chain(
                                str(doc["incarnation"]),
                                0,
                                len(lines),
                                int(doc["epoch"]),
                                dict(doc["info"]),
                                legacy=(doc, etag),
                            ),
                        )
                    return lines, dict(doc["info"])
                chain = self._read_chain(folder, str(doc["incarnation"]), since, deadline, seen)
            except ValueError as error:
                raise StateFormatError(f"{damaged}: {error}") from None
            if chain is None:
                continue  # a merge replaced an object between our listing and our GET
            lines, read = chain
            if read.info is None:
                raise StateFormatError(f"{damaged}: its newest slot has no info")
            if remember:
                self._chains.remember_read(state_id, read)
            return lines, read.info
        raise StoreUnavailableError(
            f"State {state_id!r} in {self!r} kept changing while it was read; try again"
        )

    def _read_chain(
        self,
        folder: str,
        incarnation: str,
        since: int,
        deadline: float,
        seen: dict[str, tuple[Header, Lines]],
    ) -> tuple[Lines, Chain] | None:
        """The chain's entries and what a writer needs to know; None to read again."""
        covering = cover(self._pieces.list(folder, incarnation, deadline))
        if not covering:
            return None
        try:
            if since > 0:  # the newest object first: a follower usually needs only it
                needed = self._pieces.fetch(covering[-1:], deadline, seen)
                if needed[0][0].first > since:
                    older = [p for p in covering[:-1] if not (p.merged and p.last < since)]
                    needed = self._pieces.fetch(older, deadline, seen) + needed
            else:
                needed = self._pieces.fetch(covering, deadline, seen)
        except Vanished:
            return None
        lines: Lines = []
        expected = needed[0][0].first if since > 0 else 0
        if since == 0 and expected != 0:
            raise ValueError("its first slot is missing")
        for _, piece_lines in needed:
            for seq, line in piece_lines:
                if seq < expected:
                    continue  # held by the object before too
                if seq != expected:
                    raise ValueError(f"entry {expected} is missing (found {seq})")
                lines.append((seq, line))
                expected += 1
        newest = needed[-1][0]
        if newest.kind == "deleted":
            return None  # deleted while read: info.json is gone now
        chain = Chain(
            incarnation, covering[-1].high + 1, newest.last + 1, newest.epoch, newest.info
        )
        return lines, chain

    def _listed_info(self, folder: str, deadline: float) -> dict[str, Any] | None:
        # One damaged or vanishing State does not hide the others.
        try:
            got = read_doc(self._objects, folder, deadline, repr(self))
            if got is None:
                return None
            doc = got[0]
            if doc.get("store") != LAYOUT:
                return dict(doc["info"])
            incarnation = str(doc["incarnation"])
            for _ in range(_READ_ATTEMPTS):
                covering = cover(self._pieces.list(folder, incarnation, deadline))
                if not covering:
                    return None
                header = self._pieces.header(covering[-1].key, deadline)
                if header is not None:
                    return header.info if header.kind != "deleted" else None
        except (ValueError, KeyError, TypeError) as error:
            _log.warning("list() skips %s: %s", folder, error)
        return None

    # ------------------------------------------------------------ bucket
    def _ensure_bucket(self, deadline: float) -> None:
        if self._bucket_ready:
            return
        try:
            exists = self._objects.request(
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
                self._objects.request(
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
