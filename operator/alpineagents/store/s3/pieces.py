"""A State's pieces in the bucket, its slots and merged objects: listing, fetching (with
the pieces this store instance wrote or merged kept in memory), reading a header, and
merging. :class:`~.minio_store.MinioStore` decides when to merge (see its module
docstring); this module does it."""

from __future__ import annotations

import builtins
import threading
from collections import OrderedDict

from .objects import Objects
from .slots import (
    Header,
    Lines,
    Piece,
    cover,
    encode_piece,
    merged_name,
    parse_header,
    parse_piece_name,
    plan_merge,
    split_piece,
    unneeded,
)

__all__ = ["Pieces"]

_HEADER_BYTES = 64 << 10  # a ranged GET for a header: info is small


class Pieces:
    """The pieces of the States in one bucket, through ``objects``. ``merge_bytes`` is the
    largest object a merge writes; ``cache_bytes`` bounds the pieces kept in memory."""

    def __init__(self, objects: Objects, *, merge_bytes: int, cache_bytes: int) -> None:
        self._objects = objects
        self._merge_bytes = merge_bytes
        self._cache_bytes = cache_bytes
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, tuple[Header, Lines]] = OrderedDict()
        self._cached_bytes = 0
        self._posts: set[str] = set()  # keys of fence posts merges met (kept for good)

    def list(
        self, folder: str, incarnation: str, deadline: float, *, retry: bool = True
    ) -> builtins.list[Piece]:
        """The pieces of one incarnation's chain, as listed (unordered)."""
        prefix = f"{folder}h-{incarnation}/"
        listed = self._objects.list(prefix, deadline, retry=retry)
        pieces = (parse_piece_name(key, prefix, size) for key, size, _ in listed)
        return [piece for piece in pieces if piece is not None]

    def fetch(
        self,
        pieces: builtins.list[Piece],
        deadline: float,
        found: dict[str, tuple[Header, Lines]] | None = None,
    ) -> builtins.list[tuple[Header, Lines]]:
        """Each piece's header and entries (from ``found`` or memory, else GET in
        parallel), in order; what it GETs goes into ``found``."""
        if found is None:
            found = {}
        for piece in pieces:
            if piece.key in found:
                continue
            cached = self._cached(piece.key)
            if cached is not None:
                found[piece.key] = cached
        bodies = self._objects.fetch_all([p.key for p in pieces if p.key not in found], deadline)
        for key, body in bodies.items():
            found[key] = split_piece(key, body)
        return [found[p.key] for p in pieces]

    def header(self, key: str, deadline: float) -> Header | None:
        """The header of one object (a ranged GET); None if it is gone."""
        cached = self._cached(key)
        if cached is not None:
            return cached[0]
        got = self._objects.get(key, deadline, length=_HEADER_BYTES)
        if got is None:
            return None
        body = got[0]
        if b"\n" not in body:
            whole = self._objects.get(key, deadline)
            if whole is None:
                return None
            body = whole[0]
        return parse_header(key, body[: body.index(b"\n")])

    def merge(self, folder: str, incarnation: str, below: int, deadline: float) -> None:
        """Merge the newest of slots ``0..below-1`` (see :func:`.slots.plan_merge`)."""
        prefix = f"{folder}h-{incarnation}/"
        listed = [
            piece
            for piece in self.list(folder, incarnation, deadline, retry=False)
            if piece.high < below
        ]
        covering = cover(listed)
        if not covering:
            return
        inputs = plan_merge(covering, self._merge_bytes)
        got: dict[str, tuple[Header, Lines]] = {}
        if inputs:
            fetched = self.fetch(inputs, deadline)
            got = {piece.key: pair for piece, pair in zip(inputs, fetched, strict=True)}
            lines: Lines = []
            expected = fetched[0][0].first
            for _, piece_lines in fetched:  # pieces of a cover may overlap
                for seq, line in piece_lines:
                    if seq >= expected:
                        lines.append((seq, line))
                        expected = seq + 1
            first, newest = fetched[0][0].first, fetched[-1][0]
            merged_header = Header(
                first, newest.last, newest.epoch, newest.writer, newest.info, "merged", False
            )
            body = encode_piece(merged_header, (line for _, line in lines))
            key = prefix + merged_name(inputs[0].low, inputs[-1].high, first, newest.last)
            self._objects.put(key, body, deadline, retry=False)
            self.keep(key, merged_header, lines, len(body))  # the next merge's input
            merged = Piece(key, inputs[0].low, inputs[-1].high, True, len(body), first, newest.last)
            listed = [*listed, merged]
            covering = cover(listed) or []
        merged_away, slots = unneeded(listed, covering)
        doomed = [piece.key for piece in merged_away]
        for piece in slots:  # keep fence posts: they fence the writers of older epochs
            if piece.key in self._posts:
                continue
            header = got[piece.key][0] if piece.key in got else self.header(piece.key, deadline)
            if header is not None and not header.post:
                doomed.append(piece.key)
            elif header is not None:
                self._posts.add(piece.key)  # not read again by the next merge
        self._objects.remove(doomed, deadline, retry=False)
        self.forget(doomed)

    def keep(self, key: str, header: Header, lines: Lines, size: int) -> None:
        if size > self._cache_bytes // 4:
            return
        with self._lock:
            if key in self._cache:
                return
            self._cache[key] = (header, lines)
            self._cached_bytes += _size(lines)
            while self._cached_bytes > self._cache_bytes and self._cache:
                _, (_, dropped) = self._cache.popitem(last=False)
                self._cached_bytes -= _size(dropped)

    def _cached(self, key: str) -> tuple[Header, Lines] | None:
        with self._lock:
            return self._cache.get(key)

    def forget(self, keys: builtins.list[str]) -> None:
        with self._lock:
            for key in keys:
                pair = self._cache.pop(key, None)
                if pair is not None:
                    self._cached_bytes -= _size(pair[1])


def _size(lines: Lines) -> int:
    return sum(len(line) + 1 for _, line in lines)
