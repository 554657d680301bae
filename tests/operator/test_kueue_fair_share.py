"""Two teams sharing Kueue's quota fairly: the real Kueue controller (built from its Go
module, admission fair sharing on) and the operator as its own process on the bench's
kube-apiserver, without a node (:class:`~tests.bench.kueue_fair_share.PodEnds` ends each
pod a while after it is created, as its kubelet would when the runner answers).

Two namespaces, each with its LocalQueue on one ClusterQueue whose quota is five runs'
CPU, shared by usage (:func:`~tests.bench.kueue_fair_share.queue_objects` says why not
a cohort of two ClusterQueues); the same number of runs in each, all applied before
the operator starts. Every run succeeds, each team holds half of the quota (within
10 %) while both have runs waiting, five run at once, and no pod is ever created before
its run's Workload was admitted (every pod creation and every admission recorded by
watches, ordered by the one etcd's revisions).

About 40 s for the issue's 20 runs a team, most of it the runs taking their turns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.bench.control_plane import ControlPlane
from tests.bench.kueue_controller import Kueue
from tests.bench.kueue_fair_share import (
    PodEnds,
    created,
    judge,
    queued_run,
    teams_on_one_queue,
    wait_sampled,
)
from tests.bench.operator_process import Event, EventLog, OperatorProcess

RUNS = 20
"""Runs a team: the issue's size. Fewer leave the split to the first turns of the
quota, before Kueue's first usage sample (every 10 s here) evens them out."""
AT_ONCE = 5
"""Runs the quota holds at once."""
HOLD = 2.0
"""Seconds a pod runs, on average."""


def succeeded(run: str) -> Callable[[Event], bool]:
    return lambda event: (
        event.name == run and (event.object.get("status") or {}).get("phase") == "Succeeded"
    )


@pytest.fixture
def two_teams(
    control_plane: ControlPlane, kueue: Kueue, tmp_path: Path
) -> Iterator[tuple[list[str], OperatorProcess]]:
    """Two namespaces with their LocalQueues on one ClusterQueue, and an operator (not
    started) watching both."""
    with teams_on_one_queue(control_plane, tmp_path, "share", AT_ONCE) as teams:
        yield teams


def test_two_teams_share_the_quota_evenly_and_no_pod_comes_before_admission(
    control_plane: ControlPlane, two_teams: tuple[list[str], OperatorProcess]
) -> None:
    plane = control_plane
    namespaces, operator = two_teams
    client = plane.api_client()
    with ExitStack() as stack:
        pods = {n: stack.enter_context(EventLog(client, n, "pods")) for n in namespaces}
        workloads = {n: stack.enter_context(EventLog(client, n, "workloads")) for n in namespaces}
        runs = {n: stack.enter_context(EventLog(client, n, "agentruns")) for n in namespaces}
        wait_sampled(plane, namespaces)
        names = [f"run-{i:02d}" for i in range(RUNS)]
        created(plane, *(queued_run(n, name) for name in names for n in namespaces))
        with PodEnds(client, list(pods.values()), HOLD) as ends:
            operator.start()
            for namespace in namespaces:
                for name in names:
                    runs[namespace].wait_for(succeeded(name))
        assert not ends.failures, ends.failures

        verdict = judge(pods, workloads)
    first, second = namespaces
    assert verdict.pods_before_admission == [], verdict.pods_before_admission
    assert verdict.admitted == {first: RUNS, second: RUNS}, verdict.admitted
    assert verdict.most_at_once == AT_ONCE, verdict
    ratio = verdict.share_ratio(first, second)
    assert 0.9 <= ratio <= 1 / 0.9, verdict
