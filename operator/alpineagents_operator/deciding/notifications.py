"""What a run's end notification is (``spec.notify``): its target, its CloudEvent, its
mark in ``status.notification``, and when one is due. Pure functions; the sending is
:mod:`.notifier`'s.

A run that ends (``Succeeded`` or ``Failed``) with ``spec.notify`` gets one CloudEvent
(specification 1.0, structured JSON mode) POSTed to ``spec.notify.url``, with the value of
``spec.notify.authSecretRef`` (a Secret in the run's namespace) in the header
``spec.notify.header`` (default ``Authorization``).

Each end has its own id (:func:`end_id`: the run's uid, phase and ``completedAt``), the
same on every try, so a run resumed after it failed (its budget raised) and ending again
is told again, once.

At most once (the issue's promise: an end is never sent twice). Before each try the
operator marks ``status.notification`` ``Sending`` with a patch that holds only if the run
is unchanged since it was read (its ``resourceVersion``), so two operators, or one
restarted, never both try. After the try the mark says how it went:

``Delivered``  the endpoint answered 2xx.
``Retrying``   it refused (any other status) or could not be reached (the connection
               never opened): nothing was received, so the next try is safe; it is taken
               at ``nextAttemptAt``, the wait doubling, until ``ALPINEAGENTS_NOTIFY_ATTEMPTS``.
``Failed``     that many tries failed (or the target is unusable: a Secret missing).
``Unknown``    the request was sent but its answer never came (a timeout, a connection
               cut, or an operator that stopped while sending: a ``Sending`` mark found by
               an operator that is not sending it). The endpoint may have it; at most once
               means it is not sent again.

So a notification can be lost only while one request is in flight, and is never sent
twice; an operator restarted between a run's end and its delivery (or between two tries)
sends it once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from alpineagents_operator.kube.views import (
    GROUP,
    JSON,
    PLURAL,
    TERMINAL_PHASES,
    VERSION,
    AgentRunView,
    format_time,
    parse_time,
)

__all__ = [
    "EVENT_TYPE",
    "Due",
    "NotifyTarget",
    "cloud_event",
    "due",
    "end_id",
    "mark",
    "settled",
]

EVENT_TYPE = "dev.alpineagents.run.finished"
CONTENT_TYPE = "application/cloudevents+json"
MAX_BACKOFF_SECONDS = 300.0
_ANSWER_LINES = 10
_ANSWER_CHARS = 500
SENDING, RETRYING, DELIVERED, FAILED, UNKNOWN = (
    "Sending",
    "Retrying",
    "Delivered",
    "Failed",
    "Unknown",
)
SETTLED = frozenset({DELIVERED, FAILED, UNKNOWN})


@dataclass(frozen=True)
class NotifyTarget:
    """``spec.notify``: where to POST, and the Secret holding the auth header's value."""

    url: str
    header: str = "Authorization"
    secret_name: str | None = None
    secret_key: str | None = None

    @classmethod
    def of(cls, run: AgentRunView) -> NotifyTarget | None:
        """The run's target (None: no ``spec.notify``, or one without a URL)."""
        raw = run.spec.get("notify")
        if not isinstance(raw, Mapping) or not isinstance(raw.get("url"), str):
            return None
        ref = raw.get("authSecretRef")
        ref = ref if isinstance(ref, Mapping) else {}
        name, key = ref.get("name"), ref.get("key")
        return cls(
            url=raw["url"],
            header=str(raw.get("header") or "Authorization"),
            secret_name=name if isinstance(name, str) and name else None,
            secret_key=key if isinstance(key, str) and key else None,
        )


@dataclass(frozen=True)
class Due:
    """What a run's notification needs now."""

    id: str
    """The end's id (the CloudEvent's)."""
    attempt: int
    """The try to make (1 for the first)."""
    at: datetime | None = None
    """Not before then (None: now)."""
    abandoned: bool = False
    """A ``Sending`` mark no sender holds: it is to be marked ``Unknown``, not sent."""


def end_id(run: AgentRunView) -> str | None:
    """The id of the run's end: the same for every try, another for another end (None:
    the run has not ended)."""
    completed = run.status.raw.get("completedAt")
    if run.status.phase not in TERMINAL_PHASES or not completed:
        return None
    stamp = "".join(ch for ch in str(completed) if ch.isalnum())
    return f"{run.uid}-{str(run.status.phase).lower()}-{stamp}"


