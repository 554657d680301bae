"""Plain, typed views of what the operator looks at: an AgentRun, its pods, its saved State.

The Kubernetes objects arrive as JSON dicts; these functions pick out the few facts the
reconcile logic needs, so :func:`alpineagents_operator.deciding.decide.decide` works on small
frozen dataclasses and never on the Kubernetes client's objects.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from alpineagents.pod_contract import (
    GROUP,
    KIND,
    PLURAL,
    STANDBY_LABEL,
    VERSION,
    PendingApproval,
    TerminationMessage,
    state_id_for,
)
from alpineagents.usage import Budget

__all__ = [
    "ATTEMPT_LABEL",
    "CONTAINER_NAME",
    "GROUP",
    "JSON",
    "KIND",
    "PLURAL",
    "RUN_LABEL",
    "STANDBY_LABEL",
    "STATE_ANNOTATION",
    "TERMINAL_PHASES",
    "VERSION",
    "AgentRunView",
    "ContainerExit",
    "PendingApproval",
    "Phase",
    "PodView",
    "RestartPolicy",
    "RunStatus",
    "SavedView",
    "TerminationMessage",
    "current_pod_name",
    "format_time",
    "is_standby_pod",
    "parse_time",
    "pod_name_for",
    "state_id_for",
]

CONTAINER_NAME = "agent"
"""The agent pod's one container (the operator names it, and reads its state)."""
RUN_LABEL = f"{GROUP}/run"
ATTEMPT_LABEL = f"{GROUP}/attempt"
STATE_ANNOTATION = f"{GROUP}/state-id"
MAX_NAME_LENGTH = 63
"""Longest AgentRun name: the name is the value of its pods' run label, and label values
are at most 63 characters (the CRD refuses longer names; this guards older objects)."""

JSON = dict[str, Any]


class Phase(StrEnum):
    """``status.phase`` of an AgentRun."""

    QUEUED = "Queued"
    PENDING = "Pending"
    RUNNING = "Running"
    INTERRUPTED = "Interrupted"
    WAITING_FOR_APPROVAL = "WaitingForApproval"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


TERMINAL_PHASES = frozenset({Phase.SUCCEEDED, Phase.FAILED})


def parse_time(value: Any) -> datetime | None:
    """An RFC 3339 timestamp as Kubernetes writes it, or None."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def format_time(moment: datetime) -> str:
    """RFC 3339 in UTC with milliseconds (sub-second backoffs need them)."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def labels_pods(run_name: str) -> bool:
    """Whether ``run_name`` can be the value of its pods' run label (so they can exist)."""
    return len(run_name) <= MAX_NAME_LENGTH


def pod_name_for(run_name: str, attempt: int) -> str:
    """Pod names carry the attempt, so a retried step finds (and adopts) its own pod."""
    return f"{run_name}-{attempt}"


STANDBY_POD_PREFIX = "alpineagents-standby-"
"""Names of a warm pool's standby pods: this and a random suffix (:func:`is_standby_pod`)."""
_STANDBY_POD = re.compile(re.escape(STANDBY_POD_PREFIX) + r"[0-9a-f]{10}")


def is_standby_pod(pod_name: str | None) -> bool:
    """Whether ``pod_name`` is a warm pool pod's (never a ``<run>-<attempt>`` one: a run
    named ``alpineagents-standby`` would need a ten-digit attempt to look like one)."""
    return bool(pod_name) and _STANDBY_POD.fullmatch(pod_name or "") is not None


def credentials_secret_name(run_name: str) -> str:
    """The Secret holding a run's own short-lived store credentials."""
    return f"{run_name}-store-credentials"


# --------------------------------------------------------------------------- AgentRun
def current_pod_name(run_name: str, status: RunStatus) -> str | None:
    """The pod of ``status.attempt`` (see :attr:`AgentRunView.current_pod`)."""
    if status.attempt < 1:
        return None
    if is_standby_pod(status.pod):
        return status.pod
    return pod_name_for(run_name, status.attempt)


