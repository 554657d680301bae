"""WrappedStore: a store in front of another, changing what goes out and what comes in.

The whole Store interface (sync and async, and the optional ``claim`` and
``ensure_bucket``) is handed to ``inner`` here once, so a wrapper keeps only its hooks:

- :meth:`WrappedStore.outgoing`: the entries and info a write sends (EncryptedStore
  seals them, the runner's LoggedStore masks secrets in them), and
  :meth:`WrappedStore.written` once ``inner`` saved them (LoggedStore logs them);
- :meth:`WrappedStore.incoming`: a record a read brings back (EncryptedStore opens it),
  and :meth:`WrappedStore.listed` for what ``list`` shows of each State.

:meth:`WrappedStore.calling_inner` surrounds every call to ``inner`` (LoggedStore notes
the store's failures there).
"""

from __future__ import annotations

import builtins
import contextlib
from collections.abc import Iterator
from typing import Any

from .base import Record, StateInfo, Store

__all__ = ["WrappedStore"]


class WrappedStore(Store):
    """``inner`` with every call passed through; subclasses override the hooks they need."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner

    # ------------------------------------------------------------ hooks
    def outgoing(
        self, state_id: str, entries: builtins.list[dict[str, Any]], info: dict[str, Any]
    ) -> tuple[builtins.list[dict[str, Any]], dict[str, Any]]:
        """What a write of ``state_id`` sends to ``inner``; unchanged by default."""
        return entries, info

    def written(
        self, state_id: str, entries: builtins.list[dict[str, Any]], *, create: bool
    ) -> None:
        """After ``inner`` saved a write's ``entries`` (as given, before :meth:`outgoing`)."""

    def incoming(self, state_id: str, record: Record) -> Record:
        """What a read of ``state_id`` returns of the ``record`` ``inner`` had."""
        return record

    def listed(self, saved: StateInfo) -> StateInfo:
        """What ``list`` shows of one State ``inner`` listed."""
        return saved

    @contextlib.contextmanager
    def calling_inner(self) -> Iterator[None]:
        """Around every call to ``inner``."""
        yield

    # ------------------------------------------------------------ the interface, passed on
    def write(
        self,
        state_id: str,
        entries: builtins.list[dict[str, Any]],
        info: dict[str, Any],
        *,
        create: bool = False,
    ) -> None:
        sent, sent_info = self.outgoing(state_id, entries, info)
        with self.calling_inner():
            self.inner.write(state_id, sent, sent_info, create=create)
        self.written(state_id, entries, create=create)

    def read(self, state_id: str) -> Record | None:
        with self.calling_inner():
            record = self.inner.read(state_id)
        return None if record is None else self.incoming(state_id, record)

    def read_since(self, state_id: str, seq: int) -> Record | None:
        with self.calling_inner():
            record = self.inner.read_since(state_id, seq)
        return None if record is None else self.incoming(state_id, record)

    def list(self) -> builtins.list[StateInfo]:
        with self.calling_inner():
            listed = self.inner.list()
        return [self.listed(saved) for saved in listed]

    def delete(self, state_id: str) -> None:
        with self.calling_inner():
            self.inner.delete(state_id)

    async def awrite(
        self,
        state_id: str,
        entries: builtins.list[dict[str, Any]],
        info: dict[str, Any],
        *,
        create: bool = False,
    ) -> None:
        sent, sent_info = self.outgoing(state_id, entries, info)
        with self.calling_inner():
            await self.inner.awrite(state_id, sent, sent_info, create=create)
        self.written(state_id, entries, create=create)

    async def aread(self, state_id: str) -> Record | None:
        with self.calling_inner():
            record = await self.inner.aread(state_id)
        return None if record is None else self.incoming(state_id, record)

    async def aread_since(self, state_id: str, seq: int) -> Record | None:
        with self.calling_inner():
            record = await self.inner.aread_since(state_id, seq)
        return None if record is None else self.incoming(state_id, record)

    async def alist(self) -> builtins.list[StateInfo]:
        with self.calling_inner():
            listed = await self.inner.alist()
        return [self.listed(saved) for saved in listed]

    async def adelete(self, state_id: str) -> None:
        with self.calling_inner():
            await self.inner.adelete(state_id)

    def supports(self, capability: str) -> bool:
        return self.inner.supports(capability)

    def claim(self, state_id: str) -> int | None:
        with self.calling_inner():
            return self.inner.claim(state_id)

    def ensure_bucket(self) -> None:
        with self.calling_inner():
            self.inner.ensure_bucket()

    @property
    def is_async_only(self) -> bool:
        return self.inner.is_async_only

    def same_as(self, other: Store) -> bool:
        """The same States as ``inner`` (a wrapper of the same kind is unwrapped first)."""
        if type(other) is type(self):
            assert isinstance(other, WrappedStore)
            other = other.inner
        return other is self.inner or self.inner.same_as(other)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.inner!r})"
