"""Per-run store credentials on the bench's real MinIO (and what SeaweedFS answers).

The operator mints them with its broad key (the bench server's root user); a run's
credentials save and load its own State and its subagents', and are refused (403)
everywhere else.
"""

from __future__ import annotations

import base64
import io
import json
import os
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from minio import Minio
from minio.error import S3Error

from alpineagents import Message, State
from alpineagents.store.s3 import MinioStore
from alpineagents.store.url import open_store
from alpineagents_operator.credentials.credential_issuer import RunCredentialIssuer
from alpineagents_operator.credentials.run_credentials import (
    CredentialsRefused,
    CredentialsUnavailable,
    RunCredentials,
    StsAccess,
    credentials_secret,
    mint_run_credentials,
    renew_at,
    revoke_attempt_credentials,
    run_policy,
)
from alpineagents_operator.kube.config import OperatorConfig
from alpineagents_operator.kube.views import JSON, AgentRunView, PodView
from tests.bench.infra import free_port
from tests.bench.minio_server import S3Server

HOUR = timedelta(hours=1)
RUN = "agents.triage.6f1d2c3b"
OTHER_RUN = "agents.review.0a1b2c3d"


def access_for(server: S3Server, bucket: str, prefix: str = "runs") -> StsAccess:
    url = f"s3://{bucket}/{prefix}?endpoint={server.endpoint}&secure=false"
    env = {"AWS_ACCESS_KEY_ID": server.access_key, "AWS_SECRET_ACCESS_KEY": server.secret_key}
    return StsAccess.for_store(url, env)


def client_with(server: S3Server, credentials: RunCredentials) -> Minio:
    return Minio(
        server.endpoint,
        access_key=credentials.access_key,
        secret_key=credentials.secret_key,
        session_token=credentials.session_token,
        secure=False,
        region="us-east-1",
    )


def store_with(server: S3Server, bucket: str, credentials: RunCredentials) -> MinioStore:
    return MinioStore.connect(
        server.endpoint,
        bucket,
        "runs",
        access_key=credentials.access_key,
        secret_key=credentials.secret_key,
        session_token=credentials.session_token,
        secure=False,
        retry_budget=5,
        create_bucket=False,
    )


def refusal(call: Any) -> tuple[int, str]:
    """(HTTP status, S3 error code) of a request that must be refused."""
    with pytest.raises(S3Error) as caught:
        result = call()
        if hasattr(result, "__iter__") and not isinstance(result, bytes | str):
            list(result)  # listings are lazy
    return int(caught.value.response.status), str(caught.value.code)


def save_a_state(store: MinioStore, state_id: str, text: str) -> State:
    state = State(state_id, messages=[Message.user(text)])
    store.save(state)
    return state


# ------------------------------------------------------------------ a replaced pod's
def test_a_replaced_pods_credentials_are_revoked_and_its_successors_work(
    minio: S3Server, minio_bucket: str
) -> None:
    access = access_for(minio, minio_bucket)
    replaced = mint_run_credentials(access, RUN, HOUR, attempt=1)
    renewed = mint_run_credentials(access, RUN, HOUR, attempt=1)  # a renewal, same pod
    other_run = mint_run_credentials(access, OTHER_RUN, HOUR, attempt=1)
    save_a_state(store_with(minio, minio_bucket, replaced), RUN, "first pod")
    successor = mint_run_credentials(access, RUN, HOUR, attempt=2)

    assert revoke_attempt_credentials(access, RUN, 1)

    for held in (replaced, renewed):
        client = client_with(minio, held)
        stale = io.BytesIO(b"x")
        assert (
            refusal(partial(client.put_object, minio_bucket, f"runs/{RUN}/stale", stale, 1))[0]
            == 403
        )
        assert refusal(partial(client.get_object, minio_bucket, f"runs/{RUN}/x"))[0] == 403
    store = store_with(minio, minio_bucket, successor)
    loaded = store.load(RUN)
    assert loaded is not None and loaded.messages[0].text == "first pod"
    loaded.messages.append(Message.user("second pod"))
    store.save(loaded)
    # Another run's pod is not touched.
    save_a_state(store_with(minio, minio_bucket, other_run), OTHER_RUN, "unaffected")


