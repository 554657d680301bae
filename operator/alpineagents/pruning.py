"""``alpineagents prune``: a store's old States deleted, judged by age and status.

A State is pruned when it was last updated before the cut-off and its status is among
those asked for: by default the ended ones (``answered``, ``max_turns``,
``budget_exceeded``, ``error``). ``interrupted`` and ``waiting_for_approval`` (a run that
can go on), ``lost`` (no stop, its process gone) and ``open`` (no stop, and the store
cannot tell whether a process runs it) go only when named. A State a process is running
(its run lock held) is never pruned. Each State is judged on its own: a subagent's State
(``parent_id``) by its own age and status.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from .liveness import open_status
from .store import StateInfo, Store

__all__ = ["ENDED", "STATUSES", "Prunable", "parse_age", "parse_statuses", "prunable"]

ENDED = ("answered", "max_turns", "budget_exceeded", "error")
"""The statuses pruned when none is named: runs that ended."""
STATUSES = (*ENDED, "interrupted", "waiting_for_approval", "lost", "open")
"""Every status a State can be pruned by."""
_UNITS = {"w": 7 * 86400, "d": 86400, "h": 3600, "m": 60, "s": 1}
_AGE = re.compile(r"(?:(\d+)([wdhms]))+")
_PART = re.compile(r"(\d+)([wdhms])")


@dataclass(frozen=True)
class Prunable:
    """A State to prune: its id, when it was last updated, and its status."""

    id: str
    updated_at: datetime | None
    status: str


def parse_age(text: str) -> timedelta:
    """``30d``, ``12h``, ``1d12h``, ``90m``, ``45s``, ``2w`` as a timedelta; raises
    ValueError saying how to write one."""
    cleaned = text.strip().lower()
    if not cleaned or not _AGE.fullmatch(cleaned):
        raise ValueError(
            f"--older-than takes an age like 30d, 12h, 1d12h, 90m or 2w "
            f"(w, d, h, m, s), not {text!r}"
        )
    return timedelta(seconds=sum(int(n) * _UNITS[unit] for n, unit in _PART.findall(cleaned)))


def parse_statuses(named: Iterable[str] | None) -> frozenset[str]:
    """The statuses ``--status`` names (each may list several, comma-separated), or
    :data:`ENDED`; raises ValueError naming an unknown one and the known ones."""
    chosen = {part.strip() for item in named or () for part in item.split(",") if part.strip()}
    unknown = sorted(chosen - set(STATUSES))
    if unknown:
        raise ValueError(
            f"--status {', '.join(unknown)} is not a status: use {', '.join(STATUSES)}"
        )
    return frozenset(chosen or ENDED)


def prunable(
    store: Store,
    infos: Sequence[StateInfo],
    older_than: timedelta,
    statuses: frozenset[str],
    now: datetime | None = None,
) -> list[Prunable]:
    """The States of ``infos`` (``store.list()``) to prune, oldest first."""
    cut_off = (now or datetime.now(UTC)) - older_than
    chosen = []
    for info in infos:
        updated = _aware(info.updated_at)
        if updated is None or updated >= cut_off:
            continue
        status = info.stopped or open_status(store, info.id)
        if status in statuses:
            chosen.append(Prunable(info.id, updated, status))
    return sorted(chosen, key=lambda p: (p.updated_at or cut_off, p.id))


def _aware(moment: datetime | None) -> datetime | None:
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=UTC)
