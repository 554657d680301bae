"""The operator's reconciler when one run or the store misbehaves, on the test bench.

Real parts: the bench's kube-apiserver (no kubelet: the pods the reconciler creates are
only stored, which is all these tests look at) and MinIO as the store. The
:class:`Reconciler` runs in this process, so a test takes one step, or one resync round,
and looks at what it did. No operator process runs meanwhile (the e2e module stops its
own at its end), so nothing else acts on these runs.

- One bad run (a name too long to label its pods, created before the CRD refused such
  names) must not stop the resync for the others, and its failure is logged once.
- A replacement pod never starts while its State cannot be claimed (fenced): the run
  says why, and the pod starts once the claim goes through.
- A lost pod still writing its State is fenced before its successor is created, even
  when it writes between the operator's read and its claim; and then status names no
  call as aborted whose result that write saved (the State is read again after the
  claim).
- After a store outage, status (``abortedCalls`` above all) agrees with the history. The
  pods here are the runner as a pod runs it, and the test writes their exit into the
  pod's status as the kubelet would.
"""

from __future__ import annotations

import base64
import json
import logging
import signal
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from alpineagents import Message, Record, State, StateFencedError, Store, open_store
from alpineagents.store import WrappedStore
from alpineagents.testing import ModelServer, reply, tool_use
from alpineagents_operator.kube.cluster import Cluster
from alpineagents_operator.kube.config import OperatorConfig
from alpineagents_operator.kube.views import format_time
from alpineagents_operator.reconciling.reconciler import Reconciler
from alpineagents_operator.watching.watched import Watched
from tests.bench.control_plane import ControlPlane
from tests.bench.minio_server import S3Server
from tests.bench.runner_process import (
    BLOCKING,
    RunnerProcess,
    child_env,
    tool_results,
    wait_for_file,
)
from tests.paths import REPO

JSON = dict[str, Any]
GROUP, VERSION, PLURAL = "alpineagents.dev", "v1", "agentruns"


# ------------------------------------------------------------------------------ the bench
class Kube:
    """What the tests read and write through the API server."""

    def __init__(self, plane: ControlPlane, namespace: str) -> None:
        from kubernetes import client

        self.plane = plane
        self.namespace = namespace
        api = plane.api_client()
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)

    def create_run(self, name: str, **spec: Any) -> JSON:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "AgentRun",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {"model": "claude-sonnet-5", "prompt": "hi", **spec},
        }
        created: JSON = self.custom.create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, body
        )
        return created

    def run(self, name: str) -> JSON:
        body: JSON = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, name
        )
        return body

    def set_status(self, name: str, status: JSON) -> None:
        self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, self.namespace, PLURAL, name, {"status": status}
        )

    def pod_names(self, run_name: str) -> list[str]:
        pods = self.core.list_namespaced_pod(
            self.namespace, label_selector=f"{GROUP}/run={run_name}"
        )
        return sorted(p.metadata.name for p in pods.items)

    def event_reasons(self, name: str) -> list[str]:
        events = self.core.list_namespaced_event(
            self.namespace, field_selector=f"involvedObject.name={name}"
        )
        return [e.reason for e in events.items]


def status(body: JSON) -> JSON:
    return dict(body.get("status") or {})


@pytest.fixture(scope="module")
def cluster(control_plane: ControlPlane) -> Kube:
    control_plane.apply_crds()
    namespace = f"faults-{uuid.uuid4().hex[:6]}"
    control_plane.kubectl("create", "namespace", namespace)
    return Kube(control_plane, namespace)


@pytest.fixture
def store_url(minio: S3Server) -> str:
    return f"s3://{minio.bucket}/{minio.unique_prefix()}?endpoint={minio.endpoint}&secure=false"


def credentials(access_key: str, secret_key: str) -> dict[str, str]:
    return {"AWS_ACCESS_KEY_ID": access_key, "AWS_SECRET_ACCESS_KEY": secret_key}