def test_with_a_role_arn_nothing_is_tagged_or_revoked(minio: S3Server, minio_bucket: str) -> None:
    access = access_for(minio, minio_bucket)
    aws_like = StsAccess(**{**access.__dict__, "role_arn": "arn:aws:iam::1:role/runs"})
    assert revoke_attempt_credentials(aws_like, RUN, 1) is False


# ------------------------------------------------------------------ what they allow
def test_a_runs_credentials_save_and_load_its_state_and_its_subagents(
    minio: S3Server, minio_bucket: str
) -> None:
    credentials = mint_run_credentials(access_for(minio, minio_bucket), RUN, HOUR)
    assert credentials.access_key != minio.access_key
    assert timedelta(minutes=50) < credentials.expires_at - datetime.now(UTC) <= HOUR
    store = store_with(minio, minio_bucket, credentials)
    state = save_a_state(store, RUN, "triage the queue")
    state.send("and the backlog")
    store.save(state)  # a second save: one conditional create of the next slot
    assert store.load(RUN) == state
    child = State(f"{RUN}.toolu_1", messages=[Message.user("look it up")], parent_id=RUN)
    store.save(child)
    assert store.load(child.id).parent_id == RUN
    assert store.claim(RUN) == 2  # the fencing a resumed pod does
    # Merging deletes slots: allowed inside the run's folder.
    many = MinioStore.connect(
        minio.endpoint,
        minio_bucket,
        "runs",
        access_key=credentials.access_key,
        secret_key=credentials.secret_key,
        session_token=credentials.session_token,
        secure=False,
        merge_after=2,
        create_bucket=False,
    )
    loaded = many.load(RUN)
    for number in range(4):
        loaded.send(f"more {number}")
        many.save(loaded)
    many.wait_for_merges()
    keys = [k for k in minio_keys(minio, minio_bucket) if "/h-" in k]
    assert [k for k in keys if "/m-" in k]  # merged,
    assert not [k for k in keys if k.endswith("/s-000000000001.jsonl")]  # and deleted
    # (the child has only its slot 0; the run's slot 1 was merged away)
    assert store.load(RUN).messages[-1].text == "more 3"


# ------------------------------------------------------------------ what they refuse
def test_a_runs_credentials_are_refused_everywhere_else(minio: S3Server, minio_bucket: str) -> None:
    admin = MinioStore.connect(
        minio.endpoint,
        minio_bucket,
        "runs",
        access_key=minio.access_key,
        secret_key=minio.secret_key,
        secure=False,
    )
    save_a_state(admin, OTHER_RUN, "the other team's secrets")
    # A run whose id starts like ours but is not ours nor a subagent of ours.
    save_a_state(admin, RUN + "x", "a neighbour")
    # Another AgentRun named "<our name>.<our uid prefix>": its id is "<our id>.<its uid>".
    save_a_state(admin, RUN + ".0a0a0a0a", "a run named like our subagents")
    credentials = mint_run_credentials(access_for(minio, minio_bucket), RUN, HOUR)
    client = client_with(minio, credentials)
    other = f"runs/{OTHER_RUN.replace('.', '%2E')}/"
    neighbour = f"runs/{(RUN + 'x').replace('.', '%2E')}/"
    lookalike = f"runs/{(RUN + '.0a0a0a0a').replace('.', '%2E')}/"
    forbidden = (403, "AccessDenied")

    assert refusal(lambda: client.get_object(minio_bucket, other + "info.json")) == forbidden
    assert refusal(lambda: client.get_object(minio_bucket, neighbour + "info.json")) == forbidden
    assert refusal(lambda: client.get_object(minio_bucket, lookalike + "info.json")) == forbidden
    assert (
        refusal(lambda: client.put_object(minio_bucket, other + "info.json", io.BytesIO(b"{}"), 2))
        == forbidden
    )
    assert refusal(lambda: client.remove_object(minio_bucket, other + "info.json")) == forbidden
    assert refusal(lambda: client.list_objects(minio_bucket, prefix=other)) == forbidden
    # Listing the bucket root, or the prefix all runs share.
    assert refusal(lambda: client.list_objects(minio_bucket)) == forbidden
    assert refusal(lambda: client.list_objects(minio_bucket, prefix="runs/")) == forbidden
    assert refusal(lambda: client.list_objects(minio_bucket, recursive=True)) == forbidden
    # Other buckets, bucket management.
    assert refusal(client.list_buckets) == forbidden
    assert refusal(lambda: client.make_bucket("another-bucket")) == forbidden
    assert refusal(lambda: client.remove_bucket(minio_bucket)) == forbidden
    # The store's own calls say the same: list() of all States is refused.
    with pytest.raises(S3Error, match="AccessDenied"):
        store_with(minio, minio_bucket, credentials).list()
    # Temporary credentials cannot mint more (no way back to a broad key).
    escalate = StsAccess(
        endpoint_url=f"http://{minio.endpoint}",
        region="us-east-1",
        bucket=minio_bucket,
        prefix="",
        access_key=credentials.access_key,
        secret_key=credentials.secret_key,
    )
    with pytest.raises(CredentialsRefused, match="403"):
        mint_run_credentials(escalate, OTHER_RUN, HOUR)
    # And nothing of the other run changed.
    assert admin.load(OTHER_RUN).messages[0].text == "the other team's secrets"


