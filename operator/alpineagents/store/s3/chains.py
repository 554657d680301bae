"""What one :class:`~.minio_store.MinioStore` instance knows of the States it read or
writes: a :class:`Chain` per id (its next slot, its epoch, whether this instance owns it
or was fenced), a lock per id, and ``info.json``, the document that names the current
chain (see the package's docstring)."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

from . import legacy
from .objects import Objects
from .slots import INFO, LAYOUT

__all__ = ["Chain", "Chains", "read_doc"]


@dataclass
class Chain:
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


class Chains:
    """The chains one store instance holds, by State id, and a lock per id that its
    writes, claims and deletes of that id take."""

    def __init__(self) -> None:
        self._held: dict[str, Chain] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def get(self, state_id: str) -> Chain | None:
        """The chain held for ``state_id``, if any."""
        return self._held.get(state_id)

    def hold(self, state_id: str, chain: Chain | None) -> None:
        """Hold ``chain`` for ``state_id`` (None: forget it)."""
        # Under the guard, so that a read finishing meanwhile cannot replace what a
        # claim or create just took with the older version it read.
        with self._guard:
            if chain is None:
                self._held.pop(state_id, None)
            else:
                self._held[state_id] = chain

    def remember_read(self, state_id: str, chain: Chain) -> None:
        """Hold what a read saw, unless this instance owns the State (and is not fenced)."""
        with self._guard:
            held = self._held.get(state_id)
            if held is None or held.token is None or held.fenced:
                self._held[state_id] = chain

    def lock_of(self, state_id: str) -> threading.Lock:
        """The lock of ``state_id``'s writes, claims and deletes in this instance."""
        with self._guard:
            return self._locks.setdefault(state_id, threading.Lock())


def read_doc(
    objects: Objects, folder: str, deadline: float, where: str
) -> tuple[dict[str, Any], str] | None:
    """``folder``'s ``info.json`` (layout 2's or layout 1's, checked) and its ETag; None
    when the State does not exist. ``where`` names the store in the error of a damaged one."""
    key = folder + INFO
    got = objects.get(key, deadline)
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
        raise ValueError(f"{key} in {where} is damaged: {error}") from error
    return doc, etag
