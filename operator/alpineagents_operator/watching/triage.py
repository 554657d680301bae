"""Which watch events and which runs call for a reconcile step, judged without a request.

A step reads its run and its pods from the API server and may read the saved State: at
10,000 runs, or in a burst of lost pods, a step for every watch event and every run at
every resync would be most of the operator's work, and nearly all of it would find
nothing to do. :class:`Triage` answers from the watches' views (:mod:`.watched`) alone.
A view a moment old can only make it say "step" for a step that then finds nothing to
do; the watch event of whatever changed since brings its own step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from alpineagents_operator.credentials.credential_issuer import RunCredentialIssuer
from alpineagents_operator.deciding.decide import decide, refused
from alpineagents_operator.kube.admission import Verdict
from alpineagents_operator.kube.config import OperatorConfig
from alpineagents_operator.kube.metrics import OperatorMetrics
from alpineagents_operator.kube.views import AgentRunView, PodView
from alpineagents_operator.watching.refusals import run_refusal
from alpineagents_operator.watching.watched import RunKey, Watched


class Triage:
    """Says whether a run needs a step, from ``watched`` (None: every run always does)."""

    def __init__(
        self,
        watched: Watched | None,
        config: OperatorConfig,
        metrics: OperatorMetrics,
        credentials: RunCredentialIssuer,
        *,
        clock: Callable[[], datetime],
        failing: Callable[[RunKey], bool],
        requeue: Callable[[str, str, float], None],
        admission: Callable[[AgentRunView], Verdict | None] = lambda _: None,
    ) -> None:
        """``failing`` says whether a run's last resync step failed (it is stepped
        again); ``requeue`` sets a run's timer where its step would have (a backoff, a
        deadline)."""
        self.watched = watched
        self._config = config
        self._metrics = metrics
        self._credentials = credentials
        self._clock = clock
        self._failing = failing
        self._requeue = requeue
        self._admission = admission
        self._settled: dict[RunKey, _Settled] = {}

    def step_needed(self, run: AgentRunView, pods: Sequence[PodView], source: str) -> bool:
        """Whether a reconcile step of ``run`` would change something, judged from ``run``
        and ``pods`` as the watches last showed them.

        True when :func:`~.decide.decide` (without the saved State) acts or asks for the
        State, when the run's last resync step failed, or when its pod's store
        credentials are due. Otherwise the run's figures go to the metrics and its timer
        is set, as its step would have done. ``source`` names the caller in the
        ``alpineagents_run_checks`` metric.
        """
        needed = self._step_needed(run, pods)
        self._metrics.checks.labels(source=source, stepped=str(needed).lower()).inc()
        return needed

    def step_needed_by_key(self, key: RunKey, source: str) -> bool:
        """:meth:`step_needed` of the run as the watch shows it (True: not shown)."""
        run = self.watched.run(key) if self.watched is not None else None
        if run is None or self.watched is None:
            return True
        return self.step_needed(run, self.watched.pods_of(key), source)

    def listed_pod_needs_step(self, key: RunKey) -> bool:
        """Whether a pod of a watch's listing (not a change) calls for a step of its run
        ``key``: after a restart, 10,000 listed pods would otherwise be 10,000 steps.

        Not while the operator's own listing of the pods runs at its start (the run's
        views may lack its other pods: its resume judges it after), nor for a run the
        views do not hold (its resume or creation steps it; a run-less pod is left to
        the resync)."""
        if self.watched is None:
            return True
        run = self.watched.run(key)
        if run is None or not self.watched.pods_listed_at_start:
            return False
        return self.step_needed(run, self.watched.pods_of(key), "listing")

    def replaced_pod_ending(self, key: RunKey, pod: PodView, gone: bool) -> bool:
        """Whether ``pod`` is an earlier attempt's, already replaced, that is stopping,
        finished or gone: :func:`~.decide.decide` acts only on an earlier attempt's pod
        that still runs (it stops it). Its events (its container's exit, its deletion)
        would each cost a step that finds nothing to do, two or three for every run of a
        burst of lost pods. The run's view may lag its status, never lead it: an attempt
        the view shows is one the run has reached."""
        run = self.watched.run(key) if self.watched is not None else None
        if run is None or pod.attempt is None or pod.attempt >= run.status.attempt:
            return False
        return gone or pod.deleting or pod.finished

    def run_gone(self, key: RunKey) -> None:
        """The run was deleted: forget its last judgement."""
        self._settled.pop(key, None)

    def _step_needed(self, run: AgentRunView, pods: Sequence[PodView]) -> bool:
        key = (run.namespace, run.name)
        if self._failing(key) or self._credentials.renewal_due(run, pods):
            return True
        verdict = self._admission(run)
        settled = self._settled.get(key)
        if settled is not None and settled.same(run, pods, verdict):
            return False
        self._settled.pop(key, None)
        refusal = run_refusal(run, self._config)
        now = self._clock()
        if refusal is not None:
            decision = refused(run, run.status.attempt + 1, refusal, now)
        else:
            decision = decide(run, pods, None, now, verdict)
        if decision.acts or decision.needs_saved:
            return True
        phase = run.status.phase
        self._metrics.record_phase(*key, str(phase) if phase else None)
        self._metrics.record_run(*key, run.spec, run.status.raw)
        if decision.requeue_after is not None and decision.requeue_after > 0:
            self._requeue(*key, decision.requeue_after)
        else:
            self._settled[key] = _Settled(run, tuple(pods), verdict)
        return False


@dataclass(frozen=True)
class _Settled:
    """A run judged to need no step, with no time set to judge it again: until its view,
    its pods' views or its admission verdict change, it is judged the same. The watches
    replace a view with a new object at each event, so the same objects are the same
    run as it was judged (idle runs by the ten thousand, queued or ended, then cost a
    look-up at each resync instead of a decision each)."""

    run: AgentRunView
    pods: tuple[PodView, ...]
    verdict: Verdict | None

    def same(self, run: AgentRunView, pods: Sequence[PodView], verdict: Verdict | None) -> bool:
        return (
            run is self.run
            and len(pods) == len(self.pods)
            and all(a is b for a, b in zip(pods, self.pods, strict=True))
            and verdict == self.verdict
        )