@pytest.fixture(scope="session")
def expiring(minio: S3Server) -> tuple[str, RunCredentials]:
    """Credentials of the shortest life STS grants (15 minutes), minted once a session.

    The test that mints them runs first and the one that waits for their end runs last
    (the ``clock`` marker, see conftest.py), so the wait overlaps the rest of the suite.
    """
    bucket = "expiry-" + uuid.uuid4().hex[:12]
    admin = Minio(
        minio.endpoint, access_key=minio.access_key, secret_key=minio.secret_key, secure=False
    )
    admin.make_bucket(bucket)
    return bucket, mint_run_credentials(access_for(minio, bucket), RUN, timedelta(minutes=15))


@pytest.mark.clock("start")
def test_short_lived_credentials_work_until_they_expire(
    minio: S3Server, expiring: tuple[str, RunCredentials]
) -> None:
    bucket, credentials = expiring
    assert credentials.expires_at > datetime.now(UTC) + timedelta(minutes=10)
    store = store_with(minio, bucket, credentials)
    save_a_state(store, RUN, "before expiry")
    assert store.load(RUN).messages[0].text == "before expiry"


@pytest.mark.clock("end")
def test_a_runs_credentials_are_refused_after_they_expire(
    minio: S3Server, expiring: tuple[str, RunCredentials]
) -> None:
    bucket, credentials = expiring
    client = client_with(minio, credentials)
    key = f"runs/{RUN.replace('.', '%2E')}/info.json"
    wait = (credentials.expires_at - datetime.now(UTC)).total_seconds()
    if wait > 60:  # run on its own (a suite may outlast them): the State must be there
        store = store_with(minio, bucket, credentials)
        if store.read(RUN) is None:
            save_a_state(store, RUN, "before expiry")
        client.stat_object(bucket, key)
    time.sleep(max(0.0, wait))  # the server's clock decides; the poll below waits for it
    deadline = time.monotonic() + 120
    while True:
        try:
            client.stat_object(bucket, key)
        except S3Error as error:
            assert int(error.response.status) in (400, 403)
            assert error.code in ("ExpiredToken", "InvalidAccessKeyId", "AccessDenied")
            break
        assert time.monotonic() < deadline, "credentials still accepted 2 minutes after expiry"
        time.sleep(1)
    with pytest.raises(S3Error):
        store_with(minio, bucket, credentials).load(RUN)


# ------------------------------------------------------------------ renewal reaches the pod
def test_a_store_on_credential_files_follows_their_renewal(
    minio: S3Server, minio_bucket: str, tmp_path: Path
) -> None:
    access = access_for(minio, minio_bucket)
    wrong = mint_run_credentials(access, OTHER_RUN, HOUR)
    right = mint_run_credentials(access, RUN, HOUR)
    mount = tmp_path / "mount"
    mount.mkdir()
    write_secret_volume(mount, wrong.secret_data(), "..2026_01")
    env = {f"{key}_FILE": str(mount / key) for key in wrong.secret_data()}
    url = f"s3://{minio_bucket}/runs?endpoint={minio.endpoint}&secure=false&create_bucket=false"
    store = open_store(url, env)
    state = State(RUN, messages=[Message.user("saved after the renewal")])
    with pytest.raises(S3Error, match="AccessDenied"):
        store.save(state)
    write_secret_volume(mount, right.secret_data(), "..2026_02")  # as the kubelet renews
    store.save(state)  # the same store object: it read the files again
    assert store.load(RUN) == state


