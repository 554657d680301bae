"""Which runs wait for their turn at the shared limiter: ``status.throttled`` and the
``Throttled`` condition.

The limiter (the chart's ``pacing``, :mod:`alpineagents.pacing.service`) knows who waits;
the operator asks it every :data:`POLL_SECONDS` (one request, however many runs) and
patches the status of a run only where it changes: a run is throttled from the first
look that finds it waiting, and no longer after :data:`CLEAR_AFTER` looks in a row that
do not (a run between two waits of one fleet's turns stays throttled, not a patch per
request). Nothing here decides anything about a run: a throttled run is a running one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.request
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from alpineagents_operator.deciding.run_status import status_patch
from alpineagents_operator.kube.cluster import Cluster
from alpineagents_operator.kube.views import JSON, AgentRunView, Phase, format_time
from alpineagents_operator.watching.watched import RunKey, Watched

__all__ = ["CLEAR_AFTER", "POLL_SECONDS", "ThrottleWatch", "throttled_changes"]

_log = logging.getLogger(__name__)

POLL_SECONDS = 5.0
CLEAR_AFTER = 3
_TIMEOUT = 5.0


def throttled_changes(
    runs: Iterable[AgentRunView],
    waiting: Mapping[str, Mapping[str, Any]],
    absent: dict[RunKey, int],
    now: datetime,
) -> dict[RunKey, JSON | None]:
    """The ``status.throttled`` each run should get where it differs from its status:
    ``waiting`` is the limiter's line by run (State id), ``absent`` counts each run's
    looks in a row that did not find it waiting (updated here)."""
    changes: dict[RunKey, JSON | None] = {}
    for run in runs:
        key = (run.namespace, run.name)
        current = run.status.raw.get("throttled")
        wait = waiting.get(run.state_id) if run.status.phase == Phase.RUNNING else None
        if wait is not None:
            absent.pop(key, None)
            if not isinstance(current, Mapping) or current.get("limit") != wait.get("limit"):
                waited = float(wait.get("waited") or 0.0)
                changes[key] = {
                    "limit": str(wait.get("limit") or "requests"),
                    "since": format_time(now - timedelta(seconds=waited)),
                    "position": int(wait.get("position") or 0) or None,
                }
            continue
        if current is None:
            absent.pop(key, None)
            continue
        absent[key] = absent.get(key, 0) + 1
        if absent[key] >= CLEAR_AFTER or run.status.phase != Phase.RUNNING:
            changes[key] = None
            absent.pop(key, None)
    return changes


class ThrottleWatch:
    """Asks the limiter at ``url`` who waits, and patches the runs whose state changed."""

    def __init__(self, url: str, cluster: Cluster, watched: Watched) -> None:
        self.url = url.rstrip("/")
        self.cluster = cluster
        self.watched = watched
        self._absent: dict[RunKey, int] = {}
        self._failing = False

    async def run(self) -> None:
        """Look every :data:`POLL_SECONDS` until cancelled."""
        while True:
            await self.look()
            await asyncio.sleep(POLL_SECONDS)

    async def look(self) -> None:
        """One look: the limiter's line, then a status patch per changed run."""
        try:
            line = await asyncio.to_thread(self._waiting)
        except (OSError, ValueError) as error:
            if not self._failing:
                _log.warning("the pacer at %s cannot be asked who waits: %s", self.url, error)
            self._failing = True
            return
        self._failing = False
        now = datetime.now(UTC)
        waiting = {str(w.get("run")): w for w in line if isinstance(w, Mapping)}
        runs = {(r.namespace, r.name): r for r in self.watched.all_runs()}
        for key, value in throttled_changes(runs.values(), waiting, self._absent, now).items():
            patch = status_patch(runs[key], {"throttled": value}, now)
            if patch:
                await asyncio.to_thread(self.cluster.patch_status, *key, patch)

    def _waiting(self) -> list[Any]:
        with urllib.request.urlopen(f"{self.url}/v1/waiting", timeout=_TIMEOUT) as answer:
            line = json.loads(answer.read())
        if not isinstance(line, list):
            raise ValueError("the pacer's /v1/waiting is not a list")
        return line