def reconciler_for(
    cluster: Kube,
    store_url: str,
    open_store_with: Callable[[str], Store],
    calls: Cluster | None = None,
    watched: Watched | None = None,
) -> Reconciler:
    config = OperatorConfig(
        namespaces=(cluster.namespace,),
        store=store_url,
        image="alpineagents:faults",
        run_credentials="shared",  # no pod runs here: it needs no credentials of its own
    )
    calls = calls or Cluster(cluster.plane.api_client())
    return Reconciler(config, calls, open_store=open_store_with, watched=watched)


def interrupted_run(cluster: Kube, store: Store, name: str) -> str:
    """An AgentRun whose pod 1 was lost after saving its first message, due to resume
    now (pod 2); returns its State id."""
    body = cluster.create_run(name, restartPolicy={"initialBackoffSeconds": 0})
    state_id = f"{cluster.namespace}.{name}.{body['metadata']['uid'][:8]}"
    state = State(state_id, [Message.user("hi")])
    store.save(state)
    cluster.set_status(
        name,
        {
            "phase": "Interrupted",
            "attempt": 1,
            "pod": f"{name}-1",
            "restarts": 1,
            "stateId": state_id,
            "nextAttemptAt": format_time(datetime(2020, 1, 1, tzinfo=UTC)),  # due
        },
    )
    return state_id


# ------------------------------------------------------------------------------ one bad run
def crd_variant(directory: Path, root_rule: str | None) -> Path:
    """The AgentRun CRD with another rule on the whole object (None: without one), as an
    older or newer CRD than the one a run was created under may have it."""
    crd = yaml.safe_load((REPO / "crds" / "agentrun.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    schema.pop("x-kubernetes-validations", None)
    if root_rule is not None:
        schema["x-kubernetes-validations"] = [{"rule": root_rule, "message": "refused"}]
    directory.mkdir()
    (directory / "agentrun.yaml").write_text(yaml.safe_dump(crd))
    return directory


@pytest.mark.parametrize(
    "later_rule",
    [
        pytest.param(None, id="made-before-long-names-were-refused"),
        # Every write of the bad run is refused, its status too: only the log can tell.
        pytest.param("size(self.metadata.name) <= 63", id="every-write-refused"),
    ],
)
async def test_one_run_that_cannot_work_does_not_stop_the_resync_of_the_others(
    cluster: Kube, tmp_path: Path, caplog: pytest.LogCaptureFixture, later_rule: str | None
) -> None:
    # A name over 63 characters cannot label the run's pods, not even list them. The bad
    # run sorts first, so each resync round meets it before the healthy one.
    bad = "a" + uuid.uuid4().hex[:6] + "-" + "x" * 60
    good = "b" + uuid.uuid4().hex[:6]
    cluster.plane.apply_crds(crd_variant(tmp_path / "before", None))
    try:
        cluster.create_run(bad)
        if later_rule is not None:
            cluster.plane.apply_crds(crd_variant(tmp_path / "later", later_rule))
        cluster.create_run(good)
        reconciler = reconciler_for(cluster, f"file://{tmp_path}/runs", open_store)
        try:
            with caplog.at_level(logging.WARNING, logger="alpineagents_operator"):
                await reconciler.resync()
                await reconciler.resync()
            # Deleting it (kopf's delete handlers stop its pods first) goes through too.
            assert await reconciler.stop_run(cluster.namespace, bad) == 0
        finally:
            reconciler.close()
    finally:
        cluster.plane.apply_crds()
    # The healthy run was reconciled both rounds although the bad one came first.
    assert status(cluster.run(good))["phase"] == "Pending"
    assert cluster.pod_names(good) == [f"{good}-1"]
    about_bad = [r.getMessage() for r in caplog.records if bad in r.getMessage()]
    if later_rule is None:
        # The bad run says why it cannot run, in its own status.
        failed = status(cluster.run(bad))
        assert failed["phase"] == "Failed" and failed["reason"] == "InvalidName"
        assert f"is {len(bad)} characters, more than the 63" in failed["message"]
        assert not about_bad
    else:
        [logged] = about_bad  # once, not once a round
        assert "resync step failed" in logged and "other runs go on" in logged
    cluster.custom.delete_namespaced_custom_object(GROUP, VERSION, cluster.namespace, PLURAL, bad)


# ------------------------------------------------------------------------------ fencing
@pytest.fixture
def reader(minio: S3Server) -> Iterator[tuple[dict[str, str], Callable[[], None]]]:
    """A MinIO user that may read every State but write none (so it cannot claim one),
    and a function that lets it write from then on."""
    from minio.credentials import StaticProvider
    from minio.minioadmin import MinioAdmin

    admin = MinioAdmin(
        endpoint=minio.endpoint,
        credentials=StaticProvider(minio.access_key, minio.secret_key),
        secure=False,
    )
    user, password = f"reader{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    policy = f"read-{user}"
    read_only = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": ["s3:GetBucketLocation", "s3:ListBucket", "s3:GetObject"],
                "Resource": ["arn:aws:s3:::*"],
            }
        ],
    }
    admin.user_add(user, password)
    admin.policy_add(policy, policy=read_only)
    admin.attach_policy([policy], user=user)
    try:
        yield credentials(user, password), lambda: admin.attach_policy(["readwrite"], user=user)
    finally:
        admin.user_remove(user)
        admin.policy_remove(policy)


