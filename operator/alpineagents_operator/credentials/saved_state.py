"""What the operator reads from (and does to) a run's saved State.

The operator opens the same store the pods write to (``alpineagents.open_store``
with the operator's own credentials) for three things: to learn where a lost run
stopped before replacing its pod (:func:`read_saved`), to fence the lost pod's writes
before its successor starts (:func:`claim`), and to delete the State when an AgentRun
with ``onDelete: Delete`` goes (:func:`delete_state`). These calls block; the operator
runs them on worker threads.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from alpineagents import Record, State, Store
from alpineagents_operator.kube.views import PendingApproval, SavedView

_log = logging.getLogger(__name__)


def saved_view(state_id: str, record: Record | None) -> SavedView:
    """The :class:`SavedView` of a record as ``store.read`` returns it (None: no State).

    Loading closes a turn a killed pod left open by appending entries (its tool calls
    end "aborted", result unknown); ``aborted_calls`` lists every aborted call so far.
    """
    if record is None:
        return SavedView(exists=False)
    try:
        state = State.from_record(state_id, record)
    except (ValueError, LookupError) as error:
        return SavedView(exists=True, error=str(error))
    saved_count = state.loaded_entries
    # Every call that ended "aborted": closed by the pod that was stopped (SIGTERM) or,
    # for a pod killed outright, by this load (those entries are past ``saved_count``).
    aborted = tuple(
        str(entry.data.get("call_id"))
        for entry in state.history
        if entry.kind == "tool_result" and entry.outcome == "aborted"
    )
    return SavedView(
        exists=True,
        last_saved_seq=saved_count - 1 if saved_count else None,
        answer=state.answer,
        stopped=state.stopped,
        aborted_calls=aborted,
        pending_approvals=tuple(
            PendingApproval(call.id, call.name, dict(call.input))
            for call in state.awaiting_approval
        ),
        turns=state.turns,
        usage=dict(state.usage),
        cost_usd=state.cost_usd,
    )


def read_saved(store: Store, state_id: str) -> SavedView:
    """Read one State from ``store``; a store that cannot be reached gives a SavedView
    with ``error`` set instead of raising (the replacement pod then loads it itself)."""
    fences = store.supports("claim")
    try:
        record = store.read(state_id)
    except Exception as error:  # any store failure: report it, do not stop reconciling
        _log.warning("could not read State %s: %s", state_id, error)
        return SavedView(exists=False, error=f"{type(error).__name__}: {error}", fences=fences)
    return replace(saved_view(state_id, record), fences=fences)


def claim(store: Store, state_id: str) -> bool:
    """Fence earlier writers of ``state_id`` if the store supports it (MinioStore does).

    Returns whether the store has a ``claim``; raises what the claim raises (the
    operator then does not start the replacement pod, see ``decide.claim_refusal``).
    """
    if not store.supports("claim"):
        return False
    store.claim(state_id)
    return True


def prepare(store: Store) -> None:
    """Make the store ready for new States where the operator's key may and the pods' may
    not: MinioStore's bucket is created if it is missing (per-run credentials cannot)."""
    store.ensure_bucket()


def delete_state(store: Store, state_id: str) -> None:
    """Delete one saved State (its entries and info); an unknown id does nothing."""
    store.delete(state_id)