def write_secret_volume(mount: Path, data: dict[str, str], version: str) -> None:
    """Lay out ``data`` as the kubelet's atomic writer does: ``..data`` swapped at once."""
    folder = mount / version
    folder.mkdir()
    for key, value in data.items():
        (folder / key).write_text(value)
        link = mount / key
        if not link.is_symlink():
            link.symlink_to(Path("..data") / key)
    staging = mount / "..data_tmp"
    staging.symlink_to(version)
    os.replace(staging, mount / "..data")


# ------------------------------------------------------------------ stores without STS
def test_seaweedfs_as_the_bench_runs_it_has_no_sts(seaweedfs: S3Server) -> None:
    access = access_for(seaweedfs, seaweedfs.bucket)
    with pytest.raises(CredentialsRefused) as refused:
        mint_run_credentials(access, RUN, HOUR)
    # Its STS answers only with its advanced IAM configured (-iam.config).
    assert refused.value.status == 503


def test_a_store_that_does_not_answer() -> None:
    access = StsAccess(
        endpoint_url=f"http://127.0.0.1:{free_port()}",
        region="us-east-1",
        bucket="b",
        prefix="",
        access_key="k",
        secret_key="s",
    )
    with pytest.raises(CredentialsUnavailable, match="did not answer"):
        mint_run_credentials(access, RUN, HOUR, timeout=2)


# ------------------------------------------------------------------ the plain parts
def test_the_policy_names_the_runs_folder_and_its_subagents_only() -> None:
    policy = run_policy("bkt", "team/runs/", RUN)
    objects, listing = policy["Statement"]
    assert objects["Resource"] == [
        "arn:aws:s3:::bkt/team/runs/agents%2Etriage%2E6f1d2c3b/*",
        "arn:aws:s3:::bkt/team/runs/agents%2Etriage%2E6f1d2c3b%2Etoolu_*",
    ]
    assert listing["Condition"]["StringLike"]["s3:prefix"] == [
        "team/runs/agents%2Etriage%2E6f1d2c3b/*",
        "team/runs/agents%2Etriage%2E6f1d2c3b%2Etoolu_*",
    ]
    assert json.dumps(policy).count("*") == 4  # nothing wider


def test_store_urls_that_would_widen_the_policy_are_refused() -> None:
    env = {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}
    for url in [
        "s3://b/*?endpoint=h:1",
        "s3://b/a%3Fb?endpoint=h:1",
        "s3://b/${aws:u}?endpoint=h:1",
    ]:
        with pytest.raises(ValueError, match="widen"):
            StsAccess.for_store(url, env)
    with pytest.raises(ValueError, match="not an s3:// URL"):
        StsAccess.for_store("file:///runs", env)
    access = StsAccess.for_store("s3://b/team/runs/?endpoint=https://h:9&encrypted=true", env)
    assert (access.endpoint_url, access.prefix) == ("https://h:9", "team/runs/")
    assert "s'" not in repr(access) and "secret_key" not in repr(access)


def test_the_secret_is_owned_by_the_run_and_says_when_it_expires() -> None:
    run = AgentRunView.from_body(
        {"metadata": {"name": "triage", "namespace": "agents", "uid": "u-1"}, "spec": {}}
    )
    credentials = RunCredentials("AK", "SK", "TOKEN", datetime(2026, 3, 1, 12, tzinfo=UTC))
    secret = credentials_secret(run, credentials)
    assert secret["metadata"]["name"] == "triage-store-credentials"
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert secret["metadata"]["annotations"] == {
        "alpineagents.dev/expires-at": "2026-03-01T12:00:00Z"
    }
    assert {k: base64.b64decode(v).decode() for k, v in secret["data"].items()} == {
        "AWS_ACCESS_KEY_ID": "AK",
        "AWS_SECRET_ACCESS_KEY": "SK",
        "AWS_SESSION_TOKEN": "TOKEN",
    }
    assert "SK" not in repr(credentials) and "TOKEN" not in repr(credentials)
    assert renew_at(credentials.expires_at, HOUR) == datetime(2026, 3, 1, 11, 30, tzinfo=UTC)


def minio_keys(server: S3Server, bucket: str) -> list[str]:
    return [str(o.object_name) for o in server.client().list_objects(bucket, recursive=True)]


# ------------------------------------------------------------------ the operator's issuer
class ClusterNamespace(NamedTuple):
    """A Cluster on the bench's kube-apiserver, a fresh namespace, and the client it uses."""

    cluster: Any
    namespace: str
    api_client: Any  # what the tests read the namespace with, beside the Cluster