async def test_a_replacement_waits_until_its_state_is_claimed(
    cluster: Kube,
    minio: S3Server,
    store_url: str,
    reader: tuple[dict[str, str], Callable[[], None]],
) -> None:
    root = credentials(minio.access_key, minio.secret_key)
    name = f"f-{uuid.uuid4().hex[:6]}"
    state_id = interrupted_run(cluster, open_store(store_url, env=root), name)
    # The lost pod, for all the operator knows, still runs: it loaded the State.
    old_store = open_store(store_url, env=root)
    old = old_store.load(state_id)
    reader_env, allow_writes = reader
    reconciler = reconciler_for(cluster, store_url, lambda url: open_store(url, env=reader_env))
    try:
        await reconciler.reconcile(cluster.namespace, name)
        await reconciler.reconcile(cluster.namespace, name)  # tried again: still refused
        # No pod 2 runs next to a writer that could not be fenced; the run says why.
        assert cluster.pod_names(name) == []
        held = status(cluster.run(name))
        assert held["phase"] == "Interrupted" and held["attempt"] == 1
        assert held["restarts"] == 1  # waiting for a claim is no loss
        assert held["reason"] == "FencingFailed"
        assert f"could not claim State {state_id} before starting pod {name}-2" in held["message"]
        assert "AccessDenied" in held["message"]
        assert cluster.event_reasons(name).count("FencingFailed") == 1  # warned once
        allow_writes()
        await reconciler.reconcile(cluster.namespace, name)
    finally:
        reconciler.close()
    resumed = status(cluster.run(name))
    assert cluster.pod_names(name) == [f"{name}-2"]
    assert resumed["phase"] == "Pending" and resumed["attempt"] == 2
    assert resumed.get("reason") is None
    old.send("the lost pod writes on")
    with pytest.raises(StateFencedError):
        old_store.save(old)


class OldPodWritesAfterEachRead(WrappedStore):
    """The operator's store, and next to it a lost pod that saves its State right after
    every read the operator makes: the worst moment, between the read and the claim."""

    def __init__(self, inner: Store, old_pod_saves: Callable[[], None]) -> None:
        super().__init__(inner)
        self.old_pod_saves = old_pod_saves

    def incoming(self, state_id: str, record: Record) -> Record:
        self.old_pod_saves()
        return record


async def test_a_lost_pod_still_writing_is_fenced_before_its_successor_is_created(
    cluster: Kube, minio: S3Server, store_url: str
) -> None:
    root = credentials(minio.access_key, minio.secret_key)
    name = f"f-{uuid.uuid4().hex[:6]}"
    state_id = interrupted_run(cluster, open_store(store_url, env=root), name)
    old_store = open_store(store_url, env=root)
    old = old_store.load(state_id)
    saves: list[str] = []

    def old_pod_saves() -> None:
        old.send(f"old pod save {len(saves)}")
        try:
            old_store.save(old)
        except StateFencedError:
            saves.append("fenced")
        else:
            saves.append("saved")

    reconciler = reconciler_for(
        cluster,
        store_url,
        lambda url: OldPodWritesAfterEachRead(open_store(url, env=root), old_pod_saves),
    )
    try:
        await reconciler.reconcile(cluster.namespace, name)
    finally:
        reconciler.close()
    assert cluster.pod_names(name) == [f"{name}-2"]
    assert saves and saves[0] == "saved"  # it did write after the operator's read
    # ... and yet, once pod 2 exists, the old pod can write no more.
    old_pod_saves()
    assert saves[-1] == "fenced", saves
    history = [e.kind for e in open_store(store_url, env=root).load(state_id).history]
    assert history.count("message") == 1 + saves.count("saved")


