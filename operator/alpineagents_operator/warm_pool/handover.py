"""Handing a replacement pod's run to a warm pool standby: the reconciler's part.

:func:`pick_standby` says whether a decision's pod may be a standby (a replacement,
attempt 2 on, of a run whose pod would be the pool's) and finds a waiting one;
:func:`hand_over` does what creating the pod would do (claim the State, mint the pod's
credentials, both at once), then hands the run to the standby
(:meth:`~.standby_pool.StandbyPool.hand`). Its answer says what the reconciler does next.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from alpineagents_operator.credentials.credential_issuer import RunCredentialIssuer
from alpineagents_operator.deciding.decide import Decision
from alpineagents_operator.kube.cluster import failure_text
from alpineagents_operator.kube.config import OperatorConfig
from alpineagents_operator.kube.views import AgentRunView, PodView, Refusal, pod_name_for
from alpineagents_operator.warm_pool.standby_pool import StandbyPool, StandbyView, pool_misfit

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Handed:
    """The standby runs the attempt: ``decision`` as carried out (``status.pod`` names it)."""

    decision: Decision


@dataclass(frozen=True)
class Redo:
    """The State changed before the claim (a lost pod saved its answer, a stop): carry out
    ``decision`` instead, without claiming again."""

    decision: Decision


@dataclass(frozen=True)
class NotHanded:
    """``refusal``: why the pod cannot start yet (the claim or the credentials failed);
    None: the standby went before it was handed the run: start a pod of its own."""

    refusal: Refusal | None


async def pick_standby(
    pool: StandbyPool, run: AgentRunView, decision: Decision, config: OperatorConfig
) -> StandbyView | None:
    """A waiting standby for the decision's pod, or None (a pod of its own, as without a
    pool: no pool, a first attempt, a pod unlike the pool's, none ready, none readable)."""
    attempt = decision.create_pod
    if not pool.enabled or attempt is None or attempt < 2 or pool_misfit(run, config) is not None:
        return None
    try:
        return await pool.pick(run.namespace)
    except Exception as error:  # any failure: a pod of its own, as without a pool
        _log.warning("%s/%s: warm pool not read: %s", run.namespace, run.name, failure_text(error))
        return None


async def hand_over(
    run: AgentRunView,
    decision: Decision,
    standby: StandbyView,
    *,
    pool: StandbyPool,
    credentials: RunCredentialIssuer,
    fence: Callable[[], Awaitable[str | None]],
    after_claim: Callable[[], Awaitable[Decision | None]] | None,
    claim_counted: Callable[[Decision, str | None], Refusal | None],
) -> Handed | Redo | NotHanded:
    """Claim the State (``fence``) and mint the pod's credentials, then hand the run to
    ``standby``. ``after_claim`` decides again from the State as claimed (None: the
    decision needs no claim); ``claim_counted`` turns the claim's failure into the run's
    refusal, counted for the backoff as for a pod of its own (None: claimed). A standby
    not handed the run is released to the pool (:meth:`~.standby_pool.StandbyPool.pick`)."""
    handed: Handed | Redo | NotHanded | None = None
    try:
        handed = await _hand_over(
            run,
            decision,
            standby,
            pool=pool,
            credentials=credentials,
            fence=fence,
            after_claim=after_claim,
            claim_counted=claim_counted,
        )
        return handed
    finally:
        if not isinstance(handed, Handed):  # picked for nothing: another resume may pick it
            pool.release(run.namespace, standby)


async def _hand_over(
    run: AgentRunView,
    decision: Decision,
    standby: StandbyView,
    *,
    pool: StandbyPool,
    credentials: RunCredentialIssuer,
    fence: Callable[[], Awaitable[str | None]],
    after_claim: Callable[[], Awaitable[Decision | None]] | None,
    claim_counted: Callable[[Decision, str | None], Refusal | None],
) -> Handed | Redo | NotHanded:
    attempt = decision.create_pod
    assert attempt is not None
    pod = PodView(name=standby.name, uid=standby.uid)

    async def claimed() -> str | None:
        return await fence() if decision.claim_state else None

    fenced, minted = await asyncio.gather(claimed(), credentials.for_standby(run, attempt, pod))
    if decision.claim_state and fenced is None and after_claim is not None:
        again = await after_claim()
        if again is not None and again.create_pod != decision.create_pod:
            return Redo(again)
        decision = again or decision
    failed_claim = claim_counted(decision, fenced)
    if failed_claim is not None:
        return NotHanded(failed_claim)
    if isinstance(minted, str):
        return NotHanded(Refusal("CredentialsUnavailable", minted, final=False))
    if not await pool.hand(run, attempt, standby, minted):
        return NotHanded(None)
    own_name = pod_name_for(run.name, attempt)
    in_standby = f"{standby.name} (a warm pool standby)"
    return Handed(
        replace(
            decision,
            status={**decision.status, "pod": standby.name},
            events=tuple(
                replace(e, message=e.message.replace(f"pod {own_name}", f"pod {in_standby}"))
                for e in decision.events
            ),
            note=f"handed attempt {attempt} to standby {standby.name}",
        )
    )
