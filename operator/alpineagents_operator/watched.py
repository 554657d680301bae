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
"""

from __future__ import annotations

from .views import AgentRunView, PodView

RunKey = tuple[str, str]


class Watched:
    """The views, changed only from the event loop (no locks)."""

    def __init__(self) -> None:
        self._runs: dict[RunKey, AgentRunView] = {}
        self._pods: dict[RunKey, dict[str, PodView]] = {}

    def run_seen(self, run: AgentRunView, *, gone: bool) -> None:
        key = (run.namespace, run.name)
        if gone:
            self._runs.pop(key, None)
        else:
            self._runs[key] = run

    def pod_seen(self, key: RunKey, pod: PodView, *, gone: bool) -> None:
        pods = self._pods.setdefault(key, {})
        if gone:
            pods.pop(pod.name, None)
            if not pods:
                del self._pods[key]
        else:
            pods[pod.name] = pod

    def run(self, key: RunKey) -> AgentRunView | None:
        return self._runs.get(key)

    def all_runs(self) -> list[AgentRunView]:
        """Every AgentRun as last seen, taken at once (the views change between awaits)."""
        return list(self._runs.values())

    def pods_of(self, key: RunKey) -> list[PodView]:
        """The pods labelled with run ``key``'s name, as last seen."""
        return list(self._pods.get(key, {}).values())
