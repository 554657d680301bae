"""MinioStore: States in any S3-compatible object store (MinIO, SeaweedFS, AWS S3, ...).

The layout, fencing, merging and retries are described at the package's door,
:mod:`alpineagents.store.s3`; layout 1 (read and converted, never written) is all in
:mod:`.legacy`.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import json
import logging
import secrets
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NoReturn
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
    StateNotFoundError,
    StoreUnavailableError,
)
from ..base import Record, StateInfo, Store, encode_id, exists_error, not_found_error
from . import legacy
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
    next_slot,
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
_CLAIM_ATTEMPTS = 5  # a take-over of what is saved now looks again when it loses a race


@dataclass
class _Chain:
    """What this store instance knows of one State's chain."""

    incarnation: str
    slot: int  # the next slot to write
    count: int  # entries in the chain
    epoch: int
    info: dict[str, Any] | None
    token: str | None = None  # our writer token, when this instance owns the State
    fenced: bool = False
    checked: bool = False  # the next write lists the chain after its create (see fencing)
    post: bool = False  # the next write opens an epoch: a fence post
    since_read: bool = False  # a take-over conditional on a read: a write since fences us
    unmerged: int = 0  # slots written since the last merge was started
    legacy: tuple[dict[str, Any], str] | None = None  # a layout-1 info.json and its ETag


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
        self._held: dict[str, _Chain] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self._merger: ThreadPoolExecutor | None = None
        self._merges: dict[str, Future[None]] = {}
        self._merge_again: set[str] = set()

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
        with self._lock_of(state_id):
            self._ensure_bucket(deadline)
            if create:
                self._create(state_id, folder, entries, info, deadline)
                return
            for _ in range(_CLAIM_ATTEMPTS):
                chain = self._held.get(state_id)
                if chain is not None and chain.fenced:
                    raise StateFencedError(_fenced(state_id, self))
                looked = chain is None  # takes over what is saved now, not what it read
                if chain is None or chain.token is None:
                    chain = self._take_over(state_id, chain, deadline, entries=entries)
                first_of_epoch = chain.post
                new = new_entries(state_id, entries, chain.count)
                try:
                    self._append(state_id, folder, chain, lines_of(new), info, deadline)
                    break
                except StateFencedError:
                    if not (looked and first_of_epoch):
                        raise
                    self._hold(state_id, None)  # written since we looked: look again
            else:
                raise StoreUnavailableError(
                    f"State {state_id!r} in {self!r} kept changing while it was saved"
                )
            if chain.unmerged >= self.merge_after:
                chain.unmerged = 0
                self._start_merge(state_id, folder, chain.incarnation)

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
        self._wait_merge(state_id)
        with self._lock_of(state_id):
            self._ensure_bucket(deadline)
            got = self._get_doc(folder, deadline)
            keep: set[str] = set()
            if got is not None and got[0].get("store") == LAYOUT:
                keep.add(self._plant_deleted(folder, str(got[0]["incarnation"]), deadline))
            # info.json next: from then on the State is gone for readers and writers.
            self._objects.request(
                f"DELETE {folder}{INFO}",
                lambda: self.client.remove_object(self.bucket, folder + INFO),
                deadline,
            )
            self._hold(state_id, None)
            keys = [key for key, _, _ in self._objects.list(folder, deadline)]
            again = self._get_doc(folder, deadline)  # created again meanwhile: keep that one
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

    def wait_for_merges(self, timeout: float | None = None) -> None:
        """Wait until the merges this store started in the background are done."""
        with self._guard:
            running = builtins.list(self._merges.values())
        wait_futures(running, timeout=timeout)

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
        with self._lock_of(state_id):
            self._ensure_bucket(deadline)
            chain = self._held.get(state_id)
            if chain is not None and (chain.token is not None or chain.fenced):
                chain = None  # an explicit claim takes over anew
            for _ in range(_CLAIM_ATTEMPTS):
                owned = self._take_over(state_id, chain, deadline)
                if not owned.post:  # converted from layout 1: that was the claim
                    return owned.epoch
                try:  # the claim slot: the new epoch's fence post
                    self._append(state_id, folder, owned, [], owned.info, deadline, kind="claim")
                    return owned.epoch
                except StateFencedError:
                    if chain is not None:
                        raise  # conditional on what this store read
                    # written between our look and our claim: look again
            raise StoreUnavailableError(
                f"State {state_id!r} in {self!r} kept changing while it was claimed; try again"
            )

    def _take_over(
        self,
        state_id: str,
        seen: _Chain | None,
        deadline: float,
        entries: builtins.list[dict[str, Any]] | None = None,
    ) -> _Chain:
        """A chain this instance owns, from the read ``seen`` (or what is saved now).

        For layout 2 nothing is written yet: the next slot written opens the new epoch.
        """
        folder = self._folder(state_id)
        since_read = seen is not None  # on what this store read: a changed State is not ours
        if seen is not None and entries and min(int(e["seq"]) for e in entries) < seen.count:
            # A State that this store read has that many entries; these come from an
            # older copy of it, and writing them would mix two histories.
            raise StateFencedError(
                f"State {state_id!r} in {self!r} has {seen.count} entries, but these "
                f"start at seq {entries[0]['seq']}: they come from an older copy of the "
                f"State. Load it again to continue it."
            )
        chain = seen if seen is not None else self._learn(state_id, folder, deadline)
        if chain.legacy is not None:
            return self._convert(state_id, folder, chain, since_read, deadline)
        owned = _Chain(
            chain.incarnation,
            chain.slot,
            chain.count,
            chain.epoch + 1,
            chain.info,
            token=secrets.token_hex(8),
            checked=True,
            post=True,
            since_read=since_read,
        )
        self._hold(state_id, owned)
        return owned

    def _learn(self, state_id: str, folder: str, deadline: float) -> _Chain:
        """The chain as it is saved now: info.json, one listing, the newest header."""
        got = self._get_doc(folder, deadline)
        if got is None:
            raise not_found_error(state_id, self)
        doc, etag = got
        if doc.get("store") != LAYOUT:
            return _Chain(
                str(doc["incarnation"]),
                0,
                int(doc["committed"]),
                int(doc["epoch"]),
                dict(doc["info"]),
                legacy=(doc, etag),
            )
        incarnation = str(doc["incarnation"])
        pieces = self._pieces.list(folder, incarnation, deadline)
        if not pieces:
            raise StateFormatError(f"State {state_id!r} in {self!r} has no slots: damaged")
        newest = max(pieces, key=lambda p: (p.high, p.merged))
        header = self._pieces.header(newest.key, deadline)
        if header is None:  # merged away meanwhile: look again
            return self._learn(state_id, folder, deadline)
        return _Chain(incarnation, newest.high + 1, header.last + 1, header.epoch, header.info)

    def _append(
        self,
        state_id: str,
        folder: str,
        chain: _Chain,
        lines: Lines,
        info: dict[str, Any] | None,
        deadline: float,
        *,
        kind: str = "save",
    ) -> None:
        """Create the next slot with ``lines`` (entries ``chain.count`` on) and ``info``."""
        assert chain.token is not None
        prefix = f"{folder}h-{chain.incarnation}/"
        while True:
            slot = chain.slot
            key = prefix + slot_name(slot)
            header = Header(
                chain.count,
                chain.count + len(lines) - 1,
                chain.epoch,
                chain.token,
                info,
                kind,
                chain.post,
            )
            body = encode_piece(header, (line for _, line in lines))
            try:
                created = self._objects.put_conditional(
                    key, body, deadline, content_type="application/x-ndjson"
                )
            except BaseException:
                chain.checked = True  # it may have landed: the next write makes sure
                raise
            if created is None:
                theirs = self._pieces.header(key, deadline)
                if theirs is None or theirs.writer != chain.token:
                    self._refused(state_id, chain, theirs)
                # Our own create, its answer lost (now, or in a save that failed).
                self._advance(chain, theirs)
                lines = [(seq, line) for seq, line in lines if seq > theirs.last]
                if not lines and theirs.info == info:
                    return
                continue
            if chain.checked:
                listed = self._pieces.list(folder, chain.incarnation, deadline)
                if any(p.high > slot or (p.merged and p.high == slot) for p in listed):
                    # A merge had deleted this slot: ours is a copy nobody reads.
                    self._refused(state_id, chain, None)
            self._advance(chain, header)
            chain.unmerged += 1
            self._pieces.keep(key, header, lines, len(body))
            return

    def _advance(self, chain: _Chain, header: Header) -> None:
        chain.slot += 1
        chain.count = header.last + 1
        chain.info = header.info
        chain.checked = chain.post = chain.since_read = False

    def _refused(self, state_id: str, chain: _Chain, theirs: Header | None) -> NoReturn:
        """Someone else holds the slot this instance meant to write: it is fenced."""
        chain.fenced = True
        if theirs is not None and theirs.kind == "deleted":
            self._hold(state_id, None)
            raise StateNotFoundError(
                f"no saved State with id {state_id!r} in {self!r} (it was deleted while saved)"
            )
        if chain.since_read:
            raise StateFencedError(
                f"State {state_id!r} in {self!r} was written by another writer since "
                f"this store read it: load it again to continue it"
            )
        raise StateFencedError(_fenced(state_id, self))

    def _plant_deleted(self, folder: str, incarnation: str, deadline: float) -> str:
        """Create a *deleted* slot after the chain: a writer still saving finds it."""
        prefix = f"{folder}h-{incarnation}/"
        for _ in range(5):
            key = prefix + slot_name(next_slot(self._pieces.list(folder, incarnation, deadline)))
            header = Header(0, -1, 0, secrets.token_hex(8), None, "deleted", True)
            if self._objects.put_conditional(key, encode_piece(header, []), deadline):
                return key
        raise StoreUnavailableError(f"{self!r}: the State in {folder} kept growing while deleted")

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
            got = self._get_doc(folder, deadline)
            if got is None or got[0].get("writer") != token:
                with contextlib.suppress(Exception):  # invisible anyway; delete is tidiness
                    self._objects.remove([key], deadline)
                raise exists_error(state_id, self)
            # our own PUT, its answer was lost
        chain = _Chain(incarnation, 1, len(lines), 1, info, token=token, unmerged=1)
        self._hold(state_id, chain)
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

    def _convert(
        self, state_id: str, folder: str, seen: _Chain, since_read: bool, deadline: float
    ) -> _Chain:
        """Convert a layout-1 State to layout 2 (see :mod:`.legacy`), as its owner."""
        assert seen.legacy is not None
        doc, etag = seen.legacy
        try:
            converted = legacy.convert(
                self._objects,
                folder,
                doc,
                etag,
                deadline,
                get_doc=lambda: self._get_doc(folder, deadline),
                changed_since_read=(lambda: StateFencedError(_changed(state_id, self)))
                if since_read
                else None,
                missing=lambda: not_found_error(state_id, self),
                attempts=_CLAIM_ATTEMPTS,
            )
        except TimeoutError:
            raise StoreUnavailableError(
                f"State {state_id!r} in {self!r} kept changing while it was converted"
            ) from None
        if converted is None:  # someone converted it meanwhile
            return self._take_over(state_id, None, deadline)
        c = converted
        chain = _Chain(c.incarnation, 1, c.count, c.epoch, c.info, token=c.token)
        self._hold(state_id, chain)
        return chain

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
            got = self._get_doc(folder, deadline)
            if got is None:
                return None
            doc, etag = got
            try:
                if doc.get("store") != LAYOUT:
                    lines = legacy.read_lines(self._objects, folder, doc, deadline)
                    if lines is None:
                        continue
                    if remember:
                        self._remember_read(
                            state_id,
                            _Chain(
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
                self._remember_read(state_id, read)
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
    ) -> tuple[Lines, _Chain] | None:
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
        chain = _Chain(
            incarnation, covering[-1].high + 1, newest.last + 1, newest.epoch, newest.info
        )
        return lines, chain

    def _listed_info(self, folder: str, deadline: float) -> dict[str, Any] | None:
        # One damaged or vanishing State does not hide the others.
        try:
            got = self._get_doc(folder, deadline)
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

    def _get_doc(self, folder: str, deadline: float) -> tuple[dict[str, Any], str] | None:
        key = folder + INFO
        got = self._objects.get(key, deadline)
        if got is None:
            return None
        body, etag = got
        try:
            doc = json.loads(body)
            if not isinstance(doc, dict):
                raise ValueError("not a MinioStore info document")
            if doc.get("store") == LAYOUT:
                str(doc["incarnation"])
            else:
                legacy.check_doc(doc)
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(f"{key} in {self!r} is damaged: {error}") from error
        return doc, etag

    # ------------------------------------------------------------ merging
    def _start_merge(self, state_id: str, folder: str, incarnation: str) -> None:
        with self._guard:
            running = self._merges.get(state_id)
            if running is not None and not running.done():
                self._merge_again.add(state_id)  # it merges once more when it is done
                return
            if self._merger is None:
                self._merger = ThreadPoolExecutor(1, thread_name_prefix="minio-store-merge")
            self._merges[state_id] = self._merger.submit(
                self._merge_quietly, state_id, folder, incarnation
            )

    def _wait_merge(self, state_id: str) -> None:
        with self._guard:
            running = self._merges.get(state_id)
        if running is not None:
            wait_futures([running])

    def _merge_quietly(self, state_id: str, folder: str, incarnation: str) -> None:
        again = True
        while again:
            chain = self._held.get(state_id)
            if chain is None or chain.token is None or chain.fenced:
                return  # no longer ours to merge
            if chain.incarnation != incarnation:
                return
            try:
                # Only slots whose create was answered: one whose answer was lost is
                # checked by the next save, which must not find it merged by us.
                self._pieces.merge(folder, incarnation, chain.slot, self._objects.deadline())
            except Exception as error:  # the saves succeeded; a later one merges again
                _log.warning("merging the slots of %r in %r failed: %s", state_id, self, error)
            with self._guard:
                again = state_id in self._merge_again
                self._merge_again.discard(state_id)

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

    # ------------------------------------------------------------ memory
    def _hold(self, state_id: str, chain: _Chain | None) -> None:
        # Under the guard, so that a read finishing meanwhile cannot replace what a
        # claim or create just took with the older version it read.
        with self._guard:
            if chain is None:
                self._held.pop(state_id, None)
            else:
                self._held[state_id] = chain

    def _remember_read(self, state_id: str, chain: _Chain) -> None:
        with self._guard:
            held = self._held.get(state_id)
            if held is None or held.token is None or held.fenced:
                self._held[state_id] = chain

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


def _fenced(state_id: str, store: Store) -> str:
    return (
        f"State {state_id!r} in {store!r} was taken over by another writer (a newer "
        f"claim, e.g. a replacement pod): this one must stop. Nothing it saved since is "
        f"visible. Load the State again (and claim it) to continue it here."
    )


def _changed(state_id: str, store: Store) -> str:
    return (
        f"State {state_id!r} in {store!r} was written by another writer since this store "
        f"read it: load it again to continue it"
    )
