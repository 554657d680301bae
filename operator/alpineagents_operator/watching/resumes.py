"""The operator's start: every run kopf resumes is judged from the watches' views, once
one paged listing of the run pods has put every pod in them.

When the operator starts, kopf lists every AgentRun and every run pod and calls the
resume handler of each run. A run could be judged from the views there and then only if
its pods were known, and kopf's pod listing may not have arrived yet (the two watches
list side by side). Stepping each run instead (a GET of the run, a LIST of its pods)
cost two requests per run, and each waiting step held its run's body: with 10,000 runs,
minutes of start and most of the operator's memory. So the resume handler only queues
the run's key; :meth:`Resumes.run` lists the run pods itself, a page at a time, into the
views, then judges each queued run as the resync does (:meth:`.Triage.step_needed`)
and steps, a few at a time, only the runs a step would change. A run resumed after that
listing is judged as it comes.

The listing adds only the pods the watch has not shown (as they are, or as gone while the
listing ran): a view the watch delivered stands, and the watch's next event brings
whatever changed since, with its own step. Should the listing fail, each queued run is
stepped as before.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from alpineagents_operator.kube.views import JSON, RUN_LABEL, PodView
from alpineagents_operator.watching.watched import RunKey, Watched

_log = logging.getLogger(__name__)
PAGE = 500
"""Objects per page of a listing, the operator's own of the run pods and kopf's of runs
and pods (one page's bodies in memory at a time, not the whole listing's)."""
_JUDGED_PER_YIELD = 200
"""Runs judged between two yields to the event loop (a watch event waits at most that many)."""

ListPage = Callable[[str | None, int, str], tuple[list[JSON], str]]
"""``Cluster.list_run_pods_page``: (namespace, limit, token) → (pods, next token)."""


class Resumes:
    """The runs kopf resumed, judged once their pods are all in the views."""

    def __init__(
        self,
        watched: Watched,
        list_page: ListPage,
        namespaces: Sequence[str | None],
        watches: Callable[[str], bool],
        judge: Callable[[RunKey], bool],
        step: Callable[[RunKey], Awaitable[None]],
        steps_at_once: int,
    ) -> None:
        """``namespaces`` are listed (None: the whole cluster), and pods kept from the
        namespaces ``watches`` takes in (as kopf's watches do); ``judge`` says whether a
        run needs a step (from the views); ``step`` takes it (and logs its failure: the
        resync steps that run again)."""
        self._watched = watched
        self._list_page = list_page
        self._namespaces = list(namespaces)
        self._watches = watches
        self._judge = judge
        self._step = step
        self._slots = asyncio.Semaphore(steps_at_once)
        self._queued: asyncio.Queue[RunKey] = asyncio.Queue()
        self._stepping: set[asyncio.Task[None]] = set()
        self._listed = False
        """Every run pod is in the views (False: not yet, or the listing failed)."""

    def add(self, key: RunKey) -> None:
        """kopf resumed this run: judge it (at once, unless the pods are being listed)."""
        self._queued.put_nowait(key)

    async def run(self) -> None:
        """List the run pods into the views, then judge the resumed runs as they come."""
        try:
            await self._list_pods()
        except Exception:  # each resumed run is then stepped: reads afresh, as before
            _log.exception("listing the run pods failed; resumed runs are stepped one by one")
        else:
            self._listed = True
        finally:
            self._watched.listing_done()
        judged = 0
        while True:
            key = await self._queued.get()
            judged += 1
            if not self._listed or self._judge(key):
                task = asyncio.create_task(self._take_step(key))
                self._stepping.add(task)
                task.add_done_callback(self._stepping.discard)
            if judged % _JUDGED_PER_YIELD == 0:
                await asyncio.sleep(0)  # let the watches' events in between

    async def _take_step(self, key: RunKey) -> None:
        async with self._slots:  # each step holds its run's body and pods while it runs
            await self._step(key)

    async def _list_pods(self) -> None:
        for namespace in self._namespaces:
            token = ""
            while True:
                pods, token = await asyncio.to_thread(self._list_page, namespace, PAGE, token)
                self._watched.pods_listed(
                    ((_namespace_of(pod), _run_of(pod)), PodView.from_pod(pod))
                    for pod in pods
                    if self._watches(_namespace_of(pod))
                )
                del pods  # one page at a time
                if not token:
                    break


def _namespace_of(pod: JSON) -> str:
    return str((pod.get("metadata") or {}).get("namespace") or "default")


def _run_of(pod: JSON) -> str:
    return str(((pod.get("metadata") or {}).get("labels") or {}).get(RUN_LABEL) or "")
