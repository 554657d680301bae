"""What the operator's two watches last delivered: every AgentRun and every run pod.

kopf fills both from its watches through ``@kopf.index`` handlers (see :mod:`.handlers`):
an AgentRun by (namespace, name), each pod under the run its ``alpineagents.dev/run``
label names. kopf holds every other handler back until both kinds were listed once, so
after a (re)start each run's pods are all known before its first step.

A reconcile step still reads its run and its pods from the API server (a step looks at
what is, including the pod it created a moment ago). These views only tell the resync
and the resume after a restart which runs a step would change nothing for, so those are
skipped without a request: an idle operator then costs no API requests per run.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from .views import AgentRunView, PodView

RunKey = tuple[str, str]


@dataclass(frozen=True)
class Watched:
    """Live views of kopf's two indexes (they change as events arrive)."""

    runs: Mapping[RunKey, Collection[AgentRunView]]
    pods: Mapping[RunKey, Collection[PodView]]

    def all_runs(self) -> list[AgentRunView]:
        """Every AgentRun as last seen, taken at once (the index changes between awaits)."""
        return [run for views in list(self.runs.values()) for run in list(views)]

    def pods_of(self, key: RunKey) -> list[PodView]:
        """The pods labelled with run ``key``'s name, as last seen."""
        return list(self.pods.get(key, ()))
