"""Fencing, one writer per State (see the package's docstring): a State taken over (a new
epoch, a new writer token), its next slot created by its owner, a slot found taken (the
writer is fenced), a layout-1 State converted by its new owner, and the *deleted* slot
that keeps a writer out of a State deleted under it."""

from __future__ import annotations

import builtins
import secrets
from typing import Any, NoReturn

from ...errors import StateFencedError, StateFormatError, StateNotFoundError, StoreUnavailableError
from ..base import Store, not_found_error
from . import legacy
from .chains import Chain, Chains, read_doc
from .objects import Objects
from .pieces import Pieces
from .slots import LAYOUT, Header, Lines, encode_piece, next_slot, slot_name

__all__ = ["CLAIM_ATTEMPTS", "Fencing", "fenced_message"]

CLAIM_ATTEMPTS = 5  # a take-over of what is saved now looks again when it loses a race


class Fencing:
    """The fencing of ``store``'s States: its requests go through ``objects`` and
    ``pieces``, what it learns and takes is held in ``chains``."""

    def __init__(self, store: Store, objects: Objects, pieces: Pieces, chains: Chains) -> None:
        self._store = store
        self._objects = objects
        self._pieces = pieces
        self._chains = chains

    def take_over(
        self,
        state_id: str,
        folder: str,
        seen: Chain | None,
        deadline: float,
        entries: builtins.list[dict[str, Any]] | None = None,
    ) -> Chain:
        """A chain this instance owns, from the read ``seen`` (or what is saved now).

        For layout 2 nothing is written yet: the next slot written opens the new epoch.
        """
        since_read = seen is not None  # on what this store read: a changed State is not ours
        if seen is not None and entries and min(int(e["seq"]) for e in entries) < seen.count:
            # A State that this store read has that many entries; these come from an
            # older copy of it, and writing them would mix two histories.
            raise StateFencedError(
                f"State {state_id!r} in {self._store!r} has {seen.count} entries, but these "
                f"start at seq {entries[0]['seq']}: they come from an older copy of the "
                f"State. Load it again to continue it."
            )
        chain = seen if seen is not None else self._learn(state_id, folder, deadline)
        if chain.legacy is not None:
            return self._convert(state_id, folder, chain, since_read, deadline)
        owned = Chain(
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
        self._chains.hold(state_id, owned)
        return owned

    def append(
        self,
        state_id: str,
        folder: str,
        chain: Chain,
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
                _advance(chain, theirs)
                lines = [(seq, line) for seq, line in lines if seq > theirs.last]
                if not lines and theirs.info == info:
                    return
                continue
            if chain.checked:
                listed = self._pieces.list(folder, chain.incarnation, deadline)
                if any(p.high > slot or (p.merged and p.high == slot) for p in listed):
                    # A merge had deleted this slot: ours is a copy nobody reads.
                    self._refused(state_id, chain, None)
            _advance(chain, header)
            chain.unmerged += 1
            self._pieces.keep(key, header, lines, len(body))
            return

    def plant_deleted(self, folder: str, incarnation: str, deadline: float) -> str:
        """Create a *deleted* slot after the chain: a writer still saving finds it."""
        prefix = f"{folder}h-{incarnation}/"
        for _ in range(5):
            key = prefix + slot_name(next_slot(self._pieces.list(folder, incarnation, deadline)))
            header = Header(0, -1, 0, secrets.token_hex(8), None, "deleted", True)
            if self._objects.put_conditional(key, encode_piece(header, []), deadline):
                return key
        raise StoreUnavailableError(
            f"{self._store!r}: the State in {folder} kept growing while deleted"
        )

    def _learn(self, state_id: str, folder: str, deadline: float) -> Chain:
        """The chain as it is saved now: info.json, one listing, the newest header."""
        got = read_doc(self._objects, folder, deadline, repr(self._store))
        if got is None:
            raise not_found_error(state_id, self._store)
        doc, etag = got
        if doc.get("store") != LAYOUT:
            return Chain(
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
            raise StateFormatError(f"State {state_id!r} in {self._store!r} has no slots: damaged")
        newest = max(pieces, key=lambda p: (p.high, p.merged))
        header = self._pieces.header(newest.key, deadline)
        if header is None:  # merged away meanwhile: look again
            return self._learn(state_id, folder, deadline)
        return Chain(incarnation, newest.high + 1, header.last + 1, header.epoch, header.info)

    def _convert(
        self, state_id: str, folder: str, seen: Chain, since_read: bool, deadline: float
    ) -> Chain:
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
                get_doc=lambda: read_doc(self._objects, folder, deadline, repr(self._store)),
                changed_since_read=(
                    lambda: StateFencedError(_changed_message(state_id, self._store))
                )
                if since_read
                else None,
                missing=lambda: not_found_error(state_id, self._store),
                attempts=CLAIM_ATTEMPTS,
            )
        except TimeoutError:
            raise StoreUnavailableError(
                f"State {state_id!r} in {self._store!r} kept changing while it was converted"
            ) from None
        if converted is None:  # someone converted it meanwhile
            return self.take_over(state_id, folder, None, deadline)
        c = converted
        chain = Chain(c.incarnation, 1, c.count, c.epoch, c.info, token=c.token)
        self._chains.hold(state_id, chain)
        return chain

    def _refused(self, state_id: str, chain: Chain, theirs: Header | None) -> NoReturn:
        """Someone else holds the slot this instance meant to write: it is fenced."""
        chain.fenced = True
        if theirs is not None and theirs.kind == "deleted":
            self._chains.hold(state_id, None)
            raise StateNotFoundError(
                f"no saved State with id {state_id!r} in {self._store!r} "
                f"(it was deleted while saved)"
            )
        if chain.since_read:
            raise StateFencedError(_changed_message(state_id, self._store))
        raise StateFencedError(fenced_message(state_id, self._store))


def _advance(chain: Chain, header: Header) -> None:
    chain.slot += 1
    chain.count = header.last + 1
    chain.info = header.info
    chain.checked = chain.post = chain.since_read = False


def fenced_message(state_id: str, store: Store) -> str:
    """What a writer another one took the State over from is told."""
    return (
        f"State {state_id!r} in {store!r} was taken over by another writer (a newer "
        f"claim, e.g. a replacement pod): this one must stop. Nothing it saved since is "
        f"visible. Load the State again (and claim it) to continue it here."
    )


def _changed_message(state_id: str, store: Store) -> str:
    return (
        f"State {state_id!r} in {store!r} was written by another writer since this store "
        f"read it: load it again to continue it"
    )