@dataclass(frozen=True)
class RestartPolicy:
    """``spec.restartPolicy``: how often and how soon a lost pod is replaced."""

    max_restarts: int = 5
    initial_backoff_seconds: float = 1.0
    max_backoff_seconds: float = 60.0

    def backoff(self, restart: int) -> float:
        """Seconds to wait before restart number ``restart`` (1 for the first)."""
        if restart < 1 or self.initial_backoff_seconds <= 0:
            return 0.0
        delay = self.initial_backoff_seconds * 2.0 ** (restart - 1)
        return float(min(delay, self.max_backoff_seconds))

    @classmethod
    def from_spec(cls, raw: Any) -> RestartPolicy:
        raw = raw if isinstance(raw, Mapping) else {}
        defaults = cls()
        return cls(
            max_restarts=int(raw.get("maxRestarts", defaults.max_restarts)),
            initial_backoff_seconds=float(
                raw.get("initialBackoffSeconds", defaults.initial_backoff_seconds)
            ),
            max_backoff_seconds=float(raw.get("maxBackoffSeconds", defaults.max_backoff_seconds)),
        )


@dataclass(frozen=True)
class RunStatus:
    """The parts of ``status`` the reconcile logic reads (the rest is only written)."""

    phase: Phase | None = None
    attempt: int = 0
    pod: str | None = None
    state_id: str | None = None
    restarts: int = 0
    next_attempt_at: datetime | None = None
    pending_approvals: tuple[PendingApproval, ...] = ()
    aborted_calls: tuple[str, ...] = ()
    started_at: str | None = None
    saved_state_unread: bool = False
    """The run ended while the store could not be read: its facts await the saved State."""
    last_saved_seq: int | None = None
    """The last entry saved when the current pod was started (None: pod 1, or unknown)."""
    admitted: bool = False
    """The run holds a place under the admission caps (see :mod:`.admission`)."""
    raw: Mapping[str, Any] = field(default_factory=dict)
    """The whole status as read, to compare new values against."""

    @classmethod
    def from_status(cls, raw: Any) -> RunStatus:
        raw = dict(raw) if isinstance(raw, Mapping) else {}
        phase_text = raw.get("phase")
        try:
            phase = Phase(phase_text) if phase_text else None
        except ValueError:
            phase = None
        aborted = raw.get("abortedCalls")
        return cls(
            phase=phase,
            attempt=int(raw.get("attempt") or 0),
            pod=raw.get("pod") or None,
            state_id=raw.get("stateId") or None,
            restarts=int(raw.get("restarts") or 0),
            next_attempt_at=parse_time(raw.get("nextAttemptAt")),
            pending_approvals=PendingApproval.parse_all(raw.get("pendingApprovals")),
            aborted_calls=tuple(str(a) for a in aborted) if isinstance(aborted, list) else (),
            started_at=raw.get("startedAt") or None,
            saved_state_unread=bool(raw.get("savedStateUnread")),
            last_saved_seq=_int_or_none(raw.get("lastSavedSeq")),
            admitted=raw.get("admitted") is True,
            raw=raw,
        )


