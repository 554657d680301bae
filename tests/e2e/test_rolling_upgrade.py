"""``helm upgrade`` to a new operator and runner image while runs are going: no run is
lost, no tool call runs twice, and every run ends on the old image or the new one, which
its status says (``status.runnerVersion``, ``status.runnerImage``).

The two images (:mod:`tests.bench.images`): ours, version 0.1.0 (the project's), and
``upgrade``, the same image with the version bumped to
:data:`~tests.bench.images.UPGRADE_VERSION` (``ALPINEAGENTS_VERSION`` and its label).
The upgrade replaces the operator's pod (a rolling update: the new pod starts, the old one
hands over) and the image new pods get; pods already running keep theirs. So:

- runs whose pod runs on through the upgrade end on 0.1.0;
- runs whose pod is deleted after it resume in a pod of the new image, from the State the
  0.1.0 runner saved: a State written by runner 0.1.0 loads in runner
  0.1.1-upgrade (both write State format 5, ``alpineagents.state.FORMAT_VERSION``), its
  history kept entry for entry.

Each run holds its one tool call in the bench's :class:`~tests.bench.tool_gate.ToolGate`
until the test lets it go. Suite scale: four runs (``benchmarks/rolling_upgrade.py`` runs
this test with 20); the release is upgraded back to the first image at the end.
"""

from __future__ import annotations

import json
import os
import tomllib
import uuid

import pytest

from tests.bench.helm import Helm
from tests.bench.images import UPGRADE_VERSION
from tests.bench.tool_gate import ToolGate
from tests.e2e.environment import (
    CLOSED_ON_STOP,
    JSON,
    OPERATOR_VALUES,
    RELEASE,
    Environment,
    apply_run,
    gated,
    run_pods,
    wait_phase,
)
from tests.paths import REPO

pytestmark = pytest.mark.e2e
RUNS = int(os.environ.get("ALPINEAGENTS_UPGRADE_RUNS", "4"))
"""Runs held through the upgrade; half run on through it, half are resumed after it."""
SMALL = {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "512Mi"}}
"""Each run's resources: 20 runs of the chart's default request (100m CPU) do not fit on
the bench's 2-CPU node, and the ones left Pending never reach their call."""
OLD_VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def upgrade_to(env: Environment, helm: Helm, image: str) -> None:
    """``helm upgrade --wait`` of the e2e release to ``image`` (repository:tag), its other
    values as installed."""
    repository, _, tag = image.rpartition(":")
    values = {
        **env.values,
        "image": {**env.values["image"], "repository": repository, "tag": tag},
        "operator": OPERATOR_VALUES,
    }
    helm.upgrade(RELEASE, env.namespace, env.kubeconfig, values, "--wait", "--timeout=5m")
    # helm's --wait is content once the new pod is ready; the rollout ends when the old
    # one is gone too.
    env.kubectl("rollout", "status", f"deployment/{env.operator}", "--timeout=180s", timeout=200)


def operator_images(env: Environment) -> set[str]:
    """Images of the operator's running pods."""
    pods = env.kubectl(
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/component=operator",
        "--field-selector=status.phase=Running",
        "-o",
        "json",
    )
    return {
        c["image"]
        for p in json.loads(pods.stdout)["items"]
        if not p["metadata"].get("deletionTimestamp")
        for c in p["spec"]["containers"]
    }


def test_a_helm_upgrade_under_load_loses_no_run_and_reruns_no_call(
    node_env: Environment, gate: ToolGate, helm: Helm
) -> None:
    cluster = node_env.real_node
    old, new = cluster.images["alpineagents"].ref, cluster.images["upgrade"].ref
    cluster.load_image(cluster.images["upgrade"])
    stay = [f"up-stay-{uuid.uuid4().hex[:6]}" for _ in range(RUNS // 2)]
    moved = [f"up-move-{uuid.uuid4().hex[:6]}" for _ in range(RUNS - RUNS // 2)]
    for name in stay + moved:
        apply_run(node_env, name, gated(gate, name), resources=SMALL)
    for name in stay + moved:
        try:
            gate.wait_started(name, timeout=600)
        except AssertionError as error:
            pods = node_env.kubectl("get", "pods", "-o", "wide").stdout
            raise AssertionError(f"{error}\n{pods}\n{node_env.diagnostics()}") from None
    saved_by_old: dict[str, list[JSON]] = {}
    for name in moved:
        state_id = wait_phase(node_env, name, "Running")["stateId"]
        saved_by_old[name] = node_env.history(state_id) or []
        assert saved_by_old[name], f"{name}: nothing saved before the upgrade"

    try:
        upgrade_to(node_env, helm, new)
        assert operator_images(node_env) == {new}
        # The runs' pods are the operator's own, not the Deployment's: they run on, as
        # they were, through the upgrade.
        for name in stay + moved:
            [pod] = run_pods(node_env, name)
            assert pod["spec"]["containers"][0]["image"] == old
            assert pod["status"]["phase"] == "Running", pod["status"]
        for name in stay:
            gate.release(name)
        for name in moved:
            node_env.kubectl("delete", "pod", f"{name}-1", "--wait=false")

        for name in stay:
            done = wait_phase(node_env, name, "Succeeded")
            assert done["attempt"] == 1 and done.get("restarts", 0) == 0, done
            assert done["answer"].startswith("shell returned: exit code 0"), done["answer"]
            assert (done["runnerVersion"], done["runnerImage"]) == (OLD_VERSION, old)
            assert gate.starts(name) == 1
        for name in moved:
            done = wait_phase(node_env, name, "Succeeded")
            assert done["attempt"] == 2 and done["disruptions"] == 1, done
            # Runner 0.1.1-upgrade loaded the State runner 0.1.0 saved, closed the call
            # that pod was in as aborted (SIGTERM) and did not run it again.
            assert (done["runnerVersion"], done["runnerImage"]) == (UPGRADE_VERSION, new)
            assert done["answer"].startswith(CLOSED_ON_STOP), done["answer"]
            assert gate.starts(name) == 1
            history = node_env.history(done["stateId"]) or []
            assert history[: len(saved_by_old[name])] == saved_by_old[name]
            kinds = [e["kind"] for e in history]
            assert kinds.count("message") == 1 and kinds.count("model_reply") == 2
    finally:
        upgrade_to(node_env, helm, old)
