"""Gives each run pod its own store credentials, and keeps them fresh while it runs.

The :class:`~alpineagents_operator.reconciling.reconciler.Reconciler` calls :meth:`before_pod` right
before it creates a pod (each attempt gets new credentials, so a resumed run never reuses
its predecessor's, and the predecessor's are revoked where the store can: see
:mod:`.run_credentials`) and :meth:`renew_if_due` on each step of a run whose pod is alive.
What it keeps in memory (when each run's credentials are due for renewal) only saves STS
calls: after an operator restart every running pod simply gets new credentials at once.

In ``shared`` mode it mints nothing; the first run pod with an ``s3://`` store brings a
Warning Event saying that runs share the store's key.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from functools import partial

from alpineagents import Store
from alpineagents.errors import StoreError
from alpineagents_operator.credentials import saved_state
from alpineagents_operator.credentials.run_credentials import (
    CredentialsRefused,
    CredentialsUnavailable,
    RunCredentials,
    StsAccess,
    credentials_secret,
    mint_run_credentials,
    renew_at,
    revoke_attempt_credentials,
    standby_credentials_secret,
)
from alpineagents_operator.credentials.store_policy import StoreNotAllowed, store_refusal
from alpineagents_operator.kube.cluster import Cluster, SecretConflict
from alpineagents_operator.kube.config import OperatorConfig
from alpineagents_operator.kube.pods import store_url, uses_run_credentials
from alpineagents_operator.kube.views import (
    JSON,
    TERMINAL_PHASES,
    AgentRunView,
    PodView,
    RunEvent,
    is_standby_pod,
    pod_name_for,
)

_log = logging.getLogger(__name__)
RETRY_SECONDS = 30.0
"""How soon a failed renewal is tried again (the pod's credentials are still valid)."""
MIN_RENEW_SECONDS = 60.0
SHARED_WARNING = (
    "store credentials are shared (ALPINEAGENTS_RUN_CREDENTIALS=shared): every run pod "
    "holds the store's key and can read, change or delete every run's saved history. "
    "Use a store with STS (AssumeRole) and the default per-run credentials to confine "
    "each run to its own States"
)

RunKey = tuple[str, str]


def _utc_now() -> datetime:
    return datetime.now(UTC)


class RunCredentialIssuer:
    """Mints a run's credentials into its Secret (see :mod:`.run_credentials`)."""

    def __init__(
        self,
        config: OperatorConfig,
        cluster: Cluster,
        *,
        env: Mapping[str, str] | None = None,
        clock: Callable[[], datetime] = _utc_now,
        open_store: Callable[[str], Store] | None = None,
    ) -> None:
        self.config = config
        self.cluster = cluster
        self.lifetime = timedelta(seconds=config.run_credentials_seconds)
        self._env = os.environ if env is None else env
        self._clock = clock
        self._access: dict[str, StsAccess] = {}
        self._renew_at: dict[RunKey, datetime] = {}
        self._failing: set[RunKey] = set()
        self._warned_shared = False
        self._open_store = open_store
        self._prepared: set[str] = set()

    async def before_pod(self, run: AgentRunView, body: JSON, attempt: int) -> str | None:
        """Put fresh credentials in the run's Secret for pod ``attempt``, about to start,
        and revoke those of the pod it replaces.

        Returns None when the pod may start, else why it may not yet (the STS refused or
        did not answer, the Secret's name is taken): the caller tries again later.
        """
        if not uses_run_credentials(run, self.config):
            shares_key = not self.config.per_run_credentials and store_url(
                run, self.config
            ).lower().startswith("s3://")
            if shares_key and not self._warned_shared:
                self._warned_shared = True
                event = RunEvent("Warning", "SharedStoreCredentials", SHARED_WARNING)
                await asyncio.to_thread(self.cluster.post_event, body, event)
            return None
        problem, _ = await asyncio.gather(
            self._issue(run, attempt), self._revoke_replaced(run, attempt)
        )
        if problem is None:
            return None
        hint = ""
        if isinstance(problem, CredentialsRefused) and problem.status in (400, 404, 501, 503):
            hint = (
                "; if this store has no STS (AssumeRole), set ALPINEAGENTS_RUN_CREDENTIALS="
                "shared (chart: store.runCredentials=shared), and runs share one key"
            )
        return f"could not mint the pod's own store credentials: {problem}{hint}"

    async def for_standby(
        self, run: AgentRunView, attempt: int, standby: PodView
    ) -> RunCredentials | str | None:
        """The credentials for pod ``attempt`` of ``run`` when a warm pool's ``standby``
        pod is to run it: minted as :meth:`before_pod` mints them and returned for the
        assignment; their renewals go to the standby's own Secret (it mounts no other).
        None when runs share the store's key; a text when they could not
        be minted (the caller starts no pod yet).

        Its Secret keeps the standby's own credentials until the first renewal: the
        standby reads its assignment with them, and a kubelet that updated the files
        before that read would lock it out of its folder."""
        if not uses_run_credentials(run, self.config):
            return None
        issued, _ = await asyncio.gather(
            self._mint(run, attempt, standby, to_secret=False), self._revoke_replaced(run, attempt)
        )
        if isinstance(issued, Exception):
            return f"could not mint the pod's own store credentials: {issued}"
        return issued

    async def renew_if_due(self, run: AgentRunView, pods: Sequence[PodView]) -> float | None:
        """Renew the credentials of a run whose current pod is alive, when they are due.

        Returns the seconds until they are due next (for a requeue), or None when the run
        has no live pod with credentials of its own.
        """
        key = (run.namespace, run.name)
        if run.status.phase in TERMINAL_PHASES:
            self._forget(key)
            return None
        if not self._renews(run, pods):
            return None
        now = self._clock()
        due = self._renew_at.get(key)
        if due is not None and due > now:
            return (due - now).total_seconds()
        current = next((p for p in pods if p.name == run.current_pod), None)
        standby = current if current is not None and is_standby_pod(current.name) else None
        problem = await self._issue(run, run.status.attempt, standby)
        if problem is not None:
            if key not in self._failing:
                self._failing.add(key)
                _log.warning("%s/%s: could not renew store credentials: %s", *key, problem)
            return RETRY_SECONDS
        self._failing.discard(key)
        _log.info("%s/%s: renewed the pod's store credentials", *key)
        # At least a minute, even if the store's clock makes them due at once: no loop.
        return max(MIN_RENEW_SECONDS, (self._renew_at[key] - now).total_seconds())

    def renewal_due(self, run: AgentRunView, pods: Sequence[PodView]) -> bool:
        """Whether :meth:`renew_if_due` would mint credentials now (asks nothing of the
        store or the API server): after a restart, every run with a live pod of its own."""
        if run.status.phase in TERMINAL_PHASES or not self._renews(run, pods):
            return False
        due = self._renew_at.get((run.namespace, run.name))
        return due is None or due <= self._clock()

    def _renews(self, run: AgentRunView, pods: Sequence[PodView]) -> bool:
        """The run's current pod is alive and holds credentials of its own."""
        if not uses_run_credentials(run, self.config) or run.status.attempt < 1:
            return False
        current = run.current_pod
        return any(p.name == current and p.alive and not p.deleting for p in pods)

    def _forget(self, key: RunKey) -> None:
        self._renew_at.pop(key, None)
        self._failing.discard(key)

    async def _revoke_replaced(self, run: AgentRunView, attempt: int) -> None:
        """Revoke the credentials of the pod that pod ``attempt`` replaces, if any: beside
        the new pod's minting, not after it (one STS round trip less before a resume;
        the replaced pod's State is claimed away from it anyway)."""
        if attempt > 1:
            await self._revoke(run, attempt - 1)

    async def _revoke(self, run: AgentRunView, attempt: int) -> None:
        """Revoke the credentials of the run's pod ``attempt`` (replaced). A store that
        refuses leaves them valid until they expire: logged, the new pod starts anyway."""
        try:
            access = self._access_for(store_url(run, self.config))
            await asyncio.to_thread(revoke_attempt_credentials, access, run.state_id, attempt)
        except (ValueError, CredentialsRefused, CredentialsUnavailable) as error:
            _log.warning(
                "%s/%s: could not revoke the store credentials of replaced pod %s: %s",
                run.namespace,
                run.name,
                pod_name_for(run.name, attempt),
                error,
            )

    async def _issue(
        self, run: AgentRunView, attempt: int, standby: PodView | None = None
    ) -> Exception | None:
        issued = await self._mint(run, attempt, standby)
        return issued if isinstance(issued, Exception) else None

    async def _mint(
        self, run: AgentRunView, attempt: int, standby: PodView | None, *, to_secret: bool = True
    ) -> RunCredentials | Exception:
        """Mint pod ``attempt``'s credentials into the run's Secret, or into the Secret
        of the ``standby`` pod that runs it (which that pod mounts); nowhere when not
        ``to_secret``."""
        url = store_url(run, self.config)
        try:
            access = self._access_for(url)  # first: it refuses a store out of bounds
            if url not in self._prepared and self._open_store is not None:
                # The pod's credentials cannot create the bucket: the operator's key can.
                await asyncio.to_thread(saved_state.prepare, self._open_store(url))
                self._prepared.add(url)
            credentials = await asyncio.to_thread(
                partial(mint_run_credentials, attempt=attempt),
                access,
                run.state_id,
                self.lifetime,
            )
            if to_secret and standby is not None:
                await asyncio.to_thread(
                    self.cluster.apply_secret,
                    standby_credentials_secret(
                        run.namespace, standby.name, standby.uid, credentials
                    ),
                    probably_exists=True,
                )
            elif to_secret:
                # A run that had a pod has its credentials Secret already: patch it first.
                await asyncio.to_thread(
                    self.cluster.apply_secret,
                    credentials_secret(run, credentials),
                    probably_exists=run.status.attempt >= 1,
                )
        except (
            ValueError,
            CredentialsRefused,
            CredentialsUnavailable,
            SecretConflict,
            StoreError,
            ConnectionError,
        ) as error:
            return error
        self._renew_at[(run.namespace, run.name)] = renew_at(credentials.expires_at, self.lifetime)
        return credentials

    def _access_for(self, url: str) -> StsAccess:
        access = self._access.get(url)
        if access is None:
            problem = store_refusal(url, self.config, self._env)
            if problem is not None:
                # Never mint with the broad key for a store the operator does not use.
                raise StoreNotAllowed(problem)
            access = StsAccess.for_store(url, self._env, self.config.sts_role_arn)
            self._access[url] = access
        return access
