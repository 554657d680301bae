"""The warm pool (chart ``runs.warmPool: N``): standby runner pods that take a lost run.

A standby is a run pod for no run yet (:func:`~.pods.standby_manifest`): started, its
runtime imported, it waits for an assignment in its own folder of the store
(:mod:`alpineagents.runner.standby`). When a run that lost its pod resumes and its pod
would be the pool's (:func:`pool_misfit` says None), the reconciler claims the State as
before any replacement, then hands the run to a waiting standby (:meth:`StandbyPool.hand`):
the assignment goes to the store, the pod gets the run's labels and the AgentRun as its
owner, and ``status.pod`` names it. A new standby starts behind it (:meth:`StandbyPool.keep`).
The hand-over also leaves a mark in the standby's folder until the relabelled standby
has taken its assignment: an operator started later never hands a standby that still
looks waiting but was handed a run (its predecessor stopped before the relabelling).

:meth:`StandbyPool.keep` keeps N waiting standbys per namespace: it starts missing ones
(each with credentials that reach its own folder only, renewed while it waits) and
removes dead or surplus ones with their Secret, their folder and their credentials
(revoked). Waiting standbys are owned by the installation's RBAC object (the chart's
operator Role or ClusterRole, ``config.warm_pool_owner``), so ``helm uninstall`` takes
them too; a standby handed a run is owned by the run instead. With N = 0 it removes every waiting standby once and then asks nothing more
of the API server. :func:`pool_moves` and :func:`pool_misfit` are the plain decisions,
tested without Kubernetes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from alpineagents.pod_contract import (
    STANDBY_LABEL,
    Assignment,
    mcp_secret_refs,
    provider_secret_refs,
)
from alpineagents.store import redact
from alpineagents.store.s3.standby_boxes import StandbyBoxes
from alpineagents_operator.credentials.run_credentials import (
    RunCredentials,
    StsAccess,
    mint_standby_credentials,
    renew_at,
    revoke_standby_credentials,
    standby_credentials_secret,
)
from alpineagents_operator.kube.cluster import Cluster, failure_text
from alpineagents_operator.kube.config import OperatorConfig
from alpineagents_operator.kube.pods import (
    owner_reference,
    per_run_credentials_for,
    run_labels,
    standby_credentials_secret_name,
    standby_manifest,
    store_url,
)
from alpineagents_operator.kube.views import (
    ATTEMPT_LABEL,
    CONTAINER_NAME,
    JSON,
    STANDBY_POD_PREFIX,
    STATE_ANNOTATION,
    AgentRunView,
)

_log = logging.getLogger(__name__)

REFILL_QUIET_SECONDS = 1.0
"""A pool refills once its namespace has seen no hand-over for this long. Each new
standby is a pod to start and a runtime to import: started during a burst of resumes (a
drain), they took the CPUs from the runs they stand behind. On the bench's 2-CPU node,
30 graceful stops at once with a pool of 30: the operator's part p50 11.3 s with the
refill during the burst, 6.8 s after it (``benchmarks/results/warm_pool_burst.md``)."""
REFILL_WAIT_SECONDS = 10.0
"""...and at the latest this long after the first hand-over it waits behind."""

LISTING_SHARED_SECONDS = 1.0
"""Hand-overs that begin within this long of a listing of the standbys pick from it."""

_POD_FIELDS = ("env", "envFrom", "resources", "serviceAccountName", "nodeSelector")
_MORE_POD_FIELDS = ("tolerations", "affinity")


@dataclass(frozen=True)
class StandbyView:
    """One pod of the pool, as far as keeping the pool cares."""

    name: str
    uid: str
    waiting: bool
    """Still the pool's (not handed a run)."""
    ready: bool
    """Its runner runs (so it waits on the store, or is about to)."""
    gone: bool
    """Finished, or being deleted: of no more use."""

    @classmethod
    def from_pod(cls, pod: Mapping[str, Any]) -> StandbyView:
        meta = pod.get("metadata") or {}
        status = pod.get("status") or {}
        statuses = status.get("containerStatuses") or []
        state = next(
            (s.get("state") or {} for s in statuses if s.get("name") == CONTAINER_NAME), {}
        )
        finished = status.get("phase") in ("Succeeded", "Failed") or "terminated" in state
        deleting = bool(meta.get("deletionTimestamp"))
        return cls(
            name=str(meta.get("name")),
            uid=str(meta.get("uid") or ""),
            waiting=(meta.get("labels") or {}).get(STANDBY_LABEL) == "true",
            ready="running" in state and not deleting,
            gone=finished or deleting,
        )