def due(run: AgentRunView, now: datetime) -> Due | None:
    """The run's notification to make (None: none is due: no ``spec.notify``, no end,
    or this end's is settled). A ``Sending`` mark is returned ``abandoned``: the caller
    knows whether it is sending it itself."""
    if NotifyTarget.of(run) is None or run.status.saved_state_unread:
        return None  # unread: its cost and usage are still to come from the State
    ended = end_id(run)
    if ended is None:
        return None
    marked = _mark_of(run)
    if marked.get("id") != ended:
        return Due(ended, 1)
    state = marked.get("state")
    attempts = int(marked.get("attempts") or 0)
    if state == SENDING:
        return Due(ended, attempts, abandoned=True)
    if state == RETRYING:
        return Due(ended, attempts + 1, at=parse_time(marked.get("nextAttemptAt")) or now)
    return None  # Delivered, Failed, Unknown


def settled(run: AgentRunView) -> bool:
    """Whether nothing more is to be sent for the run's end (so retention may delete
    it): no ``spec.notify``, or its mark for this end says how it went."""
    if NotifyTarget.of(run) is None:
        return True
    marked = _mark_of(run)
    return marked.get("id") == end_id(run) and marked.get("state") in SETTLED


def backoff(attempt: int, base: float) -> float:
    """Seconds before try ``attempt + 1`` after try ``attempt`` failed."""
    return min(MAX_BACKOFF_SECONDS, base * 2.0 ** max(0, attempt - 1))


def mark(
    ended: str,
    state: str,
    attempts: int,
    now: datetime,
    *,
    message: str | None = None,
    retry_in: float | None = None,
) -> JSON:
    """The ``status.notification`` patch for a try's state (never holding a secret)."""
    body: JSON = {
        "id": ended,
        "state": state,
        "attempts": attempts,
        "lastAttemptAt": format_time(now),
        "nextAttemptAt": format_time(now + timedelta(seconds=retry_in)) if retry_in else None,
        "message": message,
    }
    if state == DELIVERED:
        body["deliveredAt"] = format_time(now)
    return {"notification": body}


def cloud_event(run: AgentRunView, ended: str, now: datetime, viewer_url: str = "") -> JSON:
    """The run's end as a CloudEvent 1.0 in structured mode (the whole JSON is the body)."""
    status = run.status.raw
    data: JSON = {
        "run": run.name,
        "namespace": run.namespace,
        "uid": run.uid,
        "phase": str(run.status.phase),
        "reason": status.get("reason"),
        "message": status.get("message"),
        "stateId": run.state_id,
        "attempt": run.status.attempt,
        "turns": status.get("turns"),
        "costUSD": status.get("costUSD"),
        "usage": status.get("usage") or {},
        "answer": answer_start(status.get("answer")),
        "startedAt": status.get("startedAt"),
        "completedAt": status.get("completedAt"),
    }
    if viewer_url:
        data["viewerUrl"] = f"{viewer_url}/runs/{run.state_id}"
    return {
        "specversion": "1.0",
        "id": ended,
        "source": f"/apis/{GROUP}/{VERSION}/namespaces/{run.namespace}/{PLURAL}",
        "type": EVENT_TYPE,
        "subject": run.name,
        "time": format_time(now),
        "datacontenttype": "application/json",
        "data": data,
    }


def answer_start(answer: Any) -> str | None:
    """The first lines of the final answer (the whole is in the store)."""
    if not isinstance(answer, str) or not answer:
        return None
    lines = answer.splitlines()
    start = "\n".join(lines[:_ANSWER_LINES])
    if len(start) > _ANSWER_CHARS:
        return start[: _ANSWER_CHARS - 1] + "…"
    return start + ("\n…" if len(lines) > _ANSWER_LINES else "")


def encoded(event: Mapping[str, Any]) -> bytes:
    """The event's body as sent."""
    return json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode()


def _mark_of(run: AgentRunView) -> Mapping[str, Any]:
    marked = run.status.raw.get("notification")
    return marked if isinstance(marked, Mapping) else {}
