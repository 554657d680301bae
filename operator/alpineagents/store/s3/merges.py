"""The background merges of one store instance (see the package's docstring): one thread,
never the save, merges a State's newest slots when enough were saved; a merge asked for
while one runs is done once more after it. What a merge writes and deletes is
:meth:`.pieces.Pieces.merge`."""

from __future__ import annotations

import builtins
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures

from ..base import Store
from .chains import Chains
from .objects import Objects
from .pieces import Pieces

__all__ = ["Merges"]

_log = logging.getLogger(__name__)


class Merges:
    """The merges ``store`` started: each of a chain this instance still owns (in
    ``chains``), through ``pieces``."""

    def __init__(self, store: Store, objects: Objects, pieces: Pieces, chains: Chains) -> None:
        self._store = store
        self._objects = objects
        self._pieces = pieces
        self._chains = chains
        self._guard = threading.Lock()
        self._merger: ThreadPoolExecutor | None = None
        self._merges: dict[str, Future[None]] = {}
        self._merge_again: set[str] = set()

    def start(self, state_id: str, folder: str, incarnation: str) -> None:
        """Merge the chain's newest slots in the background (again after a running one)."""
        with self._guard:
            running = self._merges.get(state_id)
            if running is not None and not running.done():
                self._merge_again.add(state_id)  # it merges once more when it is done
                return
            if self._merger is None:
                self._merger = ThreadPoolExecutor(1, thread_name_prefix="minio-store-merge")
            self._merges[state_id] = self._merger.submit(
                self._merge_quietly, state_id, folder, incarnation
            )

    def wait(self, state_id: str) -> None:
        """Wait until the merge of ``state_id`` running now (if one is) is done."""
        with self._guard:
            running = self._merges.get(state_id)
        if running is not None:
            wait_futures([running])

    def wait_all(self, timeout: float | None = None) -> None:
        """Wait until every merge started so far is done (or ``timeout`` seconds)."""
        with self._guard:
            running = builtins.list(self._merges.values())
        wait_futures(running, timeout=timeout)

    def _merge_quietly(self, state_id: str, folder: str, incarnation: str) -> None:
        again = True
        while again:
            chain = self._chains.get(state_id)
            if chain is None or chain.token is None or chain.fenced:
                return  # no longer ours to merge
            if chain.incarnation != incarnation:
                return
            try:
                # Only slots whose create was answered: one whose answer was lost is
                # checked by the next save, which must not find it merged by us.
                self._pieces.merge(folder, incarnation, chain.slot, self._objects.deadline())
            except Exception as error:  # the saves succeeded; a later one merges again
                _log.warning(
                    "merging the slots of %r in %r failed: %s", state_id, self._store, error
                )
            with self._guard:
                again = state_id in self._merge_again
                self._merge_again.discard(state_id)
