"""``spec.forkFrom``: an AgentRun that starts from entry N of another run's saved State.

Before the fork's first pod starts, the operator copies entries 0..N of the source run's
State into the fork's own (``alpineagents.fork``, with the operator's store key: the
fork's pod only ever reads its own State, so the source's credentials never reach it).
The source is the AgentRun of that name in the fork's own namespace, saved in the same
store; a source in another namespace cannot be named. What the fork inherited (the
source's turns, usage and cost at entry N) is in ``status.forkedFrom``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from alpineagents import State, StateExistsError, Store, fork
from alpineagents.store import redact
from alpineagents_operator.deciding.run_status import cost_text, usage_status
from alpineagents_operator.kube.config import OperatorConfig
from alpineagents_operator.kube.pods import store_url
from alpineagents_operator.kube.views import JSON, AgentRunView, Refusal

__all__ = ["ForkFrom", "copy_for_fork"]


@dataclass(frozen=True)
class ForkFrom:
    """``spec.forkFrom`` of a run (the CRD checks its shape)."""

    run: str
    entry: int

    @classmethod
    def of(cls, run: AgentRunView) -> ForkFrom | None:
        raw = run.spec.get("forkFrom")
        if not isinstance(raw, Mapping):
            return None
        return cls(str(raw.get("run") or ""), int(raw.get("entry") or 0))


def copy_for_fork(
    run: AgentRunView, source: AgentRunView | None, store: Store, config: OperatorConfig
) -> JSON | Refusal:
    """Copy the source's entries into ``run``'s State (blocking: call it off the event
    loop); returns ``status.forkedFrom``, or why the fork cannot be made. Taken again
    after a step that copied but could not record it, it finds its own copy and says so."""
    wanted = ForkFrom.of(run)
    assert wanted is not None
    where = f"spec.forkFrom ({wanted.run}, entry {wanted.entry})"
    if source is None:
        return Refusal(
            "ForkSourceMissing",
            f"{where}: no AgentRun {wanted.run!r} in namespace {run.namespace}; the fork "
            f"starts once it exists (a fork names a run of its own namespace)",
            final=False,
        )
    if store_url(source, config) != store_url(run, config):
        return Refusal(
            "ForkAcrossStores",
            f"{where}: {wanted.run} is saved in {redact(store_url(source, config))!r}, this "
            f"run in {redact(store_url(run, config))!r}: give the fork the source's spec.store",
        )
    try:
        state = fork(store, source.state_id, wanted.entry, run.state_id)
    except StateExistsError:
        state = store.load(run.state_id)
        if state.forked_from is None or state.forked_from.id != source.state_id:
            return Refusal(
                "ForkStateExists",
                f"{where}: State {run.state_id} exists already and is not a fork of {wanted.run}",
            )
    except LookupError:
        return Refusal(
            "ForkSourceMissing",
            f"{where}: {wanted.run} has saved nothing yet; the fork starts once it has",
            final=False,
        )
    except ValueError as error:
        return Refusal("ForkInvalid", f"{where}: {error}")
    return _inherited(wanted, source.state_id, state)


def _inherited(wanted: ForkFrom, source_id: str, state: State) -> dict[str, Any]:
    return {
        "run": wanted.run,
        "entry": wanted.entry,
        "stateId": source_id,
        "turns": state.turns,
        "usage": usage_status(state.usage),
        "costUSD": cost_text(state.cost_usd),
    }
