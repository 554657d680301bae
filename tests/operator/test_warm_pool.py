"""The warm pool (chart ``runs.warmPool``): standby runner pods that take a lost run.

Plain parts first (which pods the pool starts and removes, which runs may use it, what
``decide`` does with a run handed to a standby), then the bench: the real kube-apiserver
(no kubelet: the test writes the pods' status as a kubelet would), MinIO with per-run
credentials from its STS, the scripted model server, and the standby's runner as a real
child process, given its Secret's credentials as files as a mounted Secret would.

- A run that lost its pod resumes in a waiting standby: the operator claims the State,
  hands the run over through the store, and the lost pod, still writing, is fenced off
  (one writer). A new standby starts behind it.
- A standby that runs a stale assignment (the operator stopped between writing it and
  recording it) is fenced off by the hand-over to another: its next save is refused,
  and the run's history has the other's answer and nothing more of it.
- A standby that dies is replaced, and what it had (pod, Secret, store folder,
  credentials) is gone.
- ``warmPool: 0`` leaves no standby, no store folder and no credentials behind.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from alpineagents import StateFencedError, open_store
from alpineagents.pod_contract import STANDBY_LABEL, Assignment, standby_prefix
from alpineagents.store.s3.standby_boxes import StandbyBoxes
from alpineagents.testing import ModelServer, reply, tool_use
from alpineagents_operator.credentials.run_credentials import StsAccess, mint_run_credentials
from alpineagents_operator.deciding.decide import decide
from alpineagents_operator.kube.cluster import Cluster
from alpineagents_operator.kube.config import OperatorConfig
from alpineagents_operator.kube.pods import standby_manifest
from alpineagents_operator.kube.views import (
    ATTEMPT_LABEL,
    AgentRunView,
    Phase,
    PodView,
    format_time,
    is_standby_pod,
)
from alpineagents_operator.reconciling.reconciler import Reconciler
from alpineagents_operator.warm_pool.standby_pool import (
    StandbyPool,
    StandbyView,
    pool_misfit,
    pool_moves,
)
from tests.bench.control_plane import ControlPlane
from tests.bench.minio_server import S3Server
from tests.bench.runner_process import (
    BLOCKING,
    DEADLINE,
    RunnerProcess,
    child_env,
    wait_for_file,
)
from tests.operator.test_reconciler_faults import Kube as RunsKube
from tests.operator.test_reconciler_faults import interrupted_run as interrupted_in
from tests.operator.test_reconciler_faults import status

JSON = dict[str, Any]
GROUP, VERSION, PLURAL = "alpineagents.dev", "v1", "agentruns"
STANDBY = "alpineagents-standby-0123456789"
NOW = datetime(2026, 12, 5, 9, 0, tzinfo=UTC)
S3 = "s3://runs/pool?endpoint=127.0.0.1:9000&secure=false"


# ------------------------------------------------------------------------------ plain parts
def standby(
    name: str, *, waiting: bool = True, ready: bool = True, gone: bool = False
) -> StandbyView:
    return StandbyView(name=name, uid=f"uid-{name}", waiting=waiting, ready=ready, gone=gone)


def test_the_pool_replaces_dead_standbys_and_leaves_handed_ones_alone() -> None:
    moves = pool_moves(
        [standby("a"), standby("b", gone=True), standby("c", waiting=False, gone=True)], 2
    )
    assert moves.start == 1 and [s.name for s in moves.remove] == ["b"]
    assert pool_moves([standby("a"), standby("b")], 2).start == 0


def test_a_smaller_pool_removes_surplus_standbys_and_zero_removes_every_waiting_one() -> None:
    assert [s.name for s in pool_moves([standby("a"), standby("b")], 1).remove] == ["b"]
    emptied = pool_moves([standby("a"), standby("b", gone=True), standby("c", waiting=False)], 0)
    assert emptied.start == 0 and [s.name for s in emptied.remove] == ["b", "a"]


def run_view(**spec: Any) -> AgentRunView:
    return AgentRunView.from_body(
        {
            "metadata": {"name": "job", "namespace": "team", "uid": "0123456789abcdef"},
            "spec": {"model": "claude-sonnet-5", "prompt": "hi", **spec},
        }
    )


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ({"env": [{"name": "X", "value": "1"}]}, "spec.env"),
        ({"resources": {"limits": {"memory": "2Gi"}}}, "spec.resources"),
        ({"serviceAccountName": "bot"}, "spec.serviceAccountName"),
        ({"tolerations": [{"operator": "Exists"}]}, "spec.tolerations"),
        ({"image": "other:1"}, "spec.image"),
        ({"store": "s3://elsewhere/x"}, "spec.store"),
        (
            {
                "mcpServers": [
                    {
                        "name": "gh",
                        "url": "https://mcp.example",
                        "headers": [{"name": "A", "secretKeyRef": {"name": "s", "key": "k"}}],
                    }
                ]
            },
            "MCP",
        ),
    ],
)
def test_only_runs_whose_pod_would_be_the_pools_use_it(spec: JSON, why: str) -> None:
    config = OperatorConfig(store=S3, image="alpineagents:pool", warm_pool=1)
    assert pool_misfit(run_view(), config) is None
    assert pool_misfit(run_view(image="alpineagents:pool", store=S3), config) is None
    misfit = pool_misfit(run_view(**spec), config)
    assert misfit is not None and why in misfit
    assert pool_misfit(run_view(), replace(config, warm_pool=0)) is not None
    assert pool_misfit(run_view(), replace(config, store="file:///runs")) is not None


def handed_run(phase: Phase = Phase.PENDING) -> AgentRunView:
    body = {
        "metadata": {"name": "job", "namespace": "team", "uid": "0123456789abcdef"},
        "spec": {"model": "claude-sonnet-5", "prompt": "hi"},
        "status": {"phase": str(phase), "attempt": 2, "pod": STANDBY, "restarts": 1},
    }
    return AgentRunView.from_body(body)


def handed_pod(**fields: Any) -> PodView:
    return PodView(name=STANDBY, owner_uid="0123456789abcdef", attempt=2, **fields)


def test_decide_follows_status_pod_to_the_standby_it_handed_the_run_to() -> None:
    run = handed_run()
    running = decide(run, [handed_pod(phase="Running", running=True)], None, NOW)
    assert running.status["phase"] == "Running" and running.create_pod is None
    # The lost first pod, still alive, is a second writer: it is stopped.
    old = PodView(name="job-1", owner_uid=run.uid, attempt=1, phase="Running", running=True)
    assert decide(run, [old, handed_pod(phase="Running", running=True)], None, NOW).delete_pods == (
        "job-1",
    )


def test_a_handed_standby_that_is_gone_is_a_lost_pod_not_one_to_recreate() -> None:
    gone = decide(handed_run(Phase.RUNNING), [], None, NOW)
    assert gone.needs_saved and gone.create_pod is None  # lost: the saved State decides


def test_a_handed_standby_that_exits_ends_the_run_as_a_pod_would() -> None:
    from alpineagents_operator.kube.views import ContainerExit

    pod = handed_pod(phase="Succeeded", exit=ContainerExit(code=0))
    finished = decide(handed_run(Phase.RUNNING), [pod], None, NOW)
    assert finished.needs_saved  # after attempt 1 the saved State's facts are read


def test_a_standby_handed_the_run_before_its_status_said_so_is_adopted() -> None:
    run = AgentRunView.from_body(
        {
            "metadata": {"name": "job", "namespace": "team", "uid": "0123456789abcdef"},
            "spec": {"model": "claude-sonnet-5", "prompt": "hi"},
            "status": {"phase": "Interrupted", "attempt": 1, "pod": "job-1", "restarts": 1},
        }
    )
    adopted = decide(run, [handed_pod(phase="Running", running=True)], None, NOW)
    assert adopted.status["pod"] == STANDBY and adopted.status["attempt"] == 2


def test_the_standby_pod_is_a_run_pod_without_a_run() -> None:
    config = OperatorConfig(store=S3, image="alpineagents:pool", warm_pool=1)
    pod = standby_manifest("team", STANDBY, config)
    assert is_standby_pod(STANDBY) and not is_standby_pod("job-2")
    labels = pod["metadata"]["labels"]
    assert labels[STANDBY_LABEL] == "true"
    # The run pods' NetworkPolicy selects it: nothing may connect to it either.
    assert labels["app.kubernetes.io/component"] == "agent-run"
    assert pod["spec"]["automountServiceAccountToken"] is False
    [container] = pod["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["ALPINEAGENTS_STANDBY_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"
    assert "ALPINEAGENTS_STATE_ID" not in env and "ALPINEAGENTS_SPEC_FILE" not in env
    secrets = [v["secret"]["secretName"] for v in pod["spec"]["volumes"] if "secret" in v]
    assert secrets == [f"{STANDBY}-store-credentials"]  # its own, no run's spec
    # Its doorbell: its own labels, which the hand-over changes, as a file the kubelet keeps.
    [labels] = [v for v in pod["spec"]["volumes"] if "downwardAPI" in v]
    [item] = labels["downwardAPI"]["items"]
    assert item["fieldRef"]["fieldPath"] == "metadata.labels"
    [mount] = [m for m in container["volumeMounts"] if m["name"] == labels["name"]]
    doorbell = env["ALPINEAGENTS_STANDBY_DOORBELL"]["value"]
    assert doorbell == f"{mount['mountPath']}/{item['path']}" and mount["readOnly"]


def test_an_assignment_reads_back_as_written_and_nothing_else_passes() -> None:
    assignment = Assignment("team", "job", {"prompt": "hi"}, "team.job.01234567", 2, S3, None)
    assert Assignment.parse(json.dumps(assignment.to_json())) == assignment
    for bad in ("[]", '{"spec": {}, "attempt": 0}', "{"):
        with pytest.raises(ValueError):
            Assignment.parse(bad)
    assert standby_prefix("9f1c-22") == ".standby/9f1c-22/"
    with pytest.raises(ValueError):
        standby_prefix("../x")


# ------------------------------------------------------------------------------ the bench
class Kube(RunsKube):
    """What the tests read and write through the API server, as kubectl or a kubelet."""

    def status(self, name: str) -> JSON:
        return status(self.run(name))

    def standbys(self, *, waiting: bool = True) -> list[Any]:
        selector = f"{STANDBY_LABEL}=true" if waiting else STANDBY_LABEL
        return list(self.core.list_namespaced_pod(self.namespace, label_selector=selector).items)

    def standby_secrets(self) -> list[str]:
        listed = self.core.list_namespaced_secret(self.namespace, label_selector=STANDBY_LABEL)
        return [s.metadata.name for s in listed.items]

    def secret_data(self, name: str) -> dict[str, str]:
        secret = self.core.read_namespaced_secret(name, self.namespace)
        return {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}

    def container(self, pod: str, state: JSON, phase: str) -> None:
        """Write the pod's container state as its kubelet would."""
        status = {
            "phase": phase,
            "containerStatuses": [
                {
                    "name": "agent",
                    "image": "alpineagents:pool",
                    "imageID": "",
                    "ready": "running" in state,
                    "restartCount": 0,
                    "state": state,
                }
            ],
        }
        self.core.patch_namespaced_pod_status(pod, self.namespace, {"status": status})

    def running(self, pod: str) -> None:
        self.container(pod, {"running": {"startedAt": format_time(datetime.now(UTC))}}, "Running")

    def exited(self, pod: str, code: int, message: str = "") -> None:
        terminated = {
            "exitCode": code,
            "reason": "Error" if code else "Completed",
            "message": message,
        }
        self.container(pod, {"terminated": terminated}, "Succeeded" if code == 0 else "Failed")


