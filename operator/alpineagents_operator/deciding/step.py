"""What one reconcile step sees, and the :class:`Decision` it builds.

A :class:`Step` holds the inputs of :func:`~.decide.decide` (the AgentRun, its pods split
into its own and an earlier AgentRun's, the saved State, the time, the admission verdict)
and the status changes and Events gathered so far; :meth:`Step.to` and
:meth:`Step.result` turn them into the Decision, adding what every step does (stopping
stray pods, giving up a place under the admission caps). The moves themselves live in
:mod:`.moves` and :mod:`.pod_losses`; which one is taken, in :mod:`.decide`'s table.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from alpineagents_operator.deciding.run_status import cost_text, status_patch, usage_status
from alpineagents_operator.kube.admission import NO_PLACE, Verdict
from alpineagents_operator.kube.daily_spend import spend_mark, utc_day
from alpineagents_operator.kube.views import (
    JSON,
    AgentRunView,
    Phase,
    PodView,
    RunEvent,
    SavedView,
    current_pod_name,
    is_standby_pod,
    pod_name_for,
)


@dataclass(frozen=True)
class Decision:
    """What one reconcile step does. An empty Decision means "nothing to do"."""

    status: Mapping[str, Any] = field(default_factory=dict)
    """JSON merge patch for ``.status`` (only changed fields; None deletes a field)."""
    create_pod: int | None = None
    """Attempt number of the pod to create (``<run>-<attempt>``)."""
    delete_pods: tuple[str, ...] = ()
    """Pods to delete gracefully (their SIGTERM handler saves the State)."""
    events: tuple[RunEvent, ...] = ()
    needs_saved: bool = False
    """Load the saved State and call :func:`~.decide.decide` again with it."""
    claim_state: bool = False
    """Fence the store (``store.claim``) before creating the pod, so a lost pod that is
    somehow still running can no longer write into the State its successor owns."""
    requeue_after: float | None = None
    """Look again after this many seconds even if no event comes (backoff, deadlines)."""
    lost_reason: str | None = None
    """Set when this step noticed the current pod lost and will replace it: why it was
    lost (starts the resume-latency clock)."""
    note: str = ""
    """One line for the operator's log: what this step does and why."""

    @property
    def acts(self) -> bool:
        """Whether the step changes anything (so the next step may decide differently)."""
        return bool(self.status or self.create_pod or self.delete_pods or self.events)


