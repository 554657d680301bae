"""The operator's own use of the runs' stores: reading a run's saved State, claiming it
before a replacement pod starts, and making a new store's bucket exist.

Every store is opened through the store policy (:func:`.store_policy.guarded_opener`), so
the operator's key goes nowhere else; one instance per store URL is kept and reused.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from alpineagents import Store
from alpineagents.store import redact
from alpineagents_operator.credentials import saved_state
from alpineagents_operator.kube.config import OperatorConfig
from alpineagents_operator.kube.metrics import OperatorMetrics
from alpineagents_operator.kube.pods import store_url
from alpineagents_operator.kube.views import AgentRunView, SavedView


class RunStores:
    """The stores the operator reads and claims runs' States in."""

    def __init__(
        self,
        config: OperatorConfig,
        metrics: OperatorMetrics,
        open_store: Callable[[str], Store],
    ) -> None:
        """``open_store`` opens a store URL (already guarded by the store policy)."""
        self._config = config
        self._metrics = metrics
        self._open_store = open_store
        self._stores: dict[str, Store] = {}
        self._stores_with_bucket: set[str] = set()
        self._fencers: dict[str, Store] = {}
        """Store instances that only claim (never read): see :meth:`fence`."""

    def store(self, url: str) -> Store:
        """The store at ``url``, opened once."""
        store = self._stores.get(url)
        if store is None:
            store = self._stores[url] = self._open_store(url)
        return store

    async def read_saved(self, run: AgentRunView) -> SavedView:
        """What ``run``'s State holds now (an error in the view, never raised)."""
        url = store_url(run, self._config)
        try:
            store = self.store(url)
        except Exception as error:  # a bad URL: let the pod report it in its own words
            return SavedView(exists=False, error=f"cannot open store {redact(url)!r}: {error}")
        saved = await asyncio.to_thread(saved_state.read_saved, store, run.state_id)
        if saved.error is not None:
            self._metrics.record_store_error("read")
        return saved

    async def make_bucket_exist(self, run: AgentRunView) -> None:
        """Have the operator's store create a missing bucket before a pod with credentials
        of its own starts: those reach the run's State folder only, so the first run on a
        new store (a fresh bundled MinIO) would fail with NoSuchBucket and restart.
        Reading the State does it (a MinioStore creates its bucket on first use)."""
        url = store_url(run, self._config)
        if url in self._stores_with_bucket:
            return
        saved = await self.read_saved(run)
        if saved.error is None:
            self._stores_with_bucket.add(url)

    async def fence(self, run: AgentRunView) -> str | None:
        """Claim the run's State so a lost pod still running can write no more into it;
        returns why that failed (None: claimed, or the store has no claims).

        The claim goes through a store instance that never reads: a store that read the
        State claims only if nobody wrote since its read, and the lost pod writing is
        just what the claim is for. This one takes over whatever is saved now.
        """
        url = store_url(run, self._config)
        try:
            store = self._fencers.get(url)
            if store is None:
                store = self._fencers[url] = self._open_store(url)
            await asyncio.to_thread(saved_state.claim, store, run.state_id)
        except Exception as error:  # any failure: the replacement waits and tries again
            self._metrics.record_store_error("claim")
            return f"{type(error).__name__}: {error}"
        return None