@pytest.fixture
def cluster_namespace(control_plane: Any) -> Iterator[ClusterNamespace]:
    """A Cluster on the bench's kube-apiserver, and a fresh namespace in it."""
    from kubernetes import client

    from alpineagents_operator.kube.cluster import Cluster

    control_plane.apply_crds()  # the Secret's owner must exist, or the garbage collector
    api_client = control_plane.api_client()  # deletes the Secret under the test
    core = client.CoreV1Api(api_client)
    name = f"creds-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    try:
        yield ClusterNamespace(Cluster(api_client), name, api_client)
    finally:
        core.delete_namespace(name)


def agentrun_body(cluster_namespace: ClusterNamespace, store: str, attempt: int = 1) -> JSON:
    """An AgentRun created in the namespace (its uid is real), seen as Running."""
    from kubernetes import client

    created = client.CustomObjectsApi(cluster_namespace.api_client).create_namespaced_custom_object(
        "alpineagents.dev",
        "v1",
        cluster_namespace.namespace,
        "agentruns",
        {
            "apiVersion": "alpineagents.dev/v1",
            "kind": "AgentRun",
            "metadata": {"name": "triage"},
            "spec": {"model": "claude-sonnet-4-5", "prompt": "triage", "store": store},
        },
    )
    return {**created, "status": {"attempt": attempt, "phase": "Running"}}


def running_pod(run: AgentRunView) -> PodView:
    return PodView(name=f"{run.name}-{run.status.attempt}", owner_uid=run.uid, phase="Running")


def secret_of(cluster_namespace: ClusterNamespace) -> tuple[dict[str, str], dict[str, str]]:
    from kubernetes import client

    core = client.CoreV1Api(cluster_namespace.api_client)
    secret = core.read_namespaced_secret("triage-store-credentials", cluster_namespace.namespace)
    data = {k: base64.b64decode(v).decode() for k, v in secret.data.items()}
    return data, dict(secret.metadata.annotations or {})


async def test_the_issuer_writes_the_runs_secret_and_renews_it_when_due(
    minio: S3Server, minio_bucket: str, cluster_namespace: ClusterNamespace
) -> None:
    cluster = cluster_namespace[0]
    url = f"s3://{minio_bucket}/runs?endpoint={minio.endpoint}&secure=false"
    env = {"AWS_ACCESS_KEY_ID": minio.access_key, "AWS_SECRET_ACCESS_KEY": minio.secret_key}
    now = [datetime.now(UTC)]
    config = OperatorConfig(store=url, run_credentials_seconds=900)
    issuer = RunCredentialIssuer(config, cluster, env=env, clock=lambda: now[0])
    body = agentrun_body(cluster_namespace, url)
    run = AgentRunView.from_body(body)

    assert await issuer.before_pod(run, body, 1) is None
    first, annotations = secret_of(cluster_namespace)
    assert set(first) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"}
    assert first["AWS_ACCESS_KEY_ID"] != minio.access_key
    assert "alpineagents.dev/expires-at" in annotations
    # The Secret's credentials are this run's: they save its State.
    saved = save_a_state(store_with(minio, minio_bucket, as_credentials(first)), run.state_id, "x")
    assert saved.saved_entries == 1

    # The step that created the pod saw the run before it had an attempt: nothing is due.
    before = AgentRunView.from_body({**body, "status": {}})
    assert await issuer.renew_if_due(before, []) is None
    # Not due yet: nothing minted; due in about half the lifetime.
    wait = await issuer.renew_if_due(run, [running_pod(run)])
    # (The server set the expiry when it minted them, a little after the clock's start.)
    elapsed = (datetime.now(UTC) - now[0]).total_seconds()
    assert wait is not None and 400 < wait <= 450 + elapsed
    assert secret_of(cluster_namespace)[0] == first
    # Past the renewal time: new credentials in the same Secret.
    now[0] += timedelta(seconds=wait + 1)
    again = await issuer.renew_if_due(run, [running_pod(run)])
    assert again is not None and again >= 60
    renewed, _ = secret_of(cluster_namespace)
    assert renewed["AWS_ACCESS_KEY_ID"] != first["AWS_ACCESS_KEY_ID"]
    # A run with no live pod gets nothing renewed.
    assert await issuer.renew_if_due(run, []) is None
    # Each new pod (a resume) gets new credentials too, and the replaced pod's (its first
    # and its renewed ones) are revoked.
    assert await issuer.before_pod(run, body, 2) is None
    second = secret_of(cluster_namespace)[0]
    assert second["AWS_ACCESS_KEY_ID"] != renewed["AWS_ACCESS_KEY_ID"]
    for replaced in (first, renewed):
        client = client_with(minio, as_credentials(replaced))
        answer = refusal(partial(client.get_object, minio_bucket, "runs/any"))
        assert answer == (403, "InvalidAccessKeyId")
    assert store_with(minio, minio_bucket, as_credentials(second)).load(run.state_id) is not None


