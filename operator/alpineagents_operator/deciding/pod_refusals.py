"""A run's pod not started, and the step that says why.

The Reconciler turns what stopped a pod (the API server refused it, the State could not be
claimed, a refusal of :mod:`.refusals`) into a :class:`~.views.Refusal`
(:func:`pod_refusal`, :func:`claim_refusal`), and the Refusal into the step
(:func:`refused`): final ones end the run, others are tried again.
"""

from __future__ import annotations

from datetime import datetime

from alpineagents_operator.deciding.moves import fail
from alpineagents_operator.deciding.step import Decision, Step
from alpineagents_operator.kube.views import AgentRunView, Refusal, pod_name_for

CLAIM_RETRY_MAX_SECONDS = 30.0
"""Longest wait between two tries to claim a State before starting its replacement pod."""


def refused(run: AgentRunView, attempt: int, refusal: Refusal, now: datetime) -> Decision:
    """The step for a run whose pod ``attempt`` is not started, for ``refusal``'s reason.

    A final refusal (a forbidden Secret or store, a spec no pod can take, a pod the API
    server calls invalid) ends the run Failed with one Warning Event; once Failed, no
    later step acts, so it never repeats. Any other keeps the run's phase, says why in
    ``reason``/``message`` (with a Warning Event when the reason is new) and is taken
    again in ``refusal.retry_after`` seconds.
    """
    step = Step(run, (), None, now)
    if refusal.final:
        return fail(step, refusal.reason, refusal.message, {})
    return step.to(
        {"reason": refusal.reason, "message": refusal.message},
        events=step.event_if_new(
            run.status.raw.get("reason"), "Warning", refusal.reason, refusal.message
        ),
        requeue_after=refusal.retry_after,
        note=f"pod {pod_name_for(run.name, attempt)} not started ({refusal.reason}); trying again",
    )


def pod_refusal(run: AgentRunView, attempt: int, status: int, message: str) -> Refusal:
    """The API server refused to create pod ``attempt`` with HTTP ``status``.

    An invalid pod (400/413/422: a malformed ``resources``, ``env``, ``affinity``, a spec
    too large for its Secret, ...) will never be accepted: final, with the server's
    words. Anything else (403 from a quota, 5xx) may pass later.
    """
    text = f"pod {pod_name_for(run.name, attempt)} was refused: {message}"
    if status in (400, 413, 422):
        return Refusal("PodInvalid", text)
    return Refusal("PodRefused", text, final=False)


def claim_refusal(run: AgentRunView, attempt: int, error: str, failures: int) -> Refusal:
    """The operator could not claim (fence) the run's State before creating pod ``attempt``.

    A lost pod that still runs (its node cut off, a force delete) could otherwise write
    into the State next to its successor. The reason is ``FencingFailed``, and the step
    (read the saved State, claim, create) is taken again after a backoff that doubles
    with each of the ``failures`` so far, up to :data:`CLAIM_RETRY_MAX_SECONDS`. It is
    no restart: no pod was lost.
    """
    name = pod_name_for(run.name, attempt)
    delay = min(CLAIM_RETRY_MAX_SECONDS, 2.0 ** max(0, failures - 1))
    message = (
        f"could not claim State {run.state_id} before starting pod {name}, so a lost pod "
        f"that may still be running cannot be fenced off it: {error}; pod {name} starts "
        f"once the claim succeeds (try {failures + 1} in {delay:g}s)"
    )
    return Refusal("FencingFailed", message, final=False, retry_after=delay)
