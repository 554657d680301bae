"""The operator end to end on the test bench: what a cluster user sees.

Real parts: etcd + kube-apiserver 1.35 (``control_plane``), the operator as its own
process (``python -m alpineagents_operator``), pods run by the stand-in kubelet
(``PodRunner``: each pod's ``python -m alpineagents run`` is a local process), MinIO as
the store (an ``s3://`` URL; credentials in a Secret), and the scripted model server in
echo mode (a prompt line ``use step {"name": "x"}`` makes it call the tool ``step``).

The agent (``tests.agents.marker_agent``) has one tool, ``step``, that leaves a marker
file each time it starts and then waits for the test to release it, so a test can
interrupt a run in the middle of a tool call and count how often the call really ran.
"""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from alpineagents import open_store
from alpineagents.testing import ModelServer
from tests.bench.control_plane import ControlPlane
from tests.bench.infra import free_port
from tests.bench.minio_server import S3Server
from tests.bench.operator_process import OperatorProcess, bench_env
from tests.bench.pod_runner import PodRunner

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parent.parent
NAMESPACE = "e2e"
DEADLINE = 60.0  # seconds any one awaited condition may take: a safety net, not a measure
JSON = dict[str, Any]


# ------------------------------------------------------------------------------ bench
class Bench:
    """The running pieces and the ways a test talks to them."""

    def __init__(
        self,
        plane: ControlPlane,
        minio: S3Server,
        model: ModelServer,
        operator: OperatorProcess,
        store_url: str,
    ) -> None:
        from kubernetes import client

        self.plane = plane
        self.minio = minio
        self.model = model
        self.operator = operator
        self.store_url = store_url
        self.api_client = plane.api_client()
        self.custom = client.CustomObjectsApi(self.api_client)
        self.core = client.CoreV1Api(self.api_client)

    # ---- AgentRuns
    def apply(self, name: str, markers: Path, namespace: str = NAMESPACE, **spec: Any) -> None:
        """``kubectl apply`` an AgentRun running the marker agent."""
        spec.setdefault("model", "claude-sonnet-5")
        spec.setdefault("agent", "tests.agents.marker_agent:make_agent")
        spec.setdefault("restartPolicy", {"initialBackoffSeconds": 0})
        spec["env"] = [{"name": "MARKER_DIR", "value": str(markers)}, *spec.get("env", [])]
        manifest = {
            "apiVersion": "alpineagents.dev/v1",
            "kind": "AgentRun",
            "metadata": {"name": name, "namespace": namespace},
            "spec": spec,
        }
        self.plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest))

    def run(self, name: str, namespace: str = NAMESPACE) -> JSON:
        body: JSON = self.custom.get_namespaced_custom_object(
            "alpineagents.dev", "v1", namespace, "agentruns", name
        )
        return body

    def wait_run(
        self, name: str, until: Callable[[JSON], bool], what: str, namespace: str = NAMESPACE
    ) -> JSON:
        """Poll the AgentRun until ``until(run)`` holds (or fail with its status)."""
        deadline = time.monotonic() + DEADLINE
        while True:
            body = self.run(name, namespace)
            if until(body):
                return body
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"AgentRun {name} never got {what}; status: {json.dumps(body.get('status'))}\n"
                    f"operator log:\n{self.operator.log_tail()}"
                )
            time.sleep(0.05)

    def wait_phase(self, name: str, phase: str, namespace: str = NAMESPACE) -> JSON:
        return self.wait_run(name, lambda r: status(r).get("phase") == phase, phase, namespace)

    def patch_spec(self, name: str, spec: JSON, namespace: str = NAMESPACE) -> None:
        self.plane.kubectl(
            "patch",
            "agentrun",
            name,
            "-n",
            namespace,
            "--type=merge",
            "-p",
            json.dumps({"spec": spec}),
        )

    # ---- pods and Events
    def pods(self, name: str, namespace: str = NAMESPACE) -> list[JSON]:
        response = self.core.list_namespaced_pod(
            namespace, label_selector=f"alpineagents.dev/run={name}", _preload_content=False
        )
        try:
            return list(json.loads(response.data)["items"])
        finally:
            response.release_conn()

    def live_pods(self, name: str, namespace: str = NAMESPACE) -> list[str]:
        return [p["metadata"]["name"] for p in self.pods(name, namespace) if alive(p)]

    def event_reasons(self, name: str, namespace: str = NAMESPACE) -> list[str]:
        listing = self.core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={name}", _preload_content=False
        )
        try:
            items = json.loads(listing.data)["items"]
        finally:
            listing.release_conn()
        items.sort(key=lambda e: (e.get("lastTimestamp") or "", e["metadata"]["creationTimestamp"]))
        return [e["reason"] for e in items if e.get("involvedObject", {}).get("kind") == "AgentRun"]

    # ---- the store
    def saved(self, state_id: str) -> Any:
        env = {
            "AWS_ACCESS_KEY_ID": self.minio.access_key,
            "AWS_SECRET_ACCESS_KEY": self.minio.secret_key,
        }
        return open_store(self.store_url, env=env).load(state_id)