@dataclass(frozen=True)
class AgentRunView:
    """One AgentRun: identity, the spec fields that steer reconciling, and its status."""

    namespace: str
    name: str
    uid: str
    generation: int
    spec: Mapping[str, Any]
    status: RunStatus
    deleting: bool = False
    created_at: str | None = None
    """``metadata.creationTimestamp``: a run's age, for its place in line."""
    queue_name: str | None = None
    """Its label ``kueue.x-k8s.io/queue-name``: the Kueue LocalQueue that admits it
    (:mod:`.kueue_admission`)."""

    @property
    def suspend(self) -> bool:
        return bool(self.spec.get("suspend", False))

    @property
    def restart_policy(self) -> RestartPolicy:
        return RestartPolicy.from_spec(self.spec.get("restartPolicy"))

    @property
    def budget(self) -> Budget | None:
        """``spec.budget`` (the CRD checks its shape; one it cannot read is no budget)."""
        raw = self.spec.get("budget")
        if not isinstance(raw, Mapping):
            return None

        def limit(key: str) -> Any:
            value = raw.get(key)
            return value if isinstance(value, int | float) and not isinstance(value, bool) else None

        try:
            return Budget(
                max_input_tokens=limit("maxInputTokens"),
                max_output_tokens=limit("maxOutputTokens"),
                max_cost_usd=limit("maxCostUSD"),
            )
        except ValueError:
            return None

    @property
    def current_pod(self) -> str | None:
        """The name of the pod of ``status.attempt``: a standby the run was handed
        (``status.pod``, see :mod:`.standby_pool`), else ``<run>-<attempt>``."""
        return current_pod_name(self.name, self.status)

    @property
    def approved_call_ids(self) -> frozenset[str]:
        """Call ids that ``spec.approvals`` answers (allowed or refused)."""
        approvals = self.spec.get("approvals")
        if not isinstance(approvals, list):
            return frozenset()
        return frozenset(
            str(a["callId"]) for a in approvals if isinstance(a, Mapping) and a.get("callId")
        )

    @property
    def state_id(self) -> str:
        """The id of the run's State: derived from namespace, name and uid, never read
        from ``status.stateId`` (whoever may patch the status could name any State)."""
        return state_id_for(self.namespace, self.name, self.uid)

    @property
    def name_problem(self) -> str | None:
        """Why this run's name cannot work (None: it can). A longer name than
        :data:`MAX_NAME_LENGTH` cannot label its pods, so no pod of it can exist."""
        if labels_pods(self.name):
            return None
        return (
            f"metadata.name is {len(self.name)} characters, more than the "
            f"{MAX_NAME_LENGTH} a label value may have (it labels the run's pods): create "
            f"the AgentRun again with a shorter name"
        )

    @property
    def on_delete(self) -> str:
        """What becomes of the saved State when the run is deleted: ``Keep``, ``Delete``,
        or ``Expire`` (left to the bucket's lifecycle rule)."""
        return str(self.spec.get("onDelete", "Keep"))

    @property
    def delete_saved_state(self) -> bool:
        return self.on_delete == "Delete"

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> AgentRunView:
        meta = body.get("metadata") or {}
        return cls(
            namespace=str(meta.get("namespace") or "default"),
            name=str(meta["name"]),
            uid=str(meta.get("uid") or ""),
            generation=int(meta.get("generation") or 0),
            spec=dict(body.get("spec") or {}),
            status=RunStatus.from_status(body.get("status")),
            deleting=bool(meta.get("deletionTimestamp")),
            created_at=meta.get("creationTimestamp") or None,
            queue_name=(meta.get("labels") or {}).get("kueue.x-k8s.io/queue-name") or None,
        )


# --------------------------------------------------------------------------- pods
@dataclass(frozen=True)
class ContainerExit:
    """How the agent container ended (``state.terminated``)."""

    code: int
    reason: str = ""
    message: str = ""
    report: TerminationMessage | None = None