class LostPodSavesAfterTheFirstRead(WrappedStore):
    """The operator's store, and next to it a lost pod that saves once, right after the
    operator's first read: between that read and the claim."""

    def __init__(self, inner: Store, lost_pod_saves: Callable[[], None]) -> None:
        super().__init__(inner)
        self.lost_pod_saves: Callable[[], None] | None = lost_pod_saves

    def incoming(self, state_id: str, record: Record) -> Record:
        saves, self.lost_pod_saves = self.lost_pod_saves, None
        if saves is not None:
            saves()
        return record


async def test_aborted_calls_name_no_call_whose_result_was_saved_before_the_claim(
    cluster: Kube, minio: S3Server, store_url: str
) -> None:
    root = credentials(minio.access_key, minio.secret_key)
    name = f"f-{uuid.uuid4().hex[:6]}"
    state_id = interrupted_run(cluster, open_store(store_url, env=root), name)
    # Pod 1 saved the model's call and ran it; it is lost, but still running.
    lost_store = open_store(store_url, env=root)
    lost = lost_store.load(state_id)
    call = {"type": "tool_use", "id": "toolu_done", "name": "shell", "input": {}}
    message = {"role": "assistant", "content": [call]}
    lost.add("model_reply", "calls shell", {"message": message, "model": "claude-sonnet-5"})
    lost_store.save(lost)
    [pending] = lost.pending_calls

    def lost_pod_saves() -> None:
        lost.add_result(pending, "ok", "done")
        lost_store.save(lost)

    reconciler = reconciler_for(
        cluster,
        store_url,
        lambda url: LostPodSavesAfterTheFirstRead(open_store(url, env=root), lost_pod_saves),
    )
    try:
        await reconciler.reconcile(cluster.namespace, name)
    finally:
        reconciler.close()
    assert cluster.pod_names(name) == [f"{name}-2"]
    [result] = tool_results(open_store(store_url, env=root).load(state_id))
    assert result.outcome == "ok"  # the lost pod's save landed before the claim ...
    resumed = status(cluster.run(name))
    assert "abortedCalls" not in resumed, resumed  # ... so no call of it was aborted
    assert resumed["lastSavedSeq"] == result.seq


async def test_a_lost_pod_that_saved_its_answer_before_the_claim_gets_no_successor(
    cluster: Kube, minio: S3Server, store_url: str
) -> None:
    root = credentials(minio.access_key, minio.secret_key)
    name = f"f-{uuid.uuid4().hex[:6]}"
    state_id = interrupted_run(cluster, open_store(store_url, env=root), name)
    lost_store = open_store(store_url, env=root)
    lost = lost_store.load(state_id)

    def lost_pod_answers() -> None:
        message = {"role": "assistant", "content": [{"type": "text", "text": "All done."}]}
        lost.add("model_reply", "All done.", {"message": message, "model": "claude-sonnet-5"})
        lost.add("stop", "stopped: answered", {"reason": "answered"})
        lost_store.save(lost)

    reconciler = reconciler_for(
        cluster,
        store_url,
        lambda url: LostPodSavesAfterTheFirstRead(open_store(url, env=root), lost_pod_answers),
    )
    try:
        await reconciler.reconcile(cluster.namespace, name)
    finally:
        reconciler.close()
    assert cluster.pod_names(name) == []  # the answer was saved before the claim
    done = status(cluster.run(name))
    assert (done["phase"], done["answer"]) == ("Succeeded", "All done."), done