def status(run: JSON) -> JSON:
    return dict(run.get("status") or {})


def alive(pod: JSON) -> bool:
    phase = (pod.get("status") or {}).get("phase")
    return phase not in ("Succeeded", "Failed")


def wait_for(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def starts(markers: Path, step: str) -> int:
    """How many times the tool call ``step`` really started, across all pods."""
    return len(list(markers.glob(f"{step}.started.*")))


def release(markers: Path, step: str) -> None:
    (markers / f"{step}.release").touch()


def use(step: str) -> str:
    return f'Do the job.\nuse step {{"name": "{step}"}}'


def make_namespace(plane: ControlPlane, namespace: str, minio: S3Server) -> None:
    plane.kubectl("create", "namespace", namespace, check=False)

    def secret(name: str, data: dict[str, str]) -> str:
        return yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": name, "namespace": namespace},
                "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
            }
        )

    plane.kubectl("apply", "-f", "-", input=secret("anthropic", {"ANTHROPIC_API_KEY": "scripted"}))
    plane.kubectl(
        "apply",
        "-f",
        "-",
        input=secret(
            "store-credentials",
            {"AWS_ACCESS_KEY_ID": minio.access_key, "AWS_SECRET_ACCESS_KEY": minio.secret_key},
        ),
    )


def pod_env() -> dict[str, str]:
    import os

    # The pods import the test agent from this checkout.
    return {"PATH": os.environ.get("PATH", os.defpath), "PYTHONPATH": str(REPO)}


# ------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def bench(control_plane: ControlPlane, minio: S3Server) -> Iterator[Bench]:
    control_plane.apply_crds()
    make_namespace(control_plane, NAMESPACE, minio)
    workdir = Path(tempfile.mkdtemp(prefix="alpineagents-e2e-"))
    store_url = (
        f"s3://{minio.bucket}/{minio.unique_prefix()}?endpoint={minio.endpoint}&secure=false"
    )
    with ModelServer(echo=True) as model, contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        operator = OperatorProcess(
            control_plane.kubeconfig,
            workdir,
            bench_env(
                store_url,
                minio,
                model.url,
                ALPINEAGENTS_IMAGE="alpineagents:e2e",
                ALPINEAGENTS_RESYNC_SECONDS="20",
            ),
        )
        stack.callback(operator.stop)
        operator.start()
        node = PodRunner(
            control_plane.api_client(),
            node_name="e2e-node",
            namespace=NAMESPACE,
            base_env=pod_env(),
        )
        node.start()
        stack.callback(node.stop)
        bench = Bench(control_plane, minio, model, operator, store_url)
        bench.node = node  # type: ignore[attr-defined]
        yield bench


