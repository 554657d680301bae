"""The Store interface: where States are saved.

A store implements the small data interface (``write``/``read`` and optionally
``list``/``delete``, or their async ``a``-versions). Everything a user calls on top of
it (``load``, ``save``) is built here once, so every store behaves the same.

Two optional capabilities have defaults here, and ``store.supports(name)`` says whether
a store really has one: ``claim`` (fence older writers of a State: MinioStore) and
``ensure_bucket`` (create what the store needs where the credentials may: MinioStore).
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import quote

from .. import collection
from ..errors import StateExistsError, StateNotFoundError
from ..state import Record, State, check_id

__all__ = ["CAPABILITIES", "Record", "StateInfo", "Store", "check_owner", "encode_id"]

CAPABILITIES = ("claim", "ensure_bucket")
"""The optional parts of the Store interface a store may have (see :meth:`Store.supports`)."""

T = TypeVar("T")
_MAX_NAME = 255  # bytes of a file name on the usual filesystems


@dataclass(frozen=True)
class StateInfo:
    """What ``store.list()`` shows of a saved State, read from its info alone."""

    id: str
    first_message: str | None = None
    updated_at: datetime | None = None
    stopped: str | None = None
    parent_id: str | None = None
    entries: int = 0
    answer: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_info(cls, state_id: str, info: dict[str, Any]) -> StateInfo:
        updated = info.get("updated_at")
        return cls(
            id=state_id,
            first_message=info.get("first_message"),
            updated_at=datetime.fromisoformat(updated) if updated else None,
            stopped=info.get("stopped"),
            parent_id=info.get("parent_id"),
            entries=int(info.get("entries", 0)),
            answer=info.get("answer"),
            extra=dict(info),
        )


class Store:
    """Base class of stores. Subclass it and implement ``write`` and ``read``.

    Add ``list`` and ``delete`` for those calls. A store reached asynchronously
    implements ``awrite``, ``aread``, ``alist`` and ``adelete`` instead; a sync store
    also works from async code, its methods running on a worker thread.
    """

    # ------------------------------------------------------------ the data interface
    def write(
        self,
        state_id: str,
        entries: builtins.list[dict[str, Any]],
        info: dict[str, Any],
        *,
        create: bool = False,
    ) -> None:
        """Save new entries and the info of a State. Skip entries whose seq you have.

        ``create=True`` is the first write of a new State: refuse an id you already have
        with ``ValueError`` (``StateExistsError`` is one), and write all of it or nothing.
        Without ``create``, an id you do not have raises ``LookupError``
        (``StateNotFoundError`` is one).
        """
        self._sync_missing("write")

    def read(self, state_id: str) -> Record | None:
        """The saved entries and info of a State, or ``None`` if there is none."""
        return self._sync_missing("read")  # type: ignore[no-any-return]

    def list(self) -> builtins.list[StateInfo]:
        """A StateInfo for each saved State, most recently updated first."""
        return self._sync_missing("list")  # type: ignore[no-any-return]

    def delete(self, state_id: str) -> None:
        """Delete one State (not its subagents). Deleting an unknown id does nothing."""
        self._sync_missing("delete")

    def read_since(self, state_id: str, seq: int) -> Record | None:
        """What is new of a State for a reader that has its first ``seq`` entries.

        The entries from ``seq`` on (none when nothing is new) and the info, or ``None``
        if there is no such State. This one reads the whole history and drops the rest;
        a store that can read only a history's tail overrides it (FileStore and
        MinioStore do), so following a long run costs what is new, not its length.
        """
        return _from_seq(self.read(state_id), seq)

    async def awrite(
        self,
        state_id: str,
        entries: builtins.list[dict[str, Any]],
        info: dict[str, Any],
        *,
        create: bool = False,
    ) -> None:
        await self._on_thread(lambda: self.write(state_id, entries, info, create=create), "write")

    async def aread(self, state_id: str) -> Record | None:
        return await self._on_thread(lambda: self.read(state_id), "read")

    async def alist(self) -> builtins.list[StateInfo]:
        return await self._on_thread(self.list, "list")

    async def adelete(self, state_id: str) -> None:
        await self._on_thread(lambda: self.delete(state_id), "delete")

    async def aread_since(self, state_id: str, seq: int) -> Record | None:
        if _overrides(self, "aread") and not _overrides(self, "read_since"):
            return _from_seq(await self.aread(state_id), seq)  # an async-only store
        return await self._on_thread(lambda: self.read_since(state_id, seq), "read")

    def same_as(self, other: Store) -> bool:
        """Whether ``other`` reaches the same saved States (FileStore: the same folder)."""
        return other is self

    # ------------------------------------------------------------ optional capabilities
    def supports(self, capability: str) -> bool:
        """Whether this store has ``capability`` (one of :data:`CAPABILITIES`) of its own,
        rather than the default that does nothing."""
        if capability not in CAPABILITIES:
            raise ValueError(
                f"unknown store capability {capability!r}: one of {', '.join(CAPABILITIES)}"
            )
        return _overrides(self, capability)

    def claim(self, state_id: str) -> int | None:
        """Take the State over as its only writer: older writers' next saves are refused.

        A store that can fence (MinioStore) returns the new epoch; this default, for a
        store with one writer per State by construction, does nothing and returns ``None``.
        """
        return None

    def ensure_bucket(self) -> None:
        """Create what the store needs before States are saved, where the credentials may
        (an operator with the store's key, before run pods with narrower ones). Nothing by
        default; MinioStore creates its bucket."""

    # ------------------------------------------------------------ built on top
    def load(self, state_id: str) -> State:
        """Read a saved State and replay its history.

        If it was saved in the middle of a turn, the turn is closed with entries of
        its own (written by the next save): :meth:`State.from_record` does the whole load.
        Raises :class:`~alpineagents.errors.StateNotFoundError` (a ``LookupError``) for an
        unknown id, :class:`~alpineagents.errors.StateFormatError` (a ``ValueError``) for
        a format this version cannot read.
        """
        # One pause of the collector for the read and the replay: the record read dies
        # before collection resumes, so no pass walks the parsed lines (see collection).
        with collection.paused(long_lived=True):
            return self._loaded(state_id, self.read(check_id(state_id)))

    async def aload(self, state_id: str) -> State:
        return self._loaded(state_id, await self.aread(check_id(state_id)))

    def save(self, state: State) -> None:
        """Write what the store does not have of ``state`` yet; nothing if nothing changed."""
        plan = self._plan(state)
        if plan is not None:
            entries, info, create = plan
            self.write(state.id, entries, info, create=create)
            self._saved(state, len(entries), info)

    async def asave(self, state: State) -> None:
        plan = self._plan(state)
        if plan is not None:
            entries, info, create = plan
            await self.awrite(state.id, entries, info, create=create)
            self._saved(state, len(entries), info)

    @property
    def is_async_only(self) -> bool:
        """True for a store that implements only the async interface."""
        kind = type(self)
        return kind.write is Store.write and kind.awrite is not Store.awrite

    # ------------------------------------------------------------ internals
    def _loaded(self, state_id: str, record: Record | None) -> State:
        if record is None:
            raise not_found_error(state_id, self)
        state = State.from_record(state_id, record)
        state.save_cursor = _SaveCursor(self, state.loaded_entries, dict(record.info))
        return state

    def _plan(
        self, state: State
    ) -> tuple[builtins.list[dict[str, Any]], dict[str, Any], bool] | None:
        check_owner(self, state)
        cursor = _cursor_of(state)
        entries, info = state.to_record(since=cursor.entries if cursor is not None else 0)
        if not entries and cursor is not None and _same_info(info, cursor.info):
            return None
        return entries, info, cursor is None

    def _saved(self, state: State, count: int, info: dict[str, Any]) -> None:
        cursor = _cursor_of(state)
        before = cursor.entries if cursor is not None else 0
        state.save_cursor = _SaveCursor(self, before + count, info)

    def _sync_missing(self, method: str) -> Any:
        if _overrides(self, f"a{method}"):
            raise TypeError(
                f"{type(self).__name__} is async-only: call 'await store.a{method}(...)', "
                f"and run agents with 'await agent.arun(state)'"
            )
        raise NotImplementedError(f"{type(self).__name__} does not implement {method}()")

    async def _on_thread(self, call: Callable[[], T], method: str) -> T:
        if not _overrides(self, method):
            raise NotImplementedError(f"{type(self).__name__} does not implement a{method}()")
        return await asyncio.to_thread(call)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def check_owner(store: Store | None, state: State) -> None:
    """Refuse to save ``state`` with ``store`` (``None``: without a store) when another
    store saved or loaded it: a State is saved in one store."""
    cursor = _cursor_of(state)
    if cursor is None:
        return
    owner = cursor.store
    if store is None:
        raise ValueError(f"State {state.id!r} is saved in {owner!r}; this Agent has no store")
    if not (owner is store or owner.same_as(store)):
        raise ValueError(
            f"State {state.id!r} is saved in {owner!r}, not in {store!r}: a State is saved "
            f"in one store. Load it from this store, or run it with an Agent whose store "
            f"is the one it was saved in."
        )


def encode_id(state_id: str) -> str:
    """A file or key name for ``state_id`` that cannot escape its folder (no ``/``,
    ``..`` or NUL): percent-encoding, with dots encoded too. Refuses what
    :func:`~alpineagents.state.check_id` refuses, and a name over 255 bytes (a file
    name's limit)."""
    name = quote(check_id(state_id), safe="-_").replace(".", "%2E")
    if len(name.encode()) > _MAX_NAME:
        raise ValueError(
            f"State id {state_id[:40]!r}... is too long for a store: its encoded name takes "
            f"{len(name.encode())} bytes, and file and key names take at most {_MAX_NAME}"
        )
    return name


def exists_error(state_id: str, store: Store) -> StateExistsError:
    """The error of a ``create=True`` write whose id a saved State already has."""
    return StateExistsError(
        f"a State with id {state_id!r} already exists in {store!r}: continue it with "
        f"store.load({state_id!r}), or pick another id"
    )


def not_found_error(state_id: str, store: Store) -> StateNotFoundError:
    """The error of a load, or a write without ``create``, of an id the store lacks."""
    return StateNotFoundError(f"no saved State with id {state_id!r} in {store!r}")


@dataclass(frozen=True)
class _SaveCursor:
    """The store side's bookkeeping on a State (``State.save_cursor``): which store has
    it, how many of its entries, and the info saved last (to skip unchanged saves)."""

    store: Store
    entries: int
    info: dict[str, Any]


def _cursor_of(state: State) -> _SaveCursor | None:
    cursor = state.save_cursor
    if cursor is not None and not isinstance(cursor, _SaveCursor):
        raise TypeError(f"State {state.id!r} has a save cursor of {type(cursor).__name__}")
    return cursor


def _from_seq(record: Record | None, seq: int) -> Record | None:
    if record is None:
        return None
    return Record([e for e in record.entries if int(e["seq"]) >= seq], record.info)


def _overrides(store: Store, method: str) -> bool:
    return getattr(type(store), method) is not getattr(Store, method)


def _same_info(info: dict[str, Any], saved: dict[str, Any] | None) -> bool:
    if saved is None:
        return False
    ignore = {"updated_at"}
    return {k: v for k, v in info.items() if k not in ignore} == {
        k: v for k, v in saved.items() if k not in ignore
    }