# ------------------------------------------------------------------------------ graceful stop
async def test_a_terminating_pod_is_replaced_at_once_and_the_fence_decides_who_writes(
    cluster: Kube, minio: S3Server, store_url: str
) -> None:
    root = credentials(minio.access_key, minio.secret_key)
    name = f"f-{uuid.uuid4().hex[:6]}"
    # The default restartPolicy: its backoff is for pods that fail, not for a drain.
    cluster.create_run(name)
    reconciler = reconciler_for(cluster, store_url, lambda url: open_store(url, env=root))
    old_pod = f"{name}-1"
    try:
        await reconciler.reconcile(cluster.namespace, name)
        state_id = status(cluster.run(name))["stateId"]
        # Pod 1 runs: it saved its State and writes on. Then it is drained: deleted, and
        # (held by a finalizer here, by its grace period on a node) not gone yet.
        old_store = open_store(store_url, env=root)
        old = State(state_id, [Message.user("hi")])
        old_store.save(old)
        cluster.core.patch_namespaced_pod(
            old_pod, cluster.namespace, {"metadata": {"finalizers": ["alpineagents.dev/test"]}}
        )
        cluster.core.delete_namespaced_pod(old_pod, cluster.namespace)
        await reconciler.reconcile(cluster.namespace, name)

        # Its replacement exists while it is still terminating ...
        assert cluster.pod_names(name) == [old_pod, f"{name}-2"]
        resumed = status(cluster.run(name))
        assert resumed["phase"] == "Pending" and resumed["attempt"] == 2
        # A pod deleted by someone else is a disruption, not a restart toward maxRestarts.
        assert resumed["disruptions"] == 1 and not resumed.get("restarts")
        # ... and the old pod's last save (what it does on SIGTERM) is refused: the claim
        # came first. The replacement loads, claims and writes; one writer at a time.
        old.send("the old pod saves as it stops")
        with pytest.raises(StateFencedError):
            old_store.save(old)
        new_store = open_store(store_url, env=root)
        new = new_store.load(state_id)
        new_store.claim(state_id)
        new.send("the replacement goes on")
        new_store.save(new)
        history = open_store(store_url, env=root).load(state_id).history
        texts = [Message.from_dict(e.data["message"]).text for e in history if e.kind == "message"]
        assert texts == ["hi", "the replacement goes on"]
    finally:
        reconciler.close()
        cluster.core.patch_namespaced_pod(
            old_pod, cluster.namespace, {"metadata": {"finalizers": None}}
        )


# ------------------------------------------------------------------------------ outage
def kubelet_reports_exit(kube: Kube, pod: str, runner: RunnerProcess, code: int) -> None:
    """Write the pod's status as its kubelet would once ``runner`` (its container's
    process) has exited with ``code``: the exit code and the termination message."""
    container_exited(kube, pod, code, runner.message_path.read_text())


def container_exited(kube: Kube, pod: str, code: int, message: str = "") -> JSON:
    """Write the pod's status as its kubelet would once its container exited with
    ``code``; returns the pod as a watch event would carry it."""
    patched: JSON = kube.core.api_client.sanitize_for_serialization(
        kube.core.patch_namespaced_pod_status(
            pod,
            kube.namespace,
            {
                "status": {
                    "phase": "Succeeded" if code == 0 else "Failed",
                    "containerStatuses": [
                        {
                            "name": "agent",
                            "image": "alpineagents:faults",
                            "imageID": "",
                            "ready": False,
                            "restartCount": 0,
                            "state": {
                                "terminated": {
                                    "exitCode": code,
                                    "reason": "Completed" if code == 0 else "Error",
                                    "message": message,
                                }
                            },
                        }
                    ],
                }
            },
        )
    )
    return patched