@pytest.fixture
def node(bench: Bench) -> PodRunner:
    runner: PodRunner = bench.node  # type: ignore[attr-defined]
    return runner


@pytest.fixture
def markers(tmp_path: Path) -> Path:
    folder = tmp_path / "markers"
    folder.mkdir()
    return folder


def run_name() -> str:
    return f"r-{uuid.uuid4().hex[:6]}"


# ------------------------------------------------------------------------------ tests
def test_a_run_applied_with_kubectl_succeeds_with_its_answer_in_status(
    bench: Bench, markers: Path
) -> None:
    name = run_name()
    release(markers, "only")
    bench.apply(name, markers, prompt=use("only"))
    done = status(bench.wait_phase(name, "Succeeded"))
    assert done["answer"] == "step returned: only done"
    assert done["attempt"] == 1 and done.get("restarts", 0) == 0
    assert done["lastSavedSeq"] >= 4  # message, request, reply, result, request, reply...
    assert done["stateId"].startswith(f"{NAMESPACE}.{name}.")
    conditions = {c["type"]: c["status"] for c in done["conditions"]}
    assert conditions == {"Succeeded": "True", "Running": "False", "WaitingForApproval": "False"}
    assert starts(markers, "only") == 1
    assert [p["metadata"]["name"] for p in bench.pods(name)] == [f"{name}-1"]
    row = bench.plane.kubectl("get", "agentrun", name, "-n", NAMESPACE).stdout.splitlines()[1]
    assert row.split()[1:3] == ["Succeeded", "1"]
    wait_for(lambda: "Succeeded" in bench.event_reasons(name), "the Succeeded event")
    assert "PodCreated" in bench.event_reasons(name)


def test_a_pod_deleted_mid_tool_is_replaced_and_the_call_is_not_run_again(
    bench: Bench, markers: Path
) -> None:
    name = run_name()
    bench.apply(name, markers, prompt=use("slow"))
    wait_for(lambda: starts(markers, "slow") == 1, "the tool to start")
    bench.plane.kubectl("delete", "pod", f"{name}-1", "-n", NAMESPACE, "--wait=false")
    done = status(bench.wait_phase(name, "Succeeded"))
    assert done["attempt"] == 2 and done["restarts"] == 1
    # The first pod saved on SIGTERM and closed the call it was in as aborted; the second
    # resumed from there and told the model, instead of running the call again.
    assert starts(markers, "slow") == 1
    assert done["answer"].startswith("step failed: (aborted")
    state = bench.saved(done["stateId"])
    results = [e for e in state.history if e.kind == "tool_result"]
    assert [r.outcome for r in results] == ["aborted"]
    assert done["abortedCalls"] == [results[0].data["call_id"]]
    assert [e.kind for e in state.history].count("model_reply") == 2
    reasons = bench.event_reasons(name)
    assert "PodLost" in reasons and "Resumed" in reasons
    metrics = bench.operator.metrics()
    assert 'alpineagents_pod_restarts_total{reason="Terminated"}' in metrics
    assert "alpineagents_resume_latency_seconds_count" in metrics


@pytest.mark.parametrize("disruption", ["evict", "oom_kill"])
def test_a_hard_killed_pod_resumes_and_the_call_is_closed_unknown(
    bench: Bench, node: PodRunner, markers: Path, disruption: str
) -> None:
    name = run_name()
    bench.apply(name, markers, prompt=use("slow"))
    wait_for(lambda: starts(markers, "slow") == 1, "the tool to start")
    getattr(node, disruption)(NAMESPACE, f"{name}-1")  # SIGKILL: nothing saved on the way out
    done = status(bench.wait_phase(name, "Succeeded"))
    assert starts(markers, "slow") == 1
    assert done["attempt"] == 2
    assert done["answer"].startswith("step failed: (unknown:")
    assert len(done["abortedCalls"]) == 1
    lost = next(p for p in bench.pods(name) if p["metadata"]["name"] == f"{name}-1")
    expected = {"evict": "Evicted", "oom_kill": "OOMKilled"}[disruption]
    assert expected in json.dumps(lost["status"])


