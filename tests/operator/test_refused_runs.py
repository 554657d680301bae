"""Runs the operator refuses, on the bench: its real kube-apiserver and MinIO.

The operator holds the store's broad key. A run must not steer it: name a Secret of the
installation (the chart's MinIO root key), point ``spec.store`` at another bucket,
another run's folder or another host, or claim another run's State through
``status.stateId``. Nor may a spec the CRD lets through but no pod can take send the
operator round in circles. Each such run ends Failed with its reason and one Event, and
nothing leaves the operator for it: no pod, no credentials minted, no bucket created, no
host contacted. A run inside the bounds next to them still gets its pod and credentials.

The :class:`Reconciler` runs in this process (no kubelet: pods are only stored), as in
``test_reconciler_faults.py``; the pure rules are in ``test_refusals.py``.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml

from alpineagents import Message, State, Store, open_store
from alpineagents_operator.kube.cluster import Cluster
from alpineagents_operator.kube.config import OperatorConfig
from alpineagents_operator.kube.views import format_time
from alpineagents_operator.reconciling.reconciler import Reconciler
from tests.bench.control_plane import ControlPlane
from tests.bench.minio_server import S3Server
from tests.operator.test_reconciler_faults import Kube, status
from tests.paths import REPO

RELEASE_SECRETS = ("rel-alpineagents-minio", "rel-alpineagents-anthropic")
STORE_SECRET = "rel-alpineagents-store"
CHART_MAX_RESOURCES: dict[str, str] = yaml.safe_load(
    (REPO / "charts" / "alpineagents" / "values.yaml").read_text()
)["runs"]["maxResources"]
JSON = dict[str, Any]


@pytest.fixture
def cluster(control_plane: ControlPlane) -> Kube:
    """A fresh namespace: a resync sees this test's runs only."""
    control_plane.apply_crds()
    namespace = f"refused-{uuid.uuid4().hex[:6]}"
    control_plane.kubectl("create", "namespace", namespace)
    return Kube(control_plane, namespace)


@pytest.fixture
def store_url(minio: S3Server) -> str:
    return f"s3://{minio.bucket}/{minio.unique_prefix()}?endpoint={minio.endpoint}&secure=false"


@pytest.fixture
def opened() -> list[str]:
    """Every store URL the operator opened with its key."""
    return []


@pytest.fixture
def reconciler(
    cluster: Kube,
    minio: S3Server,
    store_url: str,
    opened: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Reconciler]:
    """The operator as the chart configures it: per-run credentials, the chart's Secrets
    protected, its broad key (MinIO's root user) in its environment."""
    root = {"AWS_ACCESS_KEY_ID": minio.access_key, "AWS_SECRET_ACCESS_KEY": minio.secret_key}
    for name, value in root.items():
        monkeypatch.setenv(name, value)  # the credential issuer reads the operator's env
    config = OperatorConfig(
        namespaces=(cluster.namespace,),
        store=store_url,
        image="alpineagents:refused",
        store_secret=STORE_SECRET,
        protected_secrets=(*RELEASE_SECRETS, STORE_SECRET),
        run_credentials_seconds=900,
        max_run_resources=CHART_MAX_RESOURCES,
    )

    def open_with_root(url: str) -> Store:
        opened.append(url)
        return open_store(url, env=root)

    reconciler = Reconciler(config, Cluster(cluster.plane.api_client()), open_store=open_with_root)
    try:
        yield reconciler
    finally:
        reconciler.close()


def run_name() -> str:
    return f"r-{uuid.uuid4().hex[:6]}"


def secret_exists(cluster: Kube, name: str) -> bool:
    from kubernetes.client.exceptions import ApiException

    try:
        cluster.core.read_namespaced_secret(name, cluster.namespace)
    except ApiException as error:
        if error.status == 404:
            return False
        raise
    return True


async def refused_once(cluster: Kube, reconciler: Reconciler, name: str, reason: str) -> JSON:
    """Reconcile the run as the operator would again and again (events, resyncs): it is
    Failed with ``reason``, one Event says so, and nothing was started for it."""
    for _ in range(2):
        await reconciler.reconcile(cluster.namespace, name)
    await reconciler.resync()
    now = status(cluster.run(name))
    assert now["phase"] == "Failed" and now["reason"] == reason, now
    assert cluster.event_reasons(name) == ["Failed"]
    assert cluster.pod_names(name) == []
    assert not secret_exists(cluster, f"{name}-store-credentials"), "credentials were minted"
    assert not secret_exists(cluster, f"{name}-1-spec")
    return now


