"""Admission: how many runs may have a pod at once, and which waits next.

Without caps every AgentRun gets its pod at once. With them (the chart's
``admission.maxRunning`` for the whole cluster, ``admission.maxRunningPerNamespace`` per
namespace, and the Namespace's own annotation ``alpineagents.dev/max-running``, which the
platform team owns, over the latter), a run that would start its first pod, or start
again after waiting for approval or a suspension, must be *admitted*: it takes a place,
held (``status.admitted``) until it ends, waits for approval or is suspended. A lost pod's
replacement keeps its run's place, so a resumed run never queues behind new ones.

A run that finds no place is ``Queued``, in line by ``spec.priority`` (higher first),
then age, then name. A place in the whole cluster goes to the first run in that line
whose namespace has a place of its own: a namespace at its cap holds no one else up.

:class:`Admission` is the ledger of places. It is changed only from the event loop (no
locks), so a check and the place it takes are one step: two runs reconciled at once never
take the same last place. It learns places from the AgentRuns the watch delivers
(``status.admitted``) and remembers the places it gave until the watch shows them.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from alpineagents_operator.kube.views import TERMINAL_PHASES, AgentRunView, Phase, parse_time

__all__ = ["ANNOTATION", "Admission", "Caps", "NamespaceCaps", "Verdict", "parse_cap"]

_log = logging.getLogger(__name__)

ANNOTATION = "alpineagents.dev/max-running"
"""The Namespace annotation that sets its own cap on runs with a pod (over the chart's)."""
_GIVEN_FOR = 60.0
"""Seconds a place given stays counted without the watch showing it (a status patch
that failed after the pod was created: the next step gives it again)."""

NO_PLACE = frozenset({*TERMINAL_PHASES, Phase.WAITING_FOR_APPROVAL, Phase.SUSPENDED})
"""Phases in which a run holds no place."""

RunKey = tuple[str, str]
_LineKey = tuple[int, float, str]


@dataclass(frozen=True)
class Caps:
    """The caps in force: None is no cap."""

    max_running: int | None = None
    max_running_per_namespace: int | None = None

    @property
    def any(self) -> bool:
        return self.max_running is not None or self.max_running_per_namespace is not None


@dataclass(frozen=True)
class Verdict:
    """Whether a run may start its pod now; if not, which cap holds it and its place."""

    admitted: bool
    reason: str = ""
    """``NamespaceCap`` or ``ClusterCap`` when not admitted."""
    message: str = ""
    place: int = 0
    """1 for the next in line."""
    withdrawn: bool = False
    """The place the run holds was taken back (Kueue evicted its Workload): its pod
    stops gracefully and it queues again (:mod:`.kueue_admission`)."""


def parse_cap(value: object, where: str) -> int | None:
    """A cap from a chart value or an annotation: a whole number of runs, 0 or more.
    Raises ``ValueError`` naming ``where`` for anything else."""
    if value is None or value == "":
        return None
    text = str(value).strip()
    if not text.isdigit():
        raise ValueError(f"{where} must be a whole number of runs (0 or more), not {value!r}")
    return int(text)


def _line_key(run: AgentRunView) -> _LineKey:
    priority = run.spec.get("priority")
    rank = priority if isinstance(priority, int) and not isinstance(priority, bool) else 0
    created = parse_time(run.created_at)
    return (-rank, created.timestamp() if created else 0.0, run.name)


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


class Admission:
    """The ledger of places (see the module's docstring).

    ``namespace_cap(namespace)`` gives a namespace's own cap from its annotation (None:
    none, or it cannot be read); it is asked only while the namespace has runs to judge.
    """

    def __init__(
        self,
        caps: Caps,
        namespace_cap: Callable[[str], int | None] = lambda _: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.caps = caps
        self._namespace_cap = namespace_cap
        self._clock = clock
        self._holding: set[RunKey] = set()
        """Runs whose status, as watched, says they hold a place."""
        self._given: dict[RunKey, float] = {}
        """Places this ledger gave that the watch has not shown yet, and when."""
        self._in_use: Counter[str] = Counter()
        """Places held or given, by namespace."""
        self._line: dict[str, list[tuple[_LineKey, str]]] = {}
        self._in_line: dict[RunKey, _LineKey] = {}

    # ------------------------------------------------------------------ what the watch shows
    def run_seen(self, run: AgentRunView, *, gone: bool) -> None:
        """An AgentRun as the watch delivered it (or its deletion)."""
        key = (run.namespace, run.name)
        holds = not gone and run.status.admitted and run.status.phase not in TERMINAL_PHASES
        if holds:
            self._take(key)
            self._holding.add(key)
        elif key in self._holding and not gone:
            # A place given and not shown yet stays: this event may be from before it. A
            # deleted run's place goes once its pods are stopped (``release``, by the step
            # that stops them), not at its DELETED event: the next run's pod would start
            # beside them.
            self.release(key)
        if not gone and run.status.phase == Phase.QUEUED and not run.deleting:
            self._enter_line(run)
        else:
            self._leave_line(key)

    # ------------------------------------------------------------------ steps
    def admit(self, run: AgentRunView, *, take: bool = True) -> Verdict:
        """Give ``run`` a place if one is free for it and no run ahead of it in line
        wants it; the place is held from now on (``take=False``: only say whether)."""
        key = (run.namespace, run.name)
        self._forget_stale_given()
        if key in self._holding or key in self._given:
            return Verdict(True)
        line_key = _line_key(run)
        namespace = run.namespace
        cap = self.namespace_cap(namespace)
        if cap is not None:
            free = cap - self._holding_in(namespace)
            place = self._ahead_in(namespace, line_key, key) + 1
            if place > free:
                return Verdict(
                    False,
                    "NamespaceCap",
                    f"queued: {_ordinal(place - max(free, 0))} in line for namespace "
                    f"{namespace}'s {cap} places ({self._cap_source(namespace)}), "
                    f"{self._holding_in(namespace)} in use",
                    place=place - max(free, 0),
                )
        if self.caps.max_running is not None:
            free = self.caps.max_running - self._total()
            place = self._ahead_in_cluster(line_key, key) + 1
            if place > free:
                return Verdict(
                    False,
                    "ClusterCap",
                    f"queued: {_ordinal(place - max(free, 0))} in line for the cluster's "
                    f"{self.caps.max_running} places (admission.maxRunning), "
                    f"{self._total()} in use",
                    place=place - max(free, 0),
                )
        if take:
            self._take(key)
            self._given[key] = self._clock()
            self._leave_line(key)
        return Verdict(True)

    def release(self, key: RunKey) -> None:
        """``key`` gave its place up (ended, waits for approval, suspended, deleted)."""
        if key in self._holding or key in self._given:
            self._holding.discard(key)
            self._given.pop(key, None)
            self._in_use[key[0]] -= 1
            if self._in_use[key[0]] <= 0:
                del self._in_use[key[0]]
        self._leave_line(key)

    def holds(self, key: RunKey) -> bool:
        return key in self._holding or key in self._given

    def next_in_line(self) -> list[RunKey]:
        """Queued runs that may find a place now: per namespace as many as it has free,
        in line order; to step (each is judged again by :meth:`admit`)."""
        free_in_cluster = (
            None if self.caps.max_running is None else self.caps.max_running - self._total()
        )
        if free_in_cluster is not None and free_in_cluster <= 0:
            return []
        chosen: list[tuple[_LineKey, RunKey]] = []
        for namespace, line in self._line.items():
            cap = self.namespace_cap(namespace)
            room = len(line) if cap is None else cap - self._holding_in(namespace)
            chosen += [(k, (namespace, name)) for k, name in line[: max(room, 0)]]
        chosen.sort()
        picked = [key for _, key in chosen]
        return picked if free_in_cluster is None else picked[:free_in_cluster]

    def in_use(self) -> Mapping[str, int]:
        """Places held, by namespace (for metrics)."""
        return dict(self._in_use)

    def queued(self) -> Mapping[str, int]:
        """Runs in line, by namespace (for metrics)."""
        return {namespace: len(line) for namespace, line in self._line.items() if line}

    def namespace_cap(self, namespace: str) -> int | None:
        own = self._namespace_cap(namespace)
        return own if own is not None else self.caps.max_running_per_namespace

    # ------------------------------------------------------------------ internals
    def _cap_source(self, namespace: str) -> str:
        if self._namespace_cap(namespace) is not None:
            return f"its annotation {ANNOTATION}"
        return "admission.maxRunningPerNamespace"

    def _take(self, key: RunKey) -> None:
        if key not in self._holding and key not in self._given:
            self._in_use[key[0]] += 1
        self._given.pop(key, None)

    def _total(self) -> int:
        return sum(self._in_use.values())

    def _holding_in(self, namespace: str) -> int:
        return self._in_use.get(namespace, 0)

    def _ahead_in(self, namespace: str, line_key: _LineKey, key: RunKey) -> int:
        line = self._line.get(namespace, [])
        return bisect.bisect_left(line, (line_key, key[1]))

    def _ahead_in_cluster(self, line_key: _LineKey, key: RunKey) -> int:
        # Ahead in the cluster's line: runs before this one that their own namespace's
        # cap lets through (a namespace at its cap holds no one else up).
        ahead = 0
        for namespace, line in self._line.items():
            before = bisect.bisect_left(line, (line_key, key[1]))
            cap = self.namespace_cap(namespace)
            if cap is not None:
                before = min(before, max(cap - self._holding_in(namespace), 0))
            ahead += before
        return ahead

    def _enter_line(self, run: AgentRunView) -> None:
        key = (run.namespace, run.name)
        line_key = _line_key(run)
        if self._in_line.get(key) == line_key:
            return
        self._leave_line(key)
        bisect.insort(self._line.setdefault(run.namespace, []), (line_key, run.name))
        self._in_line[key] = line_key

    def _leave_line(self, key: RunKey) -> None:
        line_key = self._in_line.pop(key, None)
        if line_key is None:
            return
        line = self._line.get(key[0], [])
        index = bisect.bisect_left(line, (line_key, key[1]))
        if index < len(line) and line[index] == (line_key, key[1]):
            del line[index]
        if not line:
            self._line.pop(key[0], None)

    def _forget_stale_given(self) -> None:
        now = self._clock()
        for key in [k for k, at in self._given.items() if now - at > _GIVEN_FOR]:
            self.release(key)


class NamespaceCaps:
    """Each namespace's own cap, from its annotation :data:`ANNOTATION`, read through
    ``read_annotations`` (a GET of the Namespace) when :meth:`due`, at most once per
    ``refresh`` seconds; :meth:`cap` answers from what was read.

    A value that is not a whole number is logged once and ignored (the chart's cap
    holds); a Namespace that cannot be read has no cap of its own.
    """

    def __init__(
        self,
        read_annotations: Callable[[str], Mapping[str, str] | None],
        refresh: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read = read_annotations
        self._refresh = refresh
        self._clock = clock
        self._known: dict[str, tuple[float, int | None]] = {}
        self._annotations: dict[str, Mapping[str, str]] = {}
        """Each namespace's annotations as last read (its other caps read them here)."""
        self._warned: set[tuple[str, str]] = set()

    def cap(self, namespace: str) -> int | None:
        """The namespace's own cap as last read (None: none, or not read yet)."""
        known = self._known.get(namespace)
        return known[1] if known is not None else None

    def annotation(self, namespace: str, key: str) -> str | None:
        """The namespace's annotation ``key`` as last read (None: none, or not read)."""
        return self._annotations.get(namespace, {}).get(key)

    def due(self, namespace: str) -> bool:
        """Whether the namespace's annotation should be read again."""
        known = self._known.get(namespace)
        return known is None or self._clock() - known[0] >= self._refresh

    def read(self, namespace: str) -> int | None:
        """Read the namespace's annotation now (blocking: call it off the event loop)."""
        try:
            annotations = self._read(namespace) or {}
        except Exception as error:  # no cap of its own, as if it had none; said once
            self._warn(namespace, f"cannot read Namespace {namespace}: {error}")
            annotations = {}
        self._annotations[namespace] = dict(annotations)
        cap = None
        try:
            cap = parse_cap(
                annotations.get(ANNOTATION), f"annotation {ANNOTATION} of Namespace {namespace}"
            )
        except ValueError as error:
            self._warn(namespace, f"{error}; the chart's cap holds")
        self._known[namespace] = (self._clock(), cap)
        return cap

    def _warn(self, namespace: str, text: str) -> None:
        if (namespace, text) not in self._warned:
            self._warned.add((namespace, text))
            _log.warning("%s", text)
