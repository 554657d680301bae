"""Runs created while the operator runs, their pods Pending: once each has its pod, an
idle operator makes no request for any of them, however long the pods stay Pending.

Real parts: the bench's kube-apiserver with no node and no scheduler, so each pod stays
Pending without a ``PodScheduled`` condition, as on a cluster that is full (one pod here
is marked Unschedulable, as a scheduler does when no node fits it). The
:class:`Reconciler` runs in this process and is driven as kopf's handlers drive it: a
run's creation and each pod event ask for a step (:meth:`Reconciler.reconcile_soon`,
:meth:`Reconciler.pod_event`), and what the watches would deliver goes into its views.
Its API calls are counted on the :class:`Cluster` it is given.

At 10,000 runs created live, the resync stepped a quarter of them every 90 s though
nothing changed (``benchmarks/results/operator_runs.md``): a step per run is two requests.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from alpineagents_operator.kube.cluster import Cluster
from alpineagents_operator.kube.config import OperatorConfig
from alpineagents_operator.kube.views import RUN_LABEL
from alpineagents_operator.reconciling.reconciler import Reconciler
from alpineagents_operator.watching.watched import Watched
from tests.bench.control_plane import ControlPlane
from tests.operator.test_reconciler_faults import Kube, status

JSON = dict[str, Any]
RUNS = 40


class CountedCluster(Cluster):
    """A :class:`Cluster` that counts every call the reconciler makes through it."""

    def __init__(self, api_client: Any) -> None:
        super().__init__(api_client)
        self.calls: Counter[str] = Counter()

    def __getattribute__(self, name: str) -> Any:
        found = super().__getattribute__(name)
        if name.startswith("_") or name in ("calls", "close") or not callable(found):
            return found
        calls: Counter[str] = super().__getattribute__("calls")

        def counted(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return found(*args, **kwargs)

        return counted


class Clock:
    """The reconciler's clock, moved on by the test (the pods stay Pending that long)."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def cluster(control_plane: ControlPlane) -> Kube:
    """A namespace of its own: the resync sees this test's runs only."""
    control_plane.apply_crds()
    namespace = f"live-{uuid.uuid4().hex[:6]}"
    control_plane.kubectl("create", "namespace", namespace)
    return Kube(control_plane, namespace)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def reconciler(cluster: Kube, tmp_path: Path, clock: Clock) -> Iterator[Reconciler]:
    store = tmp_path / "runs"
    store.mkdir()
    config = OperatorConfig(
        namespaces=(cluster.namespace,),
        store=store.as_uri(),
        image="alpineagents:live",
        run_credentials="shared",  # a FileStore: no credentials of a run's own
    )
    calls = CountedCluster(cluster.plane.api_client())
    reconciler = Reconciler(config, calls, clock=clock, watched=Watched())
    try:
        yield reconciler
    finally:
        reconciler.close()


def calls_of(reconciler: Reconciler) -> Counter[str]:
    cluster = reconciler.cluster
    assert isinstance(cluster, CountedCluster)
    return Counter(cluster.calls)


def pods_of(cluster: Kube) -> list[JSON]:
    listing = cluster.core.list_namespaced_pod(cluster.namespace, label_selector=RUN_LABEL)
    return [cluster.core.api_client.sanitize_for_serialization(p) for p in listing.items]


def watches_deliver(cluster: Kube, reconciler: Reconciler, names: list[str]) -> None:
    """What the two watches deliver once the operator's writes are in: every run as its
    status now is, every pod as it now is (a pod's event asks for its run's step)."""
    for name in names:
        reconciler.run_seen(cluster.run(name), gone=False)
    for pod in pods_of(cluster):
        run = pod["metadata"]["labels"][RUN_LABEL]
        reconciler.pod_event(cluster.namespace, run, pod, gone=False)


async def idle_round(reconciler: Reconciler) -> Counter[str]:
    """The calls of one resync round and of any step it asked for."""
    before = calls_of(reconciler)
    await reconciler.resync()
    await reconciler.steps_taken()
    return calls_of(reconciler) - before


async def test_an_idle_operator_over_pending_run_pods_makes_no_request_per_run_in_a_resync(
    cluster: Kube, reconciler: Reconciler, clock: Clock
) -> None:
    names = [f"live-{n:02d}" for n in range(RUNS)]
    for name in names:  # created while the operator runs: kopf's create handler
        cluster.create_run(name)
        reconciler.run_seen(cluster.run(name), gone=False)
        reconciler.reconcile_soon(cluster.namespace, name)
    await reconciler.steps_taken()
    assert len(pods_of(cluster)) == RUNS
    # Each pod's ADDED, its run's status as the watch shows it: no step, no request
    # (a step for each would read the run and list its pods, and find nothing to do).
    before = calls_of(reconciler)
    watches_deliver(cluster, reconciler, names)
    await reconciler.steps_taken()
    assert calls_of(reconciler) == before, calls_of(reconciler) - before

    # One pod is marked Unschedulable, as a scheduler does when no node fits: one step
    # puts the reason in its run's status, and that is all it ever needs.
    unschedulable = f"{names[0]}-1"
    cluster.core.patch_namespaced_pod_status(
        unschedulable,
        cluster.namespace,
        {
            "status": {
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "0/0 nodes are available",
                    }
                ]
            }
        },
    )
    watches_deliver(cluster, reconciler, names)
    await reconciler.steps_taken()
    assert status(cluster.run(names[0]))["reason"] == "Unschedulable"
    watches_deliver(cluster, reconciler, names)  # its run's status as the watch shows it
    await reconciler.steps_taken()

    # Idle: resync rounds now, an hour on and a day on (pods Pending that long).
    rounds: dict[str, Counter[str]] = {"now": await idle_round(reconciler)}
    clock.now += timedelta(hours=1)
    rounds["an hour on"] = await idle_round(reconciler)
    clock.now += timedelta(days=1)
    rounds["a day on"] = await idle_round(reconciler)
    assert all(not calls for calls in rounds.values()), rounds
    checks = reconciler.metrics.registry.get_sample_value(
        "alpineagents_run_checks_total", {"source": "resync", "stepped": "false"}
    )
    assert checks == 3 * RUNS, checks  # each run looked at in each round, none stepped
    phases = {status(cluster.run(name))["phase"] for name in names}
    assert phases == {"Pending"}, phases


async def test_a_kopf_handler_returns_before_its_step_and_its_step_is_taken_once(
    cluster: Kube, reconciler: Reconciler
) -> None:
    # A handler that awaited its step held its object's body in kopf's worker until the
    # step was done: thousands of new runs held side by side. Now it only asks.
    alone, asked = (f"{kind}-{uuid.uuid4().hex[:6]}" for kind in ("alone", "asked"))
    cluster.create_run(alone)
    await reconciler.reconcile(cluster.namespace, alone)
    one_call = calls_of(reconciler)
    cluster.create_run(asked)
    for _ in range(5):  # its creation and events after it, before a step worker starts
        reconciler.reconcile_soon(cluster.namespace, asked)
    assert cluster.pod_names(asked) == []
    await reconciler.steps_taken()
    assert cluster.pod_names(asked) == [f"{asked}-1"]
    assert calls_of(reconciler) - one_call == one_call  # what one reconcile call costs