# ------------------------------------------------------------------------------ Secrets
@pytest.mark.parametrize(
    "reference",
    [
        pytest.param({"envFrom": [{"secretRef": {"name": RELEASE_SECRETS[0]}}]}, id="envFrom"),
        pytest.param(
            {
                "env": [
                    {
                        "name": "STOLEN",
                        "valueFrom": {
                            "secretKeyRef": {"name": RELEASE_SECRETS[0], "key": "rootPassword"}
                        },
                    }
                ]
            },
            id="env",
        ),
        pytest.param(
            {
                "mcpServers": [
                    {
                        "name": "leaky",
                        "url": "http://mcp.example:8080/mcp",
                        "headers": [
                            {
                                "name": "Authorization",
                                "secretKeyRef": {"name": RELEASE_SECRETS[0], "key": "rootUser"},
                            }
                        ],
                    }
                ]
            },
            id="mcp-header",
        ),
        pytest.param({"envFrom": [{"secretRef": {"name": STORE_SECRET}}]}, id="store-secret"),
    ],
)
async def test_a_run_naming_the_charts_minio_secret_is_refused(
    cluster: Kube, reconciler: Reconciler, opened: list[str], reference: JSON
) -> None:
    name = run_name()
    cluster.create_run(name, **reference)
    failed = await refused_once(cluster, reconciler, name, "SecretNotAllowed")
    assert "Remove the reference" in failed["message"]
    assert opened == []


async def test_a_run_naming_another_runs_credentials_secret_is_refused(
    cluster: Kube, reconciler: Reconciler
) -> None:
    victim, thief = run_name(), run_name()
    cluster.create_run(victim)
    await reconciler.reconcile(cluster.namespace, victim)
    assert secret_exists(cluster, f"{victim}-store-credentials")  # it has credentials
    cluster.create_run(thief, envFrom=[{"secretRef": {"name": f"{victim}-store-credentials"}}])
    await refused_once(cluster, reconciler, thief, "SecretNotAllowed")


async def test_a_run_inside_the_bounds_still_gets_its_pod_and_credentials(
    cluster: Kube, reconciler: Reconciler, store_url: str
) -> None:
    name = run_name()
    under = store_url.replace("?", "team-a?", 1)  # a folder under the configured prefix
    cluster.create_run(name, store=under, envFrom=[{"secretRef": {"name": "team-keys"}}])
    await reconciler.reconcile(cluster.namespace, name)
    assert status(cluster.run(name))["phase"] == "Pending"
    assert cluster.pod_names(name) == [f"{name}-1"]
    assert secret_exists(cluster, f"{name}-store-credentials")


