"""What the operator's two watches last delivered: every AgentRun and every run pod.

kopf's event handlers (see :mod:`.handlers`) put each AgentRun here by (namespace, name)
and each pod under the run its ``alpineagents.dev/run`` label names, as small views.

A reconcile step still reads its run and its pods from the API server (a step looks at
what is, including the pod it created a moment ago). These views only tell the resync
which runs a step would change nothing for, so those are skipped without a request: an
idle operator then costs no API requests per run. A view missing or a moment old can
only make a run look as if it needed a step, which then reads afresh and finds nothing.

Not ``@kopf.index``: kopf holds every handler back until each listed object is indexed,
through one toggle per object that every waiting worker re-checks at each change, which
took over half an hour to start with 10,000 runs and their pods (kopf 1.45).

When the operator starts, the pods of its own paged listing (:mod:`.resumes`) come in
too, each only where the watch has shown nothing newer.
"""

from __future__ import annotations

from collections.abc import Iterable

from alpineagents_operator.kube.views import AgentRunView, PodView

RunKey = tuple[str, str]


class Watched:
    """The views, changed only from the event loop (no locks)."""

    def __init__(self) -> None:
        self._runs: dict[RunKey, AgentRunView] = {}
        self._pods: dict[RunKey, dict[str, PodView]] = {}
        self.pods_listed_at_start = False
        """Every pod that existed when the operator started is here (or was seen gone)."""
        self._gone_while_listing: set[str] = set()
        """Uids of pods the watch saw deleted while the operator's own listing ran."""

    def run_seen(self, run: AgentRunView, *, gone: bool) -> None:
        key = (run.namespace, run.name)
        if gone:
            self._runs.pop(key, None)
        else:
            self._runs[key] = run

    def pod_seen(self, key: RunKey, pod: PodView, *, gone: bool) -> None:
        pods = self._pods.setdefault(key, {})
        if gone:
            if not self.pods_listed_at_start and pod.uid:
                self._gone_while_listing.add(pod.uid)
            pods.pop(pod.name, None)
            if not pods:
                del self._pods[key]
        else:
            pods[pod.name] = pod

    def pods_listed(self, pods: Iterable[tuple[RunKey, PodView]]) -> None:
        """A page of the operator's own listing of the run pods: each pod is added unless
        the watch has shown it already (that view stands: the watch's next event brings
        whatever changed since) or seen it deleted."""
        for key, pod in pods:
            if pod.uid not in self._gone_while_listing:
                self._pods.setdefault(key, {}).setdefault(pod.name, pod)

    def listing_done(self) -> None:
        """The operator's own listing of the run pods is over (or failed)."""
        self.pods_listed_at_start = True
        self._gone_while_listing.clear()

    def run(self, key: RunKey) -> AgentRunView | None:
        return self._runs.get(key)

    def all_runs(self) -> list[AgentRunView]:
        """Every AgentRun as last seen, taken at once (the views change between awaits)."""
        return list(self._runs.values())

    def runless_pods(self) -> list[RunKey]:
        """Runs that have pods in the views but no AgentRun (deleted while nobody watched,
        on a cluster without a garbage collector, or not shown yet)."""
        return [key for key in self._pods if key not in self._runs]

    def pods_of(self, key: RunKey) -> list[PodView]:
        """The pods labelled with run ``key``'s name, as last seen."""
        return list(self._pods.get(key, {}).values())