async def test_status_agrees_with_the_history_after_a_store_outage(
    cluster: Kube,
    minio: S3Server,
    model_server: ModelServer,
    runners: list[RunnerProcess],
    leftover_commands: list[int],
    tmp_path: Path,
) -> None:
    root = credentials(minio.access_key, minio.secret_key)
    # The store answers quickly either way, so the outage shows within seconds.
    url = (
        f"s3://{minio.bucket}/{minio.unique_prefix()}?endpoint={minio.endpoint}"
        f"&secure=false&timeout=1&retry_budget=2"
    )
    name = f"f-{uuid.uuid4().hex[:6]}"
    spec = {"tools": ["shell"], "store": url, "restartPolicy": {"initialBackoffSeconds": 0}}
    uid = cluster.create_run(name, **spec)["metadata"]["uid"]
    state_id = f"{cluster.namespace}.{name}.{uid[:8]}"
    work = tmp_path / "work"
    work.mkdir()

    def pod_process(attempt: int, spec_file: Path) -> RunnerProcess:
        """The runner as the pod of ``attempt`` runs it (the same environment)."""
        runner = RunnerProcess(
            ["run"],
            workdir=work,
            env=child_env(
                model_server,
                ALPINEAGENTS_SPEC_FILE=str(spec_file),
                ALPINEAGENTS_STORE=url,
                ALPINEAGENTS_STATE_ID=state_id,
                ALPINEAGENTS_ATTEMPT=str(attempt),
                **root,
            ),
            message_path=tmp_path / f"termination-log-{attempt}",
        )
        runners.append(runner)
        return runner

    # Pod 1 is killed in the middle of its tool call: the call has no result.
    first_spec = tmp_path / "spec-1.json"
    first_spec.write_text(json.dumps(cluster.run(name)["spec"]))
    model_server.add(reply(tool_use("shell", {"command": BLOCKING}, id="toolu_lost")))
    first = pod_process(1, first_spec)
    leftover_commands.append(int(wait_for_file(work / "started")))
    first.signal(signal.SIGKILL)
    first.wait()
    cluster.set_status(
        name,
        {
            "phase": "Interrupted",
            "attempt": 1,
            "pod": f"{name}-1",
            "restarts": 1,
            "stateId": state_id,
            "nextAttemptAt": format_time(datetime(2020, 1, 1, tzinfo=UTC)),
        },
    )
    reconciler = reconciler_for(cluster, url, lambda u: open_store(u, env=root))
    try:
        minio.stop()
        try:
            # The store is down: pod 2 starts without the operator knowing of the open call.
            await reconciler.reconcile(cluster.namespace, name)
            assert cluster.pod_names(name) == [f"{name}-2"]
            assert "abortedCalls" not in status(cluster.run(name))
        finally:
            minio.start()
        secret = cluster.core.read_namespaced_secret(f"{name}-2-spec", cluster.namespace)
        second_spec = tmp_path / "spec-2.json"
        second_spec.write_bytes(base64.b64decode(secret.data["spec.json"]))
        model_server.add(reply("The command may have run; I stop here."))
        second = pod_process(2, second_spec)  # closes the call as aborted, then answers
        assert second.wait() == 0, second.stderr
        minio.stop()
        try:
            # Pod 2 answered; then the store went down again before the operator read it.
            kubelet_reports_exit(cluster, f"{name}-2", second, 0)
            await reconciler.reconcile(cluster.namespace, name)
            ended = status(cluster.run(name))
            assert ended["phase"] == "Succeeded", ended
            assert ended["savedStateUnread"] is True
        finally:
            minio.start()
        await reconciler.reconcile(cluster.namespace, name)  # the store is back
    finally:
        reconciler.close()
    done = status(cluster.run(name))
    state = open_store(url, env=root).load(state_id)
    aborted = [e.data["call_id"] for e in tool_results(state) if e.outcome == "aborted"]
    assert aborted == ["toolu_lost"]
    assert done["abortedCalls"] == aborted  # status agrees with the history
    assert done["lastSavedSeq"] == max(e.seq for e in state.history)
    assert "savedStateUnread" not in done


