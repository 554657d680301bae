"""Stores and tools the contract suite uses to watch and break a run."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from alpineagents import Store
from alpineagents.store import WrappedStore

NO_SPACE = OSError(28, "No space left on device")


class Watched(WrappedStore):
    """Wraps a store: records every write, and raises ``fail`` on the writes it picks."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.writes: list[tuple[list[str], bool]] = []
        self.fail_when: Callable[[list[dict[str, Any]]], BaseException | None] = lambda entries: (
            None
        )
        # Called before each write with its entries (to make a slow store, say).
        self.before_write: Callable[[list[dict[str, Any]]], None] = lambda entries: None
        self.lock = threading.Lock()

    def outgoing(
        self, state_id: str, entries: list[dict[str, Any]], info: dict[str, Any]
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        self.before_write(entries)
        failure = self.fail_when(entries)
        if failure is not None:
            raise failure
        return entries, info

    def written(self, state_id: str, entries: list[dict[str, Any]], *, create: bool) -> None:
        with self.lock:
            self.writes.append(([e["kind"] for e in entries], create))

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