async def test_the_issuer_never_overwrites_a_secret_that_is_not_the_runs(
    minio: S3Server, minio_bucket: str, cluster_namespace: ClusterNamespace
) -> None:
    from kubernetes import client

    cluster, namespace, api_client = cluster_namespace
    core = client.CoreV1Api(api_client)
    core.create_namespaced_secret(
        namespace,
        {"metadata": {"name": "triage-store-credentials"}, "stringData": {"mine": "keep"}},
    )
    url = f"s3://{minio_bucket}/runs?endpoint={minio.endpoint}&secure=false"
    env = {"AWS_ACCESS_KEY_ID": minio.access_key, "AWS_SECRET_ACCESS_KEY": minio.secret_key}
    issuer = RunCredentialIssuer(OperatorConfig(store=url), cluster, env=env)
    body = agentrun_body(cluster_namespace, url)
    problem = await issuer.before_pod(AgentRunView.from_body(body), body, 1)
    assert problem is not None and "does not belong to this AgentRun" in problem
    assert secret_of(cluster_namespace)[0] == {"mine": "keep"}


async def test_shared_credentials_bring_one_warning_event(
    minio: S3Server, cluster_namespace: ClusterNamespace
) -> None:
    from kubernetes import client

    cluster, namespace, api_client = cluster_namespace
    url = f"s3://{minio.bucket}/runs?endpoint={minio.endpoint}&secure=false"
    issuer = RunCredentialIssuer(OperatorConfig(store=url, run_credentials="shared"), cluster)
    body = agentrun_body(cluster_namespace, url)
    for _ in range(3):  # three pods
        assert await issuer.before_pod(AgentRunView.from_body(body), body, 1) is None
    events = client.CoreV1Api(api_client).list_namespaced_event(namespace).items
    assert [(e.type, e.reason) for e in events] == [("Warning", "SharedStoreCredentials")]
    assert "every run pod holds the store's key" in events[0].message


def as_credentials(data: dict[str, str]) -> RunCredentials:
    return RunCredentials(
        data["AWS_ACCESS_KEY_ID"],
        data["AWS_SECRET_ACCESS_KEY"],
        data["AWS_SESSION_TOKEN"],
        datetime.now(UTC) + HOUR,
    )


async def test_the_issuer_creates_the_bucket_the_pods_credentials_cannot(
    minio: S3Server, cluster_namespace: ClusterNamespace
) -> None:
    cluster = cluster_namespace[0]
    bucket = f"new-{uuid.uuid4().hex[:12]}"  # a fresh install: nothing made the bucket yet
    url = f"s3://{bucket}/runs?endpoint={minio.endpoint}&secure=false"
    env = {"AWS_ACCESS_KEY_ID": minio.access_key, "AWS_SECRET_ACCESS_KEY": minio.secret_key}
    issuer = RunCredentialIssuer(
        OperatorConfig(store=url), cluster, env=env, open_store=lambda u: open_store(u, env)
    )
    body = agentrun_body(cluster_namespace, url)
    run = AgentRunView.from_body(body)
    try:
        assert await issuer.before_pod(run, body, 1) is None
        pod_keys = as_credentials(secret_of(cluster_namespace)[0])
        with pytest.raises(S3Error, match="AccessDenied"):
            client_with(minio, pod_keys).make_bucket("another-one")  # the pod could not
        store = MinioStore.connect(
            minio.endpoint,
            bucket,
            "runs",
            access_key=pod_keys.access_key,
            secret_key=pod_keys.secret_key,
            session_token=pod_keys.session_token,
            secure=False,
        )
        assert save_a_state(store, run.state_id, "first run of a fresh install").saved_entries
    finally:
        minio.remove_bucket(bucket)