@pytest.fixture
def kube(control_plane: ControlPlane) -> Kube:
    """A namespace of its own for each test: what a test leaves is the test's to see."""
    control_plane.apply_crds()
    namespace = f"pool-{uuid.uuid4().hex[:6]}"
    control_plane.kubectl("create", "namespace", namespace)
    return Kube(control_plane, namespace)


@pytest.fixture
def root(minio: S3Server, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The store's key, in the operator's environment (it mints with it)."""
    key = {"AWS_ACCESS_KEY_ID": minio.access_key, "AWS_SECRET_ACCESS_KEY": minio.secret_key}
    for name, value in key.items():
        monkeypatch.setenv(name, value)
    return key


@pytest.fixture
def store_url(minio: S3Server) -> str:
    return f"s3://{minio.bucket}/{minio.unique_prefix()}?endpoint={minio.endpoint}&secure=false"


POOL_OWNER = "the-operators-role"


@pytest.fixture
def pool_config(kube: Kube, store_url: str) -> OperatorConfig:
    # Per-run credentials (sts, the default): each standby and each run its own. The
    # operator's Role, as the chart makes it, owns the waiting standbys.
    role = {"metadata": {"name": POOL_OWNER}, "rules": []}
    client.RbacAuthorizationV1Api(kube.plane.api_client()).create_namespaced_role(
        kube.namespace, role
    )
    return OperatorConfig(
        namespaces=(kube.namespace,),
        store=store_url,
        image="alpineagents:pool",
        warm_pool=1,
        warm_pool_owner=("Role", POOL_OWNER),
    )


@pytest.fixture
def emptied(kube: Kube, pool_config: OperatorConfig, root: dict[str, str]) -> Iterator[None]:
    """The namespace's pool emptied after the test (each test starts from none)."""
    yield
    cluster = Cluster(kube.plane.api_client())
    asyncio.run(
        StandbyPool(replace(pool_config, warm_pool=0), cluster, env=root).keep(kube.namespace)
    )


def standby_process(
    kube: Kube, pod: Any, store_url: str, model: ModelServer | None, folder: Path
) -> RunnerProcess:
    """The standby's runner as its pod runs it: its Secret mounted as files."""
    mount = folder / "mount"
    mount.mkdir(parents=True)
    for key, value in kube.secret_data(f"{pod.metadata.name}-store-credentials").items():
        (mount / key).write_text(value)
    (folder / "tmp").mkdir()
    env = child_env(
        model,
        ALPINEAGENTS_STANDBY_ID=pod.metadata.uid,
        ALPINEAGENTS_STORE=store_url,
        TMPDIR=str(folder / "tmp"),
        **{
            f"{key}_FILE": str(mount / key)
            for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
        },
    )
    work = folder / "work"
    work.mkdir()
    return RunnerProcess(["run"], workdir=work, env=env)


def interrupted_run(kube: Kube, url: str, root: dict[str, str], name: str) -> str:
    """An AgentRun whose pod 1 was lost after saving its first message, due to resume."""
    return interrupted_in(kube, open_store(url, env=root), name)


async def eventually(check: Any) -> Any:
    """``check()`` once it returns something true (a safety-net deadline, no measurement)."""
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        await asyncio.sleep(0.1)
    raise AssertionError("not reached within the deadline")


def refused_with(credentials: dict[str, str], url: str, standby_id: str) -> bool:
    """Whether the store refuses ``credentials`` a look into ``standby_id``'s folder."""
    from minio.error import S3Error

    boxes = StandbyBoxes.open(url, credentials)
    try:
        boxes.take(standby_id)
    except S3Error as error:
        return error.code in (
            "AccessDenied",
            "InvalidAccessKeyId",
            "InvalidTokenId",
            "ExpiredToken",
        )
    return False


def as_env(secret: dict[str, str]) -> dict[str, str]:
    return {key: value for key, value in secret.items()}


async def test_a_lost_run_resumes_in_a_standby_and_the_lost_pod_can_write_no_more(
    kube: Kube,
    root: dict[str, str],
    store_url: str,
    pool_config: OperatorConfig,
    model_server: ModelServer,
    runners: list[RunnerProcess],
    tmp_path: Path,
    emptied: None,
) -> None:
    cluster = Cluster(kube.plane.api_client())
    pool = StandbyPool(pool_config, cluster, env=root)
    reconciler = Reconciler(
        pool_config, cluster, open_store=lambda url: open_store(url, env=root), pool=pool
    )
    try:
        await pool.keep(kube.namespace)
        [pod] = kube.standbys()
        # Waiting, it is the installation's (it goes with the chart's Role on uninstall).
        [waiting_owner] = pod.metadata.owner_references
        assert (waiting_owner.kind, waiting_owner.name) == ("Role", POOL_OWNER)
        own = as_env(kube.secret_data(f"{pod.metadata.name}-store-credentials"))
        runner = standby_process(kube, pod, store_url, model_server, tmp_path)
        runners.append(runner)
        kube.running(pod.metadata.name)
        name = f"r-{uuid.uuid4().hex[:6]}"
        state_id = interrupted_run(kube, store_url, root, name)
        lost_store = open_store(store_url, env=root)
        lost = lost_store.load(state_id)  # pod 1, lost but (for all anyone knows) running
        model_server.add(reply("resumed in a standby"))

        await reconciler.reconcile(kube.namespace, name)

        resumed = kube.status(name)
        assert resumed["pod"] == pod.metadata.name and resumed["attempt"] == 2, resumed
        handed = kube.core.read_namespaced_pod(pod.metadata.name, kube.namespace)
        assert handed.metadata.labels[f"{GROUP}/run"] == name
        assert handed.metadata.labels[ATTEMPT_LABEL] == "2"
        assert handed.metadata.labels[STANDBY_LABEL] == "taken"
        [owner] = handed.metadata.owner_references
        assert owner.kind == "AgentRun" and owner.name == name
        assert runner.wait() == 0, runner.stderr
        # One writer: the claim before the hand-over fenced the lost pod off.
        lost.send("the lost pod writes on")
        with pytest.raises(StateFencedError):
            lost_store.save(lost)
        saved = open_store(store_url, env=root).load(state_id)
        assert saved.answer == "resumed in a standby"
        # The assignment (it held the run's credentials) is nowhere in the store now.
        boxes = StandbyBoxes.open(store_url, root)
        assert not boxes.holds(pod.metadata.uid)
        # A new standby waits behind it.
        [new] = await eventually(lambda: kube.standbys() or None)
        assert new.metadata.name != pod.metadata.name
        # The handed standby's own credentials go once it has taken its assignment, and
        # the hand-over's mark with them.
        await pool.keep(kube.namespace)
        assert refused_with(own, store_url, pod.metadata.uid)
        assert boxes.ids() == []

        kube.exited(pod.metadata.name, 0, runner.message_path.read_text())
        await reconciler.reconcile(kube.namespace, name)
        done = kube.status(name)
        assert done["phase"] == "Succeeded" and done["answer"] == "resumed in a standby"
    finally:
        reconciler.close()


async def test_a_standby_on_a_stale_assignment_is_fenced_off_by_the_next_hand_over(
    kube: Kube,
    root: dict[str, str],
    store_url: str,
    pool_config: OperatorConfig,
    model_server: ModelServer,
    runners: list[RunnerProcess],
    leftover_commands: list[int],
    tmp_path: Path,
    emptied: None,
) -> None:
    cluster = Cluster(kube.plane.api_client())
    pool = StandbyPool(replace(pool_config, warm_pool=2), cluster, env=root)
    reconciler = Reconciler(
        pool_config, cluster, open_store=lambda url: open_store(url, env=root), pool=pool
    )
    try:
        await pool.keep(kube.namespace)
        stale, fresh = kube.standbys()
        name = f"r-{uuid.uuid4().hex[:6]}"
        state_id = interrupted_run(kube, store_url, root, name)
        kube.custom.patch_namespaced_custom_object(
            GROUP, VERSION, kube.namespace, PLURAL, name, {"spec": {"tools": ["shell"]}}
        )
        # An assignment the operator wrote to `stale` and never recorded (it stopped
        # before relabelling the pod): `stale` runs the run into a long tool call.
        access = StsAccess.for_store(store_url, root)
        minted = mint_run_credentials(access, state_id, timedelta(minutes=15), attempt=2)
        spec = {"model": "claude-sonnet-5", "prompt": "hi", "tools": ["shell"]}
        StandbyBoxes.open(store_url, root).put(
            stale.metadata.uid,
            Assignment(kube.namespace, name, spec, state_id, 2, store_url, minted.secret_data()),
        )
        model_server.add(reply(tool_use("shell", {"command": BLOCKING}, id="toolu_stale")))
        stale_runner = standby_process(kube, stale, store_url, model_server, tmp_path / "stale")
        runners.append(stale_runner)
        leftover_commands.append(int(wait_for_file(tmp_path / "stale" / "work" / "started")))
        # The operator, back, resumes the run in the other standby (the only one its
        # kubelet reports running): it claims the State first.
        fresh_runner = standby_process(kube, fresh, store_url, model_server, tmp_path / "fresh")
        runners.append(fresh_runner)
        kube.running(fresh.metadata.name)
        model_server.add(reply("answered by the standby the status names"))

        await reconciler.reconcile(kube.namespace, name)

        assert kube.status(name)["pod"] == fresh.metadata.name
        assert fresh_runner.wait() == 0, fresh_runner.stderr
        # The stale one's tool call ends; its save of the result is refused.
        os.kill(leftover_commands[-1], signal.SIGKILL)
        assert stale_runner.wait() != 0
        assert "fenced" in (stale_runner.stderr + stale_runner.message_path.read_text()).lower()
        saved = open_store(store_url, env=root).load(state_id)
        assert saved.answer == "answered by the standby the status names"
        results = [e for e in saved.history if e.kind == "tool_result"]
        assert [e.outcome for e in results] == ["aborted"]  # closed by the fresh one; no other
    finally:
        reconciler.close()


async def test_runs_resuming_at_once_each_go_to_a_standby_of_their_own(
    kube: Kube, root: dict[str, str], store_url: str, pool_config: OperatorConfig, emptied: None
) -> None:
    # A drain stops many pods at once: each resume must get its own standby, with its own
    # run's assignment, not a pod of its own because another resume took the same one.
    cluster = Cluster(kube.plane.api_client())
    pool = StandbyPool(replace(pool_config, warm_pool=3), cluster, env=root)
    reconciler = Reconciler(
        pool_config, cluster, open_store=lambda url: open_store(url, env=root), pool=pool
    )
    try:
        await pool.keep(kube.namespace)
        standbys = kube.standbys()
        for pod in standbys:
            kube.running(pod.metadata.name)
        names = [f"r-{uuid.uuid4().hex[:6]}" for _ in standbys]
        state_ids = {name: interrupted_run(kube, store_url, root, name) for name in names}

        await asyncio.gather(*(reconciler.reconcile(kube.namespace, name) for name in names))

        boxes = StandbyBoxes.open(store_url, root)
        by_name = {pod.metadata.name: pod.metadata.uid for pod in standbys}
        pods = {name: kube.status(name)["pod"] for name in names}
        assert sorted(pods.values()) == sorted(by_name), pods
        for name, pod_name in pods.items():
            assignment = boxes.take(by_name[pod_name])
            assert assignment is not None, f"{pod_name} holds no assignment"
            assert (assignment.run, assignment.state_id) == (name, state_ids[name])
            handed = kube.core.read_namespaced_pod(pod_name, kube.namespace)
            assert handed.metadata.labels[f"{GROUP}/run"] == name
    finally:
        reconciler.close()


async def test_a_standby_that_dies_is_replaced_and_takes_what_it_had_with_it(
    kube: Kube, root: dict[str, str], store_url: str, pool_config: OperatorConfig, emptied: None
) -> None:
    cluster = Cluster(kube.plane.api_client())
    pool = StandbyPool(pool_config, cluster, env=root)
    await pool.keep(kube.namespace)
    [dead] = kube.standbys()
    secret = f"{dead.metadata.name}-store-credentials"
    its_credentials = as_env(kube.secret_data(secret))
    boxes = StandbyBoxes.open(store_url, root)
    stray = Assignment(kube.namespace, "x", {}, "x", 2, store_url, None)
    boxes.put(dead.metadata.uid, stray)
    assert not refused_with(its_credentials, store_url, dead.metadata.uid)  # it reads its own
    kube.exited(dead.metadata.name, 1)

    await pool.keep(kube.namespace)

    [replacement] = kube.standbys()
    assert replacement.metadata.name != dead.metadata.name
    assert dead.metadata.name not in [p.metadata.name for p in kube.standbys(waiting=False)]
    assert kube.standby_secrets() == [f"{replacement.metadata.name}-store-credentials"]
    assert dead.metadata.uid not in boxes.ids()
    assert refused_with(its_credentials, store_url, dead.metadata.uid)  # revoked


async def test_a_pool_of_zero_leaves_no_standby_no_folder_and_no_credentials_behind(
    kube: Kube, root: dict[str, str], store_url: str, pool_config: OperatorConfig
) -> None:
    cluster = Cluster(kube.plane.api_client())
    await StandbyPool(replace(pool_config, warm_pool=2), cluster, env=root).keep(kube.namespace)
    standbys = kube.standbys()
    assert len(standbys) == 2
    held = [as_env(kube.secret_data(f"{p.metadata.name}-store-credentials")) for p in standbys]
    boxes = StandbyBoxes.open(store_url, root)
    for pod in standbys:
        boxes.put(pod.metadata.uid, Assignment(kube.namespace, "x", {}, "x", 2, store_url, None))

    await StandbyPool(replace(pool_config, warm_pool=0), cluster, env=root).keep(kube.namespace)

    assert kube.standbys(waiting=False) == []
    assert kube.standby_secrets() == []
    assert boxes.ids() == []
    for pod, credentials in zip(standbys, held, strict=True):
        assert refused_with(credentials, store_url, pod.metadata.uid)


async def test_a_standby_an_earlier_operator_handed_but_never_relabelled_gets_no_other_run(
    kube: Kube, root: dict[str, str], store_url: str, pool_config: OperatorConfig, emptied: None
) -> None:
    cluster = Cluster(kube.plane.api_client())
    earlier = StandbyPool(replace(pool_config, warm_pool=2), cluster, env=root)
    await earlier.keep(kube.namespace)
    standbys = kube.standbys()
    for pod in standbys:
        kube.running(pod.metadata.name)
    stale, waiting = standbys
    # The earlier operator wrote `stale`'s assignment and stopped before relabelling the
    # pod; the standby took the assignment and runs that run.
    boxes = StandbyBoxes.open(store_url, root)
    boxes.put(stale.metadata.uid, Assignment(kube.namespace, "x", {}, "x", 2, store_url, None))
    assert boxes.take(stale.metadata.uid) is not None
    restarted = StandbyPool(replace(pool_config, warm_pool=2), cluster, env=root)

    first, second = await restarted.pick(kube.namespace), await restarted.pick(kube.namespace)

    assert first is not None and first.name == waiting.metadata.name
    assert second is None  # the one left looks waiting but runs a run
    restarted.release(kube.namespace, first)
    await restarted.keep(kube.namespace)  # it goes, and a new one waits in its place
    names = [p.metadata.name for p in kube.standbys(waiting=False)]
    assert stale.metadata.name not in names and waiting.metadata.name in names
    assert len(kube.standbys()) == 2
    assert stale.metadata.uid not in boxes.ids()


async def test_a_handed_standby_leaves_no_mark_once_it_took_its_assignment(
    kube: Kube, root: dict[str, str], store_url: str, pool_config: OperatorConfig, emptied: None
) -> None:
    cluster = Cluster(kube.plane.api_client())
    pool = StandbyPool(pool_config, cluster, env=root)
    await pool.keep(kube.namespace)
    [standby] = kube.standbys()
    kube.running(standby.metadata.name)
    name = f"r-{uuid.uuid4().hex[:6]}"
    interrupted_run(kube, store_url, root, name)
    run = AgentRunView.from_body(kube.run(name))
    picked = await pool.pick(kube.namespace)
    assert picked is not None
    assert await pool.hand(run, 2, picked, None)
    boxes = StandbyBoxes.open(store_url, root)
    assert boxes.handed() == {standby.metadata.uid}
    await pool.keep(kube.namespace)  # relabelled, but its assignment is not taken yet
    assert boxes.handed() == {standby.metadata.uid}
    assert boxes.take(standby.metadata.uid) is not None  # as the standby does

    await StandbyPool(pool_config, cluster, env=root).keep(kube.namespace)  # even restarted

    assert boxes.handed() == set()
    assert boxes.ids() == []