@dataclass(frozen=True)
class PodView:
    """One pod of a run, as far as reconciling cares."""

    name: str
    uid: str = ""
    owner_uid: str | None = None
    attempt: int | None = None
    phase: str = "Pending"
    reason: str | None = None
    """``status.reason`` of the pod: "Evicted", "NodeLost", ..."""
    message: str | None = None
    deleting: bool = False
    deletion_deadline: datetime | None = None
    """``metadata.deletionTimestamp``: when the kubelet should have removed it."""
    deleted_at: datetime | None = None
    """When it was deleted: the deadline less ``metadata.deletionGracePeriodSeconds``."""
    running: bool = False
    waiting_reason: str | None = None
    waiting_message: str | None = None
    exit: ContainerExit | None = None
    disruption: str | None = None
    """Reason of a True ``DisruptionTarget`` condition (eviction, PodGC after node loss)."""
    unschedulable: str | None = None
    image: str | None = None
    """The runner container's image, as the pod's spec names it."""

    @property
    def finished(self) -> bool:
        """No process of this pod runs, or ever will again."""
        return self.exit is not None or self.phase in ("Succeeded", "Failed")

    @property
    def alive(self) -> bool:
        return not self.finished

    @classmethod
    def from_pod(cls, pod: Mapping[str, Any], container: str = CONTAINER_NAME) -> PodView:
        meta = pod.get("metadata") or {}
        status = pod.get("status") or {}
        labels = meta.get("labels") or {}
        owner_uid = None
        for ref in meta.get("ownerReferences") or []:
            if ref.get("kind") == KIND and str(ref.get("apiVersion", "")).startswith(GROUP + "/"):
                owner_uid = str(ref.get("uid") or "")
        attempt_text = str(labels.get(ATTEMPT_LABEL, ""))
        statuses: Sequence[Mapping[str, Any]] = status.get("containerStatuses") or []
        chosen: Mapping[str, Any] = next(
            (s for s in statuses if s.get("name") == container), statuses[0] if statuses else {}
        )
        state = chosen.get("state") or {}
        exit_info = None
        terminated = state.get("terminated")
        if isinstance(terminated, Mapping):
            message = str(terminated.get("message") or "")
            exit_info = ContainerExit(
                code=int(terminated.get("exitCode") or 0),
                reason=str(terminated.get("reason") or ""),
                message=message,
                report=TerminationMessage.parse(message) if message else None,
            )
        waiting = state.get("waiting") if isinstance(state.get("waiting"), Mapping) else None
        containers: Sequence[Mapping[str, Any]] = (pod.get("spec") or {}).get("containers") or []
        image = next((c.get("image") for c in containers if c.get("name") == container), None)
        disruption = None
        unschedulable = None
        for condition in status.get("conditions") or []:
            if condition.get("type") == "DisruptionTarget" and condition.get("status") == "True":
                disruption = str(condition.get("reason") or "DisruptionTarget")
            if (
                condition.get("type") == "PodScheduled"
                and condition.get("status") == "False"
                and condition.get("reason") == "Unschedulable"
            ):
                unschedulable = str(condition.get("message") or "Unschedulable")
        deadline = parse_time(meta.get("deletionTimestamp"))
        grace = meta.get("deletionGracePeriodSeconds")
        deleted_at = deadline
        if deadline is not None and isinstance(grace, int) and grace > 0:
            deleted_at = deadline - timedelta(seconds=grace)
        return cls(
            name=str(meta.get("name")),
            uid=str(meta.get("uid") or ""),
            owner_uid=owner_uid,
            attempt=int(attempt_text) if attempt_text.isdigit() else None,
            phase=str(status.get("phase") or "Pending"),
            reason=status.get("reason") or None,
            message=status.get("message") or None,
            deleting=bool(meta.get("deletionTimestamp")),
            deletion_deadline=deadline,
            deleted_at=deleted_at,
            running=isinstance(state.get("running"), Mapping),
            waiting_reason=(str(waiting.get("reason") or "") or None) if waiting else None,
            waiting_message=(str(waiting.get("message") or "") or None) if waiting else None,
            exit=exit_info,
            disruption=disruption,
            unschedulable=unschedulable,
            image=str(image) if image else None,
        )


# --------------------------------------------------------------------------- saved State
@dataclass(frozen=True)
class SavedView:
    """What the store says about a run's saved State (read with ``store.load``)."""

    exists: bool
    last_saved_seq: int | None = None
    """Seq of the last entry the store holds (None: nothing saved)."""
    answer: str | None = None
    stopped: str | None = None
    aborted_calls: tuple[str, ...] = ()
    """Calls that ended "aborted" (running when a pod stopped or was lost; not run again)."""
    pending_approvals: tuple[PendingApproval, ...] = ()
    turns: int = 0
    usage: Mapping[str, int] = field(default_factory=dict)
    cost_usd: float = 0.0
    error: str | None = None
    """Why the store could not be read (the other fields are then unknown)."""
    fences: bool = False
    """The store fences earlier writers (``claim``, MinioStore): once the operator has
    claimed the State, a pod still stopping can save nothing more, so its replacement
    need not wait for it to be gone."""


@dataclass(frozen=True)
class RunEvent:
    """A Kubernetes Event to post on the AgentRun."""

    type: str
    """"Normal" or "Warning"."""
    reason: str
    message: str


@dataclass(frozen=True)
class Refusal:
    """Why the operator does not start a run's pod: the status reason, a message saying
    what is wrong and what to do, and whether it is final (the run ends Failed) or may
    pass later (the phase stays and the step is taken again in ``retry_after`` seconds)."""

    reason: str
    message: str
    final: bool = True
    retry_after: float = 10.0