@dataclass(frozen=True)
class PoolMoves:
    """What keeping one namespace's pool does: standbys to start and to remove."""

    start: int
    remove: tuple[StandbyView, ...]


def pool_moves(standbys: Sequence[StandbyView], size: int) -> PoolMoves:
    """Start and remove what it takes to have ``size`` waiting standbys: dead ones go
    (and are replaced), the newest surplus ones go. Standbys handed a run are runs'
    pods now: not the pool's business."""
    waiting = [s for s in standbys if s.waiting]
    dead = tuple(s for s in waiting if s.gone)
    alive = [s for s in waiting if not s.gone]
    surplus = tuple(alive[size:]) if len(alive) > size else ()
    return PoolMoves(start=max(0, size - len(alive)), remove=dead + surplus)


def pool_misfit(run: AgentRunView, config: OperatorConfig) -> str | None:
    """Why ``run``'s pod would not be the pool's (None: a standby can run it)."""
    if config.warm_pool < 1:
        return "no warm pool (runs.warmPool is 0)"
    if not config.store.lower().startswith("s3://"):
        return "the warm pool needs an s3:// store"
    spec = run.spec
    for field in (*_POD_FIELDS, *_MORE_POD_FIELDS):
        if spec.get(field):
            return f"spec.{field} makes its pod differ from the pool's"
    if spec.get("image") and spec["image"] != config.image:
        return "spec.image is not the pool's image"
    if store_url(run, config) != config.store:
        return "spec.store is not the pool's store"
    if mcp_secret_refs(spec):
        return "its MCP servers' values from Secrets go in its own pod"
    if provider_secret_refs(spec):
        return "its model provider's values from Secrets go in its own pod"
    return None