# ------------------------------------------------------------------------------ a lost pod
class CountingStore(WrappedStore):
    """The operator's store, counting its reads of States."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.reads = 0

    def incoming(self, state_id: str, record: Record) -> Record:
        self.reads += 1
        return record


class CountingCluster(Cluster):
    """The operator's API calls, counting its reads of AgentRuns (every reconcile call
    starts with one)."""

    run_reads = 0

    def get_run(self, namespace: str, name: str) -> JSON | None:
        self.run_reads += 1
        return super().get_run(namespace, name)


async def test_a_lost_pod_is_replaced_in_one_call_that_reads_its_state_once_and_after_the_claim(
    cluster: Kube, minio: S3Server, store_url: str
) -> None:
    root = credentials(minio.access_key, minio.secret_key)
    stores: list[CountingStore] = []

    def counted(url: str) -> Store:
        stores.append(CountingStore(open_store(url, env=root)))
        return stores[-1]

    name = f"f-{uuid.uuid4().hex[:6]}"
    uid = cluster.create_run(name, restartPolicy={"initialBackoffSeconds": 0})["metadata"]["uid"]
    open_store(store_url, env=root).save(
        State(f"{cluster.namespace}.{name}.{uid[:8]}", [Message.user("hi")])
    )
    counting = CountingCluster(cluster.plane.api_client())
    reconciler = reconciler_for(cluster, store_url, counted, counting)
    try:
        await reconciler.reconcile(cluster.namespace, name)
        assert cluster.pod_names(name) == [f"{name}-1"]
        pod = container_exited(cluster, f"{name}-1", 143)  # SIGTERM'd, as by a drain
        reads_before = sum(s.reads for s in stores)
        await reconciler.pod_changed(cluster.namespace, name, pod, gone=False)
        # Marked Interrupted, then resumed in pod 2: the State read once for both steps,
        # and once more after its claim (what pod 2 loads, for status.abortedCalls).
        assert cluster.pod_names(name) == [f"{name}-1", f"{name}-2"]
        resumed = status(cluster.run(name))
        assert (resumed["attempt"], resumed["disruptions"]) == (2, 1)
        assert sum(s.reads for s in stores) - reads_before == 2
        assert {"PodLost", "PodCreated"} <= set(cluster.event_reasons(name))
        # The same pod again (a watch delivers an unchanged pod, or a readiness change):
        # nothing for a step to do, so no step runs.
        reads_before = counting.run_reads
        await reconciler.pod_changed(cluster.namespace, name, pod, gone=False)
        assert counting.run_reads == reads_before
        await reconciler.pod_changed(cluster.namespace, name, pod, gone=True)
        assert counting.run_reads == reads_before + 1  # its deletion is news
    finally:
        reconciler.close()


async def test_a_replaced_pods_end_costs_no_step_where_the_watches_show_the_run(
    cluster: Kube, minio: S3Server, store_url: str
) -> None:
    # In a burst of 30 lost pods each old pod's exit and deletion was a step (a read of
    # the run and a listing of its pods) that found nothing to do, beside the resumes.
    root = credentials(minio.access_key, minio.secret_key)
    name = f"f-{uuid.uuid4().hex[:6]}"
    uid = cluster.create_run(name, restartPolicy={"initialBackoffSeconds": 0})["metadata"]["uid"]
    open_store(store_url, env=root).save(
        State(f"{cluster.namespace}.{name}.{uid[:8]}", [Message.user("hi")])
    )
    counting = CountingCluster(cluster.plane.api_client())
    reconciler = reconciler_for(
        cluster, store_url, lambda url: open_store(url, env=root), counting, Watched()
    )
    try:
        await reconciler.reconcile(cluster.namespace, name)
        first = container_exited(cluster, f"{name}-1", 143)
        reconciler.run_seen(cluster.run(name), gone=False)
        await reconciler.pod_changed(cluster.namespace, name, first, gone=False)
        assert cluster.pod_names(name) == [f"{name}-1", f"{name}-2"]
        reconciler.run_seen(cluster.run(name), gone=False)  # attempt 2, as its watch shows
        reads_before = counting.run_reads
        cluster.core.delete_namespaced_pod(f"{name}-1", cluster.namespace)
        await reconciler.pod_changed(cluster.namespace, name, first, gone=True)
        assert counting.run_reads == reads_before
        # The current pod's news still is a step: pod 2 lost, pod 3 replaces it.
        second = container_exited(cluster, f"{name}-2", 137)
        await reconciler.pod_changed(cluster.namespace, name, second, gone=False)
        assert counting.run_reads > reads_before
        assert cluster.pod_names(name) == [f"{name}-2", f"{name}-3"]
    finally:
        reconciler.close()