def test_the_operator_killed_mid_run_comes_back_without_a_second_pod(
    bench: Bench, markers: Path
) -> None:
    name = run_name()
    bench.apply(name, markers, prompt=use("slow"))
    wait_for(lambda: starts(markers, "slow") == 1, "the tool to start")
    bench.wait_phase(name, "Running")
    bench.operator.kill()
    try:
        release(markers, "slow")  # the run finishes while no operator is watching
        wait_for(lambda: not bench.live_pods(name), "the pod to finish")
    finally:
        bench.operator.start()
    done = status(bench.wait_phase(name, "Succeeded"))
    assert done["answer"] == "step returned: slow done"
    assert [p["metadata"]["name"] for p in bench.pods(name)] == [f"{name}-1"]
    assert starts(markers, "slow") == 1


def test_suspend_stops_the_pod_gracefully_and_resume_continues(bench: Bench, markers: Path) -> None:
    name = run_name()
    bench.apply(name, markers, prompt=use("slow"))
    wait_for(lambda: starts(markers, "slow") == 1, "the tool to start")
    bench.patch_spec(name, {"suspend": True})
    bench.wait_phase(name, "Suspended")
    wait_for(lambda: not bench.live_pods(name), "the pod to stop")
    # Stays suspended: no pod is started while spec.suspend is true.
    assert status(bench.run(name))["phase"] == "Suspended" and not bench.live_pods(name)
    bench.patch_spec(name, {"suspend": False})
    done = status(bench.wait_phase(name, "Succeeded"))
    assert done["attempt"] == 2
    assert done.get("restarts", 0) == 0  # a suspension is not a loss
    assert starts(markers, "slow") == 1
    assert "Suspended" in bench.event_reasons(name)


def test_an_approval_round_trip_through_spec_approvals(bench: Bench, markers: Path) -> None:
    name = run_name()
    release(markers, "deploy")
    bench.apply(name, markers, prompt=use("deploy"), requireApproval=["step"])
    waiting = status(bench.wait_phase(name, "WaitingForApproval"))
    [pending] = waiting["pendingApprovals"]
    assert pending["name"] == "step" and pending["input"] == {"name": "deploy"}
    wait_for(lambda: not bench.live_pods(name), "the pod to exit")
    assert starts(markers, "deploy") == 0  # nothing ran without the person's answer
    bench.plane.kubectl(
        "patch",
        "agentrun",
        name,
        "-n",
        NAMESPACE,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"approvals": [{"callId": pending["callId"], "allow": True}]}}),
    )
    done = status(bench.wait_phase(name, "Succeeded"))
    assert done["answer"] == "step returned: deploy done"
    assert starts(markers, "deploy") == 1
    assert "pendingApprovals" not in done


def test_a_malformed_agentrun_is_refused_or_fails_with_a_clear_message(
    bench: Bench, markers: Path
) -> None:
    refused = bench.plane.kubectl(
        "apply",
        "-f",
        "-",
        check=False,
        input=yaml.safe_dump(
            {
                "apiVersion": "alpineagents.dev/v1",
                "kind": "AgentRun",
                "metadata": {"name": run_name(), "namespace": NAMESPACE},
                "spec": {"prompt": "hi", "maxTurns": -1},
            }
        ),
    )
    assert refused.returncode != 0
    assert "spec.model: Required value" in refused.stderr
    assert "spec.maxTurns" in refused.stderr
    name = run_name()
    bench.apply(name, markers, prompt="hi", agent="tests.agents.no_such_agent:make_agent")
    failed = status(bench.wait_phase(name, "Failed"))
    assert failed["reason"] == "NotRetryable"
    assert "cannot import 'tests.agents.no_such_agent'" in failed["message"]
    assert failed["attempt"] == 1  # not retried
    # The schema leaves resources opaque; the pod's own validation refuses a bad one.
    name = run_name()
    bench.apply(name, markers, prompt="hi", resources={"limits": {"memory": "lots"}})
    failed = status(bench.wait_phase(name, "Failed"))
    assert failed["reason"] == "PodInvalid"
    assert "quantities must match" in failed["message"]
    assert not bench.pods(name)