class StandbyPool:
    """Keeps the standbys of each namespace, and hands them runs."""

    def __init__(
        self,
        config: OperatorConfig,
        cluster: Cluster,
        *,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.config = config
        self.cluster = cluster
        self.size = config.warm_pool
        self._env = dict(os.environ if env is None else env)
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self._refilling: set[str] = set()
        self._listings: dict[str, tuple[float, asyncio.Future[list[StandbyView]]]] = {}
        self._refill_after: dict[str, float] = {}
        self._emptied: set[str] = set()
        self._renew_at: dict[str, datetime] = {}
        # Standbys picked for a hand-over, per namespace: concurrent resumes each take
        # another one.
        self._picked: dict[str, set[str]] = {}
        # Standbys an earlier operator handed a run (listed once, before this one hands
        # any): one that still looks waiting was never relabelled, as its operator
        # stopped between the assignment and the labels. It runs that run until the
        # run's next claim fences it; it must never be handed another.
        self._handed_earlier: asyncio.Future[set[str]] | None = None
        # Standbys relabelled after their hand-over whose mark is still in the store.
        self._to_unmark: set[str] = set()
        self._boxes: StandbyBoxes | None = None
        self._owners: dict[str, JSON] = {}
        self._access: StsAccess | None = None
        self.per_run = per_run_credentials_for(config.store, config)

    @property
    def enabled(self) -> bool:
        return self.size > 0 and self.config.store.lower().startswith("s3://")

    async def pick(self, namespace: str) -> StandbyView | None:
        """A waiting standby whose runner runs and that no other hand-over has picked
        (None: none is). It stays picked: the caller hands it a run or :meth:`releases
        <release>` it."""
        if not self.enabled:
            return None
        handed_earlier = await self._handed_before_us()
        views = await self._recent_standbys(namespace)
        # Between the listing and here nothing awaits: two picks never choose the same one.
        # Without this, a burst of resumes all chose the first standby; one relabel won
        # and the rest fell back to pods of their own, after writing over its assignment.
        picked = self._picked.setdefault(namespace, set())
        standby = next(
            (
                s
                for s in views
                if s.waiting and s.ready and s.uid not in picked and s.uid not in handed_earlier
            ),
            None,
        )
        if standby is not None:
            picked.add(standby.uid)
        return standby

    async def _recent_standbys(self, namespace: str) -> list[StandbyView]:
        """``namespace``'s standbys, from a listing begun at most
        :data:`LISTING_SHARED_SECONDS` ago: a burst of resumes lists them once, not once
        each (30 listings of 60 pods at once cost the operator seconds of its CPU share).
        A standby gone since is found out by :meth:`hand`."""
        clock = asyncio.get_running_loop().time
        shared = self._listings.get(namespace)
        if shared is None or clock() - shared[0] > LISTING_SHARED_SECONDS:
            shared = (clock(), asyncio.ensure_future(asyncio.to_thread(self._views, namespace)))
            self._listings[namespace] = shared
        try:
            return await asyncio.shield(shared[1])
        except Exception:
            if self._listings.get(namespace) is shared:  # failed: the next pick lists again
                del self._listings[namespace]
            raise

    def _views(self, namespace: str) -> list[StandbyView]:
        return [StandbyView.from_pod(p) for p in self.cluster.list_standbys(namespace)]

    def release(self, namespace: str, standby: StandbyView) -> None:
        """``standby`` was picked but not handed a run: another hand-over may pick it."""
        self._picked.get(namespace, set()).discard(standby.uid)

    async def hand(
        self,
        run: AgentRunView,
        attempt: int,
        standby: StandbyView,
        credentials: RunCredentials | None,
    ) -> bool:
        """Hand pod ``attempt`` of ``run`` to ``standby``: the assignment, then the pod's
        labels and owner. False when the standby is no longer waiting (gone, or taken):
        its folder is cleared and the caller starts a pod of its own.

        The assignment goes first: should the operator stop between the two, the
        standby runs a run the status does not name, and the next step's claim fences
        it off (its next save fails, it ends, the pool replaces it)."""
        assignment = Assignment(
            namespace=run.namespace,
            run=run.name,
            spec=run.spec,
            state_id=run.state_id,
            attempt=attempt,
            store=store_url(run, self.config),
            credentials=credentials.secret_data() if credentials is not None else None,
        )
        # Not under the pool's lock: a resume does not wait for a standby starting. A
        # standby removed meanwhile is handed a run anyway only if it is still labelled
        # waiting, i.e. terminating: the run then loses that pod and resumes again.
        boxes = self._boxes_of_store()
        await asyncio.to_thread(boxes.put, standby.uid, assignment)
        labels = {**run_labels(run.name), ATTEMPT_LABEL: str(attempt)}
        handed = await asyncio.to_thread(
            self.cluster.hand_standby,
            run.namespace,
            standby.name,
            labels,
            owner_reference(run),
            {STATE_ANNOTATION: run.state_id},
        )
        if handed:
            self._to_unmark.add(standby.uid)  # by the keep that follows a hand-over
        else:
            await asyncio.to_thread(boxes.clear, standby.uid)
        return handed

    async def keep_namespaces(self, run_namespaces: set[str]) -> None:
        """Keep the pool of each namespace the operator names (of each where runs are,
        when it watches patterns or the whole cluster); one failing stops no other."""
        for namespace in sorted(set(self.config.named_namespaces) or run_namespaces):
            try:
                await self.keep(namespace)
            except Exception as error:  # any failure: tried again at the next resync
                _log.warning("%s: warm pool not kept: %s", namespace, failure_text(error))

    def close(self) -> None:
        """Stop what :meth:`keep_soon` started."""
        for task in self._tasks:
            task.cancel()

    def keep_soon(self, namespace: str) -> None:
        """:meth:`keep` beside the caller (a standby was handed a run, or went), once
        ``namespace``'s pool has had no such news for :data:`REFILL_QUIET_SECONDS`, and
        at most :data:`REFILL_WAIT_SECONDS` after the first: a burst of hand-overs is
        one refill, after the burst rather than during it."""
        self._refill_after[namespace] = asyncio.get_running_loop().time() + REFILL_QUIET_SECONDS
        if namespace in self._refilling:
            return
        self._refilling.add(namespace)
        task = asyncio.create_task(self._refill(namespace))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _refill(self, namespace: str) -> None:
        clock = asyncio.get_running_loop()
        latest = clock.time() + REFILL_WAIT_SECONDS
        try:
            while (wait := min(self._refill_after[namespace], latest) - clock.time()) > 0:
                await asyncio.sleep(wait)
        finally:
            self._refilling.discard(namespace)
        await self._keep_logged(namespace)

    async def _keep_logged(self, namespace: str) -> None:
        try:
            await self.keep(namespace)
        except Exception as error:  # any failure: the next resync keeps it
            _log.warning("%s: warm pool not kept: %s", namespace, failure_text(error))

    async def keep(self, namespace: str) -> None:
        """Bring ``namespace``'s pool to its size (see the module docstring)."""
        if self.size == 0 and namespace in self._emptied:
            return
        if not self.config.store.lower().startswith("s3://"):
            if self.size > 0 and namespace not in self._emptied:
                _log.warning(
                    "%s: no warm pool: it needs an s3:// store, not %s",
                    namespace,
                    redact(self.config.store),
                )
            self._emptied.add(namespace)
            return
        async with self._lock:
            picked_before = set(self._picked.get(namespace, ()))
            pods = await asyncio.to_thread(self.cluster.list_standbys, namespace)
            views = [StandbyView.from_pod(p) for p in pods]
            # A handed standby stays listed (labelled taken) while it runs its run: it
            # stays picked, so a pick whose listing predates its hand-over skips it. Only
            # pods picked before this listing and absent from it are gone for good.
            gone = picked_before - {s.uid for s in views}
            if gone:
                self._picked[namespace] -= gone
            handed_earlier = await self._handed_before_us()
            stale = [
                s
                for s in views
                if s.waiting
                and s.uid in handed_earlier
                and s.uid not in self._picked.get(namespace, ())
            ]
            for standby in stale:  # ends the run it runs sooner than the run's next claim
                _log.warning(
                    "%s: standby %s was handed a run but not relabelled: removed",
                    namespace,
                    standby.name,
                )
                await self._remove(namespace, standby)
            views = [s for s in views if s not in stale]
            moves = pool_moves(views, self.size)
            for standby in moves.remove:
                await self._remove(namespace, standby)
            for _ in range(moves.start):
                await self._start(namespace)
            removed = {s.uid for s in moves.remove}
            for standby in views:
                if standby.waiting and not standby.gone and standby.uid not in removed:
                    await self._renew_if_due(namespace, standby)
                elif not standby.waiting and (
                    standby.uid in self._renew_at
                    or standby.uid in self._to_unmark
                    or standby.uid in handed_earlier
                ):
                    await self._finish_hand_over(namespace, standby, handed_earlier)
            if self.size == 0:
                self._emptied.add(namespace)

    async def _handed_before_us(self) -> set[str]:
        """The standbys of this store handed a run before this operator handed any (the
        first caller lists them; the others wait for that listing)."""
        if self._handed_earlier is None:
            self._handed_earlier = asyncio.ensure_future(
                asyncio.to_thread(self._boxes_of_store().handed)
            )
        listing = self._handed_earlier
        try:
            return await asyncio.shield(listing)
        except Exception:
            if self._handed_earlier is listing:  # not read: the next caller tries again
                self._handed_earlier = None
            raise

    async def _start(self, namespace: str) -> None:
        name = STANDBY_POD_PREFIX + secrets.token_hex(5)
        manifest = standby_manifest(namespace, name, self.config)
        owner = await self._owner(namespace)
        if owner is not None:
            manifest["metadata"]["ownerReferences"] = [owner]
        try:
            created = await asyncio.to_thread(self.cluster.create_standby, manifest)
        except Exception as error:  # any failure: the next keep tries again
            _log.warning("%s: could not start standby %s: %s", namespace, name, failure_text(error))
            return
        standby = StandbyView.from_pod(created)
        if not await self._renew_if_due(namespace, standby):
            await self._remove(namespace, standby)  # no credentials: of no use
            return
        _log.info("%s: started standby %s", namespace, name)

    async def _owner(self, namespace: str) -> JSON | None:
        """The owner of ``namespace``'s waiting standbys (None: none is set, or it cannot
        be read: the standby starts anyway, and ``helm uninstall`` would leave it)."""
        if self.config.warm_pool_owner is None:
            return None
        kind, name = self.config.warm_pool_owner
        key = namespace if kind == "Role" else ""
        if key not in self._owners:
            try:
                self._owners[key] = await asyncio.to_thread(
                    self.cluster.rbac_owner, namespace, kind, name
                )
            except Exception as error:  # any failure: an owner-less standby, tried again
                _log.warning(
                    "%s: standbys started without their owner %s/%s: %s",
                    namespace,
                    kind,
                    name,
                    failure_text(error),
                )
                return None
        return self._owners[key]

    async def _renew_if_due(self, namespace: str, standby: StandbyView) -> bool:
        """Mint the standby's own credentials into its Secret when they are due (at
        start, and with half their lifetime left). False when they could not be."""
        if not self.per_run:
            return True
        now = datetime.now(UTC)
        due = self._renew_at.get(standby.uid)
        if due is not None and due > now:
            return True
        lifetime = timedelta(seconds=self.config.run_credentials_seconds)
        try:
            access = self._sts_access()
            credentials = await asyncio.to_thread(
                mint_standby_credentials, access, standby.uid, lifetime
            )
            await asyncio.to_thread(
                self.cluster.apply_secret,
                standby_credentials_secret(namespace, standby.name, standby.uid, credentials),
                probably_exists=due is not None,
            )
        except Exception as error:  # any failure: logged; the pod waits for its Secret
            _log.warning(
                "%s: no store credentials for standby %s: %s",
                namespace,
                standby.name,
                failure_text(error),
            )
            return False
        self._renew_at[standby.uid] = renew_at(credentials.expires_at, lifetime)
        return True

    async def _finish_hand_over(
        self, namespace: str, standby: StandbyView, handed_earlier: set[str]
    ) -> None:
        """Once a standby relabelled to its run has taken its assignment: revoke its own
        credentials (it read the assignment with them; the run's are in it) and remove
        the hand-over's mark. Until then, or when the store refuses, a later keep tries
        again, in this operator or, by the mark, in one started later."""
        boxes = self._boxes_of_store()
        try:
            if await asyncio.to_thread(boxes.holds, standby.uid):
                return
            if self.per_run:
                await asyncio.to_thread(revoke_standby_credentials, self._sts_access(), standby.uid)
            await asyncio.to_thread(boxes.unmark, standby.uid)
        except Exception as error:  # any failure: the next keep tries again
            _log.warning(
                "%s: standby %s: own credentials not revoked yet: %s",
                namespace,
                standby.name,
                failure_text(error),
            )
            return
        self._renew_at.pop(standby.uid, None)
        self._to_unmark.discard(standby.uid)
        handed_earlier.discard(standby.uid)

    async def _remove(self, namespace: str, standby: StandbyView) -> None:
        """Delete a standby with all it had: its pod, its Secret (the pod owns it, but a
        cluster without garbage collection would keep it), its folder, its credentials."""
        self._renew_at.pop(standby.uid, None)
        steps: list[tuple[str, Any, tuple[Any, ...]]] = [
            ("pod", self.cluster.delete_pod, (namespace, standby.name)),
            (
                "Secret",
                self.cluster.delete_secret,
                (namespace, standby_credentials_secret_name(standby.name)),
            ),
        ]
        if standby.uid:
            steps.append(("folder", self._boxes_of_store().clear, (standby.uid,)))
            if self.per_run:
                steps.append(
                    ("credentials", revoke_standby_credentials, (self._sts_access(), standby.uid))
                )
        for what, call, args in steps:
            try:
                await asyncio.to_thread(call, *args)
            except Exception as error:  # any failure: the rest is removed anyway
                _log.warning(
                    "%s: standby %s: could not remove its %s: %s",
                    namespace,
                    standby.name,
                    what,
                    failure_text(error),
                )
        _log.info("%s: removed standby %s", namespace, standby.name)

    def _boxes_of_store(self) -> StandbyBoxes:
        if self._boxes is None:
            self._boxes = StandbyBoxes.open(self.config.store, self._env)
        return self._boxes

    def _sts_access(self) -> StsAccess:
        if self._access is None:
            self._access = StsAccess.for_store(
                self.config.store, self._env, self.config.sts_role_arn
            )
        return self._access
