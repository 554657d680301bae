"""MemoryStore: the spec page's store of your own, shipped typed, for tests and demos.

It keeps States in a dict, so it forgets them when the process ends. It is the example
of "Write your own store" on the spec page (``docs/survive-crashes-and-restarts.md``),
and passes the same conformance suite as the stores that come with alpineagents
(:mod:`alpineagents.testing.conformance`).
"""

from __future__ import annotations

import builtins
from datetime import UTC, datetime
from typing import Any

from ..store.base import Record, StateInfo, Store

__all__ = ["MemoryStore"]


class MemoryStore(Store):
    """Keeps States in a dict. A real store writes to a database."""

    def __init__(self) -> None:
        self.records: dict[str, Record] = {}

    def write(
        self,
        state_id: str,
        entries: builtins.list[dict[str, Any]],
        info: dict[str, Any],
        *,
        create: bool = False,
    ) -> None:
        old = self.records.get(state_id)
        if create and old is not None:
            raise ValueError(f"{state_id} already exists")
        if not create and old is None:
            raise LookupError(state_id)
        kept = old.entries if old else []
        new = [entry for entry in entries if entry["seq"] >= len(kept)]  # skip entries sent again
        self.records[state_id] = Record(kept + new, dict(info))

    def read(self, state_id: str) -> Record | None:
        return self.records.get(state_id)

    def list(self) -> builtins.list[StateInfo]:
        infos = [
            StateInfo.from_info(state_id, record.info) for state_id, record in self.records.items()
        ]
        oldest = datetime.min.replace(tzinfo=UTC)
        return sorted(infos, key=lambda i: i.updated_at or oldest, reverse=True)

    def delete(self, state_id: str) -> None:
        self.records.pop(state_id, None)
