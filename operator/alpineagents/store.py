"""The Store interface: where States are saved.

A store implements the small data interface (``write``/``read`` and optionally
``list``/``delete``, or their async ``a``-versions). Everything a user calls on top of
it (``load``, ``save``) is built here once, so every store behaves the same.
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple, TypeVar

from .state import READABLE_FORMATS, State, check_id

T = TypeVar("T")


class Record(NamedTuple):
    """What a store gives back for one State: its entries (as dicts) and its info."""

    entries: builtins.list[dict[str, Any]]
    info: dict[str, Any]


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


def check_format(state_id: str, info: dict[str, Any]) -> None:
    """Refuse a State saved in a format this version cannot read (the one place that knows)."""
    version = info.get("v")
    if version not in READABLE_FORMATS:
        readable = " and ".join(str(v) for v in READABLE_FORMATS)
        raise ValueError(
            f"State {state_id!r} was saved in format {version!r}; this alpineagents reads "
            f"formats {readable} only, and there is no converter"
        )


def _ordered(state_id: str, entries: builtins.list[dict[str, Any]]) -> list[dict[str, Any]]:
    # Stores may hand back entries sent twice or out of order; seq decides.
    by_seq: dict[int, dict[str, Any]] = {}
    for entry in entries:
        by_seq.setdefault(int(entry["seq"]), entry)
    ordered = [by_seq[seq] for seq in sorted(by_seq)]
    for index, entry in enumerate(ordered):
        if int(entry["seq"]) != index:
            raise ValueError(
                f"State {state_id!r} is damaged: its history has no entry {index} "
                f"(the store holds seqs {sorted(by_seq)[:5]}...)"
            )
    return ordered


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
        with ``ValueError``, and write all of it or nothing. Without ``create``, an id you
        do not have raises ``LookupError``.
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

    def same_as(self, other: Store) -> bool:
        """Whether ``other`` reaches the same saved States (FileStore: the same folder)."""
        return other is self

    # ------------------------------------------------------------ built on top
    def load(self, state_id: str) -> State:
        """Read a saved State and replay its history.

        If it was saved in the middle of a turn, the turn is closed with entries of
        its own (written by the next save). Raises ``LookupError`` for an unknown id.
        """
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
            raise LookupError(f"no saved State with id {state_id!r} in {self!r}")
        entries, info = record
        check_format(state_id, info)
        state = State._from_record(state_id, _ordered(state_id, list(entries)), dict(info))
        state._store, state._saved, state._saved_info = self, len(state.history), dict(info)
        state._close_open_turn(None)
        return state

    def _plan(
        self, state: State
    ) -> tuple[builtins.list[dict[str, Any]], dict[str, Any], bool] | None:
        self._claim(state)
        with state._lock:
            entries = [entry.to_dict() for entry in state.history[state._saved :]]
            info = state._info()
        if not entries and _same_info(info, state._saved_info):
            return None
        return entries, info, state._store is None

    def _saved(self, state: State, count: int, info: dict[str, Any]) -> None:
        with state._lock:
            state._store = self
            state._saved += count
            state._saved_info = info

    def _claim(self, state: State) -> None:
        owner = state._store
        if owner is not None and not (owner is self or owner.same_as(self)):
            raise ValueError(
                f"State {state.id!r} is saved in {owner!r}, not in {self!r}: a State is saved "
                f"in one store. Load it from this store, or run it with an Agent whose store "
                f"is the one it was saved in."
            )

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


def _overrides(store: Store, method: str) -> bool:
    return getattr(type(store), method) is not getattr(Store, method)


def _same_info(info: dict[str, Any], saved: dict[str, Any] | None) -> bool:
    if saved is None:
        return False
    ignore = {"updated_at"}
    return {k: v for k, v in info.items() if k not in ignore} == {
        k: v for k, v in saved.items() if k not in ignore
    }
