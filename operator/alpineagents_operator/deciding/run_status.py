"""An AgentRun's status as the operator writes it: conditions, usage, cost, the patch.

:func:`status_patch` turns the changes a reconcile step wants into the merge patch it
sends: only fields whose value changes, with ``stateId``, ``observedGeneration`` and the
conditions (:func:`conditions_for`) that follow from the phase.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from alpineagents_operator.kube.views import JSON, AgentRunView, Phase, format_time

__all__ = [
    "ANSWER_LIMIT",
    "answer_text",
    "conditions_for",
    "cost_text",
    "status_patch",
    "throttled_text",
    "usage_status",
]

ANSWER_LIMIT = 1000
"""Characters of the answer kept in ``status.answer`` (the full answer is in the store)."""


def conditions_for(
    phase: Phase | None,
    reason: str | None,
    message: str | None,
    generation: int,
    previous: Iterable[Mapping[str, Any]],
    now: datetime,
    throttled: Mapping[str, Any] | bool | None = False,
    admitted: bool = False,
) -> list[JSON]:
    """The status conditions for a phase: ``Running``, ``WaitingForApproval`` and
    ``Succeeded`` (True, False on failure, Unknown while undecided); and ``Throttled``
    once a run has waited for its turn at the shared limiter (``status.throttled``: True
    while it waits, False after; ``False`` for ``throttled``: never, no condition); and
    ``Admitted`` under admission caps (False while ``Queued``, True while the run holds a
    place, none otherwise).

    ``lastTransitionTime`` moves only when a condition's status changes.
    """
    phase_reason = str(phase) if phase else "Pending"
    text = message or ""
    wanted: list[tuple[str, str, str, str]] = [
        (
            "Running",
            *(
                ("True", "PodRunning", "")
                if phase == Phase.RUNNING
                else ("False", phase_reason, text)
            ),
        ),
        (
            "WaitingForApproval",
            *(
                ("True", "ApprovalRequired", text)
                if phase == Phase.WAITING_FOR_APPROVAL
                else ("False", "NoPendingApprovals", "")
            ),
        ),
    ]
    if throttled is not False:
        if isinstance(throttled, Mapping) and phase == Phase.RUNNING:
            wanted.append(("Throttled", "True", "WaitingForTurn", throttled_text(throttled)))
        else:
            wanted.append(("Throttled", "False", "NotWaiting", ""))
    if phase == Phase.QUEUED:
        wanted.append(("Admitted", "False", reason or "Queued", text))
    elif admitted:
        wanted.append(("Admitted", "True", "Admitted", ""))
    if phase == Phase.SUCCEEDED:
        wanted.append(("Succeeded", "True", "Answered", ""))
    elif phase == Phase.FAILED:
        wanted.append(("Succeeded", "False", reason or "Failed", text))
    else:
        wanted.append(("Succeeded", "Unknown", phase_reason, text))
    before = {str(c.get("type")): c for c in previous if isinstance(c, Mapping)}
    conditions = []
    for kind, status, why, what in wanted:
        old = before.get(kind)
        moved = old is None or old.get("status") != status
        conditions.append(
            {
                "type": kind,
                "status": status,
                "reason": why,
                "message": what,
                "lastTransitionTime": format_time(now) if moved else old["lastTransitionTime"],  # type: ignore[index]
                "observedGeneration": generation,
            }
        )
    return conditions


def throttled_text(throttled: Mapping[str, Any]) -> str:
    """What the ``Throttled`` condition says of a run waiting for its turn."""
    place = throttled.get("position")
    where = f", place {place} in line" if place else ""
    return (
        f"waiting for its turn on the model key's {throttled.get('limit')} limit since "
        f"{throttled.get('since')}{where} (a 429 is a wait, never a failure)"
    )


def answer_text(answer: str | None) -> str | None:
    """The answer as status holds it: its first :data:`ANSWER_LIMIT` characters."""
    if answer is None or len(answer) <= ANSWER_LIMIT:
        return answer
    return answer[: ANSWER_LIMIT - 1] + "…"


def usage_status(usage: Mapping[str, int]) -> JSON:
    """A usage dict (the runtime's snake_case) as ``status.usage`` holds it."""
    # The runtime counts in the Messages API's snake_case; status fields are camelCase.
    return {
        "inputTokens": int(usage.get("input_tokens", 0)),
        "outputTokens": int(usage.get("output_tokens", 0)),
        "cacheCreationInputTokens": int(usage.get("cache_creation_input_tokens", 0)),
        "cacheReadInputTokens": int(usage.get("cache_read_input_tokens", 0)),
    }


def cost_text(cost: float) -> str:
    """An estimated cost as ``status.costUSD`` holds it."""
    # A string: a float in a status patch would compare unequal after every round trip.
    return f"{cost:.4f}"


def status_patch(run: AgentRunView, changes: JSON, now: datetime) -> JSON:
    """The merge patch for ``changes`` to the run's status: with stateId,
    observedGeneration and conditions, and only the fields whose value changes."""
    current = run.status.raw
    merged = {**current, **changes}
    phase_text = merged.get("phase")
    phase = Phase(phase_text) if phase_text else None
    wanted: JSON = {
        **changes,
        "stateId": run.state_id,
        "observedGeneration": run.generation,
    }
    if phase is not None:
        wanted["conditions"] = conditions_for(
            phase,
            merged.get("reason"),
            merged.get("message"),
            run.generation,
            current.get("conditions") or [],
            now,
            merged.get("throttled", False),
            merged.get("admitted") is True,
        )
    return {
        key: (str(value) if isinstance(value, Phase) else value)
        for key, value in wanted.items()
        if _differs(current.get(key), value)
    }


def _differs(old: Any, new: Any) -> bool:
    if isinstance(new, Phase):
        new = str(new)
    if new is None:
        return old is not None
    return bool(old != new)