def test_an_exhausted_restart_budget_ends_failed(bench: Bench, markers: Path) -> None:
    name = run_name()
    closed = free_port()  # nothing listens: every pod finds the store unavailable
    bench.apply(
        name,
        markers,
        prompt="hi",
        store=f"s3://runs/x?endpoint=127.0.0.1:{closed}&secure=false&timeout=1&retry_budget=1",
        restartPolicy={"maxRestarts": 1, "initialBackoffSeconds": 0},
    )
    failed = status(bench.wait_phase(name, "Failed"))
    assert failed["reason"] == "RestartLimitExceeded"
    assert failed["restarts"] == 2 and failed["attempt"] == 2
    assert "store unavailable" in failed["message"]
    assert "maxRestarts=1" in failed["message"]


def test_deleting_an_agentrun_with_ondelete_delete_removes_its_state(
    bench: Bench, markers: Path
) -> None:
    name = run_name()
    release(markers, "x")
    bench.apply(name, markers, prompt=use("x"), onDelete="Delete")
    state_id = status(bench.wait_phase(name, "Succeeded"))["stateId"]
    assert bench.saved(state_id).answer == "step returned: x done"
    bench.plane.kubectl("delete", "agentrun", name, "-n", NAMESPACE, "--timeout=60s")
    with pytest.raises(LookupError):
        bench.saved(state_id)


def test_deleting_a_running_agentrun_stops_its_pod_and_keeps_its_state(
    bench: Bench, markers: Path
) -> None:
    name = run_name()
    bench.apply(name, markers, prompt=use("slow"))
    wait_for(lambda: starts(markers, "slow") == 1, "the tool to start")
    state_id = status(bench.wait_phase(name, "Running"))["stateId"]
    bench.plane.kubectl("delete", "agentrun", name, "-n", NAMESPACE, "--timeout=60s")
    # No garbage collector runs on the bench: the operator itself stops the orphan.
    wait_for(lambda: not bench.live_pods(name), "the pod to stop")
    kept = bench.saved(state_id)  # onDelete: Keep (the default)
    assert [e.outcome for e in kept.history if e.kind == "tool_result"] == ["aborted"]


def test_a_run_whose_node_is_lost_resumes_on_another_node(
    bench: Bench, minio: S3Server, markers: Path
) -> None:
    namespace = "e2e-node-loss"
    make_namespace(bench.plane, namespace, minio)
    first = PodRunner(
        bench.plane.api_client(), node_name="e2e-doomed", namespace=namespace, base_env=pod_env()
    )
    second = PodRunner(
        bench.plane.api_client(), node_name="e2e-spare", namespace=namespace, base_env=pod_env()
    )
    first.start()
    try:
        name = run_name()
        bench.apply(name, markers, namespace=namespace, prompt=use("slow"))
        wait_for(lambda: starts(markers, "slow") == 1, "the tool to start")
        first.declare_node_gone()  # dies; the control plane gives its pods up
        second.start()
        done = status(bench.wait_phase(name, "Succeeded", namespace))
        assert done["attempt"] == 2
        assert starts(markers, "slow") == 1
        assert done["answer"].startswith("step failed: (unknown:")
        [replacement] = bench.pods(name, namespace)
        assert replacement["spec"]["nodeName"] == "e2e-spare"
    finally:
        first.stop()
        second.stop()