# ------------------------------------------------------------------------------ stores
@pytest.fixture
def listener() -> Iterator[tuple[int, Callable[[], bool]]]:
    """A TCP port on this machine, and whether anything connected to it."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.setblocking(False)

    def contacted() -> bool:
        try:
            connection, _ = server.accept()
        except BlockingIOError:
            return False
        connection.close()
        return True

    try:
        yield server.getsockname()[1], contacted
    finally:
        server.close()


@pytest.mark.parametrize("where", ["another-bucket", "another-runs-folder", "outside-prefix"])
async def test_a_spec_store_elsewhere_in_the_store_is_refused_before_any_request(
    cluster: Kube,
    reconciler: Reconciler,
    minio: S3Server,
    store_url: str,
    opened: list[str],
    where: str,
) -> None:
    name = run_name()
    bucket = f"t-{uuid.uuid4().hex[:16]}"
    prefix = store_url.split("/", 3)[3].split("?")[0]
    query = f"?endpoint={minio.endpoint}&secure=false"
    target = {
        "another-bucket": f"s3://{bucket}/runs{query}",
        # A prefix that is another run's State folder (its encoded id holds %2E).
        "another-runs-folder": f"s3://{minio.bucket}/{prefix}{cluster.namespace}%252Evictim%252E0a0a0a0a{query}",
        "outside-prefix": f"s3://{minio.bucket}/other-team{query}",
    }[where]
    cluster.create_run(name, store=target)
    failed = await refused_once(cluster, reconciler, name, "StoreNotAllowed")
    assert "store.allowedStores" in failed["message"]
    assert opened == []
    assert not minio.client().bucket_exists(bucket)


async def test_a_spec_store_on_another_host_is_never_contacted(
    cluster: Kube,
    reconciler: Reconciler,
    minio: S3Server,
    opened: list[str],
    listener: tuple[int, Callable[[], bool]],
) -> None:
    port, contacted = listener
    name = run_name()
    cluster.create_run(
        name, store=f"s3://{minio.bucket}/runs?endpoint=127.0.0.1:{port}&secure=false"
    )
    failed = await refused_once(cluster, reconciler, name, "StoreNotAllowed")
    assert f"127.0.0.1:{port}" in failed["message"]
    assert opened == []
    assert not contacted(), "a request signed with the operator's key went to that host"


async def test_an_encrypted_store_cannot_be_dropped_through_spec_store(
    cluster: Kube, minio: S3Server, store_url: str, opened: list[str]
) -> None:
    config = OperatorConfig(
        namespaces=(cluster.namespace,), store=store_url + "&encrypted=true", image="x:1"
    )
    reconciler = Reconciler(config, Cluster(cluster.plane.api_client()), open_store=open_store)
    try:
        name = run_name()
        cluster.create_run(name, store=store_url)  # the same place, without encryption
        failed = await refused_once(cluster, reconciler, name, "StoreNotAllowed")
        assert "encrypted=true" in failed["message"]
    finally:
        reconciler.close()


# ------------------------------------------------------------------------------ State id
async def test_a_patched_status_state_id_gives_no_access_to_that_state(
    cluster: Kube, reconciler: Reconciler, minio: S3Server, store_url: str
) -> None:
    victim, thief = run_name(), run_name()
    uid = cluster.create_run(victim)["metadata"]["uid"]
    victim_id = f"{cluster.namespace}.{victim}.{uid[:8]}"
    root = {"AWS_ACCESS_KEY_ID": minio.access_key, "AWS_SECRET_ACCESS_KEY": minio.secret_key}
    open_store(store_url, env=root).save(State(victim_id, [Message.user("secret plans")]))
    cluster.create_run(thief, restartPolicy={"initialBackoffSeconds": 0})
    # Whoever may patch agentruns/status names the victim's State and asks for a resume.
    cluster.set_status(
        thief,
        {
            "phase": "Interrupted",
            "attempt": 1,
            "pod": f"{thief}-1",
            "restarts": 1,
            "stateId": victim_id,
            "nextAttemptAt": format_time(datetime(2020, 1, 1, tzinfo=UTC)),
        },
    )
    failed = await refused_once(cluster, reconciler, thief, "StateIdMismatch")
    assert repr(victim_id) in failed["message"]
    # The status now names the thief's own State, never the victim's.
    assert failed["stateId"] != victim_id and failed["stateId"].startswith(
        f"{cluster.namespace}.{thief}."
    )
    assert cluster.pod_names(thief) == []


# ------------------------------------------------------------------------------ shapes
@pytest.mark.parametrize(
    "odd",
    [
        pytest.param({"envFrom": [{"secretRef": "team-keys"}]}, id="secretRef-a-string"),
        pytest.param(
            {"env": [{"name": "K", "valueFrom": {"secretKeyRef": {"name": ["a"], "key": "k"}}}]},
            id="secretKeyRef-name-a-list",
        ),
        pytest.param({"envFrom": [{"secretRef": {"name": {"x": 1}}}]}, id="name-an-object"),
    ],
)
async def test_an_odd_env_shape_fails_the_run_once_with_one_event(
    cluster: Kube, reconciler: Reconciler, opened: list[str], odd: JSON
) -> None:
    name = run_name()
    cluster.create_run(name, **odd)  # the CRD keeps these fields' unknown shapes
    failed = await refused_once(cluster, reconciler, name, "InvalidSpec")
    assert failed["message"].startswith("spec.env")
    assert opened == []


async def test_a_run_asking_more_than_the_charts_cap_fails_once_with_one_event(
    cluster: Kube, reconciler: Reconciler, opened: list[str]
) -> None:
    name = run_name()
    cluster.create_run(name, resources={"limits": {"memory": "64Gi"}})
    failed = await refused_once(cluster, reconciler, name, "ResourcesNotAllowed")
    cap = CHART_MAX_RESOURCES["memory"]
    assert failed["message"] == (
        f"spec.resources.limits.memory asks 64Gi, more than the {cap} the platform allows "
        "a run (the chart's runs.maxResources)"
    )
    assert opened == []