class Step:
    """One reconcile step's inputs and the changes it has gathered so far."""

    def __init__(
        self,
        run: AgentRunView,
        pods: Sequence[PodView],
        saved: SavedView | None,
        now: datetime,
        admission: Verdict | None = None,
    ) -> None:
        self.run = run
        self.saved = saved
        """The store's view of the run's State (None: not read)."""
        self.now = now
        self.admission = admission
        """Whether a run holding no place may take one (None: no caps in force)."""
        self.own = [p for p in pods if p.owner_uid == run.uid]
        self.foreign = [p for p in pods if p.owner_uid != run.uid]
        self.status = run.status
        """The run's status as this step sees it (adoption moves it on)."""
        self.changes: JSON = {}
        """The status fields this step changes so far."""
        self.events: list[RunEvent] = []
        """Events this step posts whatever move it ends with."""
        # Pods of an earlier AgentRun with the same name must not run alongside this one.
        self.stale = tuple(p.name for p in self.foreign if p.alive and not p.deleting)

    # ------------------------------------------------------------------ what is seen
    def current(self) -> PodView | None:
        """The run's current pod (see the table in :mod:`.decide`), if it exists."""
        name = current_pod_name(self.run.name, self.status)
        if name is None:
            return None
        # A standby handed this run carries its attempt as a label, as a run pod does.
        return next(
            (
                p
                for p in self.own
                if p.name == name and (p.attempt == self.status.attempt or not is_standby_pod(name))
            ),
            None,
        )

    def live_own(self) -> tuple[str, ...]:
        """The run's own pods still alive and not yet being deleted."""
        return tuple(p.name for p in self.own if p.alive and not p.deleting)

    def foreign_named(self, name: str) -> bool:
        """Whether a pod of an earlier AgentRun still holds the pod name ``name``."""
        return any(p.name == name for p in self.foreign)

    def adoptable(self) -> PodView | None:
        """The run's own newest pod, when its attempt is above status.attempt (a step
        created it and then failed to record it)."""
        numbered = [p for p in self.own if p.attempt is not None]
        newest = max(numbered, key=lambda p: p.attempt or 0, default=None)
        if newest is None or newest.attempt is None or newest.attempt <= self.status.attempt:
            return None
        if newest.name != pod_name_for(self.run.name, newest.attempt) and not is_standby_pod(
            newest.name
        ):
            return None
        return newest

    def adopt(self, pod: PodView) -> None:
        """Record ``pod`` as the current pod: its attempt, Pending."""
        assert pod.attempt is not None
        self.changes.update(
            {
                "phase": Phase.PENDING,
                "attempt": pod.attempt,
                "pod": pod.name,
                "nextAttemptAt": None,
                "pendingApprovals": None,
            }
        )
        self.status = replace(
            self.status,
            phase=Phase.PENDING,
            attempt=pod.attempt,
            pod=pod.name,
            next_attempt_at=None,
            pending_approvals=(),
        )

    def aborted_with(self, more: Iterable[str]) -> list[str]:
        """status.abortedCalls with ``more`` added (calls only ever join the history)."""
        return list(dict.fromkeys([*self.status.aborted_calls, *more]))

    def saved_facts(self) -> JSON:
        """The status fields the saved State says (turns, usage, cost, lastSavedSeq,
        abortedCalls); none when it was not read or could not be."""
        saved = self.saved
        if saved is None or not saved.exists or saved.error is not None:
            return {}
        facts: JSON = {
            "turns": saved.turns,
            "usage": usage_status(saved.usage),
            "costUSD": cost_text(saved.cost_usd),
        }
        if saved.last_saved_seq is not None:
            facts["lastSavedSeq"] = saved.last_saved_seq
        aborted = self.aborted_with(saved.aborted_calls)
        if aborted:
            facts["abortedCalls"] = aborted
        return facts

    def event_if_new(
        self, shown: object, kind: str, reason: str, message: str, new: object = None
    ) -> tuple[RunEvent, ...]:
        """One Event for ``reason``, unless the status already shows it (``shown``, the
        status field that would hold ``new``, or ``reason`` itself): a step taken again
        posts nothing twice."""
        return (
            () if shown == (reason if new is None else new) else (RunEvent(kind, reason, message),)
        )

    # ------------------------------------------------------------------ the Decision
    def to(
        self,
        changes: JSON,
        *,
        create: int | None = None,
        delete: tuple[str, ...] = (),
        claim: bool = False,
        events: tuple[RunEvent, ...] = (),
        requeue_after: float | None = None,
        lost_reason: str | None = None,
        note: str = "",
    ) -> Decision:
        """The Decision with ``changes`` added to the status this step writes."""
        self.changes.update(changes)
        return self.result(
            create=create,
            delete=delete,
            claim=claim,
            events=events,
            requeue_after=requeue_after,
            lost_reason=lost_reason,
            note=note,
        )

    def result(
        self,
        *,
        create: int | None = None,
        delete: tuple[str, ...] = (),
        claim: bool = False,
        events: tuple[RunEvent, ...] = (),
        requeue_after: float | None = None,
        lost_reason: str | None = None,
        note: str = "",
    ) -> Decision:
        """The Decision of what this step gathered: its status patch (only what changed),
        and the pods to stop (an earlier AgentRun's, older attempts', ``delete``)."""
        phase = self.changes.get("phase")
        if self.status.admitted and phase in NO_PLACE:
            self.changes["admitted"] = None  # its place goes to the next in line
        events = (*self.events, *events)
        patch = status_patch(self.run, self.changes, self.now)
        # The day's spend count begins with the day's first cost change (the spend cap's).
        mark = spend_mark(self.run.status.raw, patch, utc_day(self.now))
        if mark is not None:
            patch["dailySpend"] = mark
        deletes = tuple(dict.fromkeys((*self.stale, *self._older_live(), *delete)))
        return Decision(
            status=patch,
            create_pod=create,
            delete_pods=deletes,
            events=events if (patch or create or deletes or events) else (),
            claim_state=claim,
            requeue_after=requeue_after,
            lost_reason=lost_reason,
            note=note,
        )

    def _older_live(self) -> tuple[str, ...]:
        # An older attempt still running would be a second writer: stop it.
        current = current_pod_name(self.run.name, self.status)
        return tuple(
            p.name
            for p in self.own
            if p.alive
            and not p.deleting
            and p.name != current
            and (p.attempt or 0) < self.status.attempt
        )
