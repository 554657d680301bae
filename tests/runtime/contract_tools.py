"""Stores and tools the contract suite uses to watch and break a run."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from alpineagents import Store
from alpineagents.store import Record, StateInfo

NO_SPACE = OSError(28, "No space left on device")


class Watched(Store):
    """Wraps a store: records every write, and raises ``fail`` on the writes it picks."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.writes: list[tuple[list[str], bool]] = []
        self.fail_when: Callable[[list[dict[str, Any]]], BaseException | None] = lambda entries: (
            None
        )
        # Called before each write with its entries (to make a slow store, say).
        self.before_write: Callable[[list[dict[str, Any]]], None] = lambda entries: None
        self.lock = threading.Lock()

    def write(
        self,
        state_id: str,
        entries: list[dict[str, Any]],
        info: dict[str, Any],
        *,
        create: bool = False,
    ) -> None:
        self.before_write(entries)
        failure = self.fail_when(entries)
        if failure is not None:
            raise failure
        self.inner.write(state_id, entries, info, create=create)
        with self.lock:
            self.writes.append(([e["kind"] for e in entries], create))

    def read(self, state_id: str) -> Record | None:
        return self.inner.read(state_id)

    def list(self) -> list[StateInfo]:
        return self.inner.list()

    def delete(self, state_id: str) -> None:
        self.inner.delete(state_id)

    def same_as(self, other: Store) -> bool:
        return other is self or self.inner.same_as(other)

    def saved_kinds(self, state_id: str) -> list[str]:
        record = self.inner.read(state_id)
        return [e["kind"] for e in sorted(record.entries, key=lambda e: e["seq"])] if record else []


def fail_once(
    error: BaseException, when: Callable[[list[dict[str, Any]]], bool]
) -> Callable[[list[dict[str, Any]]], BaseException | None]:
    fired = threading.Event()

    def pick(entries: list[dict[str, Any]]) -> BaseException | None:
        if not fired.is_set() and when(entries):
            fired.set()
            return error
        return None

    return pick


def has_kind(kind: str) -> Callable[[list[dict[str, Any]]], bool]:
    return lambda entries: any(e["kind"] == kind for e in entries)
