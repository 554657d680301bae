"""The test bench's real servers do what the rest of the suite relies on.

Kubernetes: CRDs with a status subresource keep spec and status apart, kubectl and helm
work with the bench kubeconfig, and (with the controller manager) owner references
cascade. Object stores: a create-only PUT (``If-None-Match: *``) is refused the second
time, and a stopped server comes back with its data on the same endpoint.
"""

from __future__ import annotations

import io
import json
import subprocess
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import urllib3
from minio import Minio
from minio.error import S3Error

from tests.bench.control_plane import ControllerManager, ControlPlane
from tests.bench.minio_server import S3Server
from tests.bench.testbin import KUBERNETES_VERSION, binary_path

pytestmark = pytest.mark.bench_infra

_GROUP = "bench.alpineagents.dev"
_WIDGET_CRD = textwrap.dedent(
    f"""\
    apiVersion: apiextensions.k8s.io/v1
    kind: CustomResourceDefinition
    metadata:
      name: widgets.{_GROUP}
    spec:
      group: {_GROUP}
      scope: Namespaced
      names: {{plural: widgets, singular: widget, kind: Widget}}
      versions:
        - name: v1
          served: true
          storage: true
          subresources: {{status: {{}}}}
          schema:
            openAPIV3Schema:
              type: object
              properties:
                spec:
                  type: object
                  properties: {{size: {{type: integer}}}}
                status:
                  type: object
                  properties: {{phase: {{type: string}}}}
    """
)


def _eventually(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} within {timeout:.0f}s")
        time.sleep(0.2)


# --- Kubernetes -----------------------------------------------------------------------


def test_status_subresource_is_patched_apart_from_spec(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    from kubernetes import client

    (tmp_path / "widget-crd.yaml").write_text(_WIDGET_CRD)
    assert control_plane.apply_crds(tmp_path) == [f"widgets.{_GROUP}"]
    api = client.CustomObjectsApi(control_plane.api_client())
    where: dict[str, Any] = {
        "group": _GROUP,
        "version": "v1",
        "namespace": "default",
        "plural": "widgets",
        "name": "w1",
    }
    try:
        api.create_namespaced_custom_object(
            body={
                "apiVersion": f"{_GROUP}/v1",
                "kind": "Widget",
                "metadata": {"name": "w1"},
                "spec": {"size": 1},
            },
            **{k: v for k, v in where.items() if k != "name"},
        )

        def read() -> dict[str, Any]:
            found = api.get_namespaced_custom_object(**where)
            assert isinstance(found, dict)
            return found

        created = read()

        # A status write through /status leaves spec (and generation) alone, even when
        # the patch also names a spec field.
        api.patch_namespaced_custom_object_status(
            body={"status": {"phase": "Running"}, "spec": {"size": 99}}, **where
        )
        after_status = read()
        assert after_status["status"] == {"phase": "Running"}
        assert after_status["spec"] == {"size": 1}
        assert after_status["metadata"]["generation"] == created["metadata"]["generation"]

        # A write to the main resource changes spec and ignores status.
        api.patch_namespaced_custom_object(
            body={"spec": {"size": 2}, "status": {"phase": "Overwritten"}}, **where
        )
        after_spec = read()
        assert after_spec["spec"] == {"size": 2}
        assert after_spec["status"] == {"phase": "Running"}
        assert after_spec["metadata"]["generation"] == created["metadata"]["generation"] + 1
    finally:
        control_plane.kubectl("delete", "crd", f"widgets.{_GROUP}", "--wait=true", check=False)


def test_kubectl_and_helm_talk_to_the_bench_cluster(control_plane: ControlPlane) -> None:
    versions = json.loads(control_plane.kubectl("version", "-o", "json").stdout)
    assert versions["serverVersion"]["gitVersion"] == KUBERNETES_VERSION

    namespaces = control_plane.kubectl("get", "namespaces", "-o", "name").stdout.split()
    assert "namespace/default" in namespaces

    helm = binary_path("helm")
    short = subprocess.run(
        [str(helm), "version", "--short"], capture_output=True, text=True, check=True
    )
    assert short.stdout.startswith("v3.")
    # helm list reads release secrets from the cluster, so it proves helm's access too.
    listed = subprocess.run(
        [str(helm), "list", "--all-namespaces", f"--kubeconfig={control_plane.kubeconfig}"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert listed.returncode == 0, listed.stderr


def test_pods_are_accepted_without_nodes_or_service_accounts(
    control_plane: ControlPlane,
) -> None:
    # The operator's tests create pods here: they must be stored (and stay Pending,
    # with no node to run them) even though no controller made a default ServiceAccount.
    manifest = json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "bench-pending", "namespace": "default"},
            "spec": {
                "serviceAccountName": "agent-runner",
                "containers": [{"name": "main", "image": "example.invalid/agent:1"}],
            },
        }
    )
    control_plane.kubectl("create", "-f", "-", input=manifest)
    try:
        pod = json.loads(
            control_plane.kubectl(
                "get", "pod", "bench-pending", "-n", "default", "-o", "json"
            ).stdout
        )
        assert pod["status"]["phase"] == "Pending"
        assert pod["spec"]["serviceAccountName"] == "agent-runner"
    finally:
        control_plane.kubectl(
            "delete", "pod", "bench-pending", "-n", "default", "--grace-period=0", "--force"
        )


def test_helm_template_output_passes_a_server_side_dry_run(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    chart = tmp_path / "greeter"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: greeter\nversion: 0.1.0\n")
    (chart / "values.yaml").write_text("greeting: hello\n")
    (chart / "templates" / "configmap.yaml").write_text(
        textwrap.dedent(
            """\
            apiVersion: v1
            kind: ConfigMap
            metadata:
              name: {{ .Release.Name }}-greeting
            data:
              greeting: {{ .Values.greeting | quote }}
            """
        )
    )
    rendered = subprocess.run(
        [
            str(binary_path("helm")),
            "template",
            "demo",
            str(chart),
            "--set",
            "greeting=hi there",
            f"--kubeconfig={control_plane.kubeconfig}",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert 'greeting: "hi there"' in rendered

    applied = control_plane.kubectl(
        "apply", "--dry-run=server", "-n", "default", "-f", "-", input=rendered
    )
    assert "configmap/demo-greeting created (server dry run)" in applied.stdout
    # A dry run stores nothing.
    fetched = control_plane.kubectl(
        "get", "configmap", "demo-greeting", "-n", "default", check=False
    )
    assert fetched.returncode != 0
    assert "NotFound" in fetched.stderr


def test_garbage_collector_deletes_dependents_of_a_deleted_owner(
    control_plane: ControlPlane, controller_manager: ControllerManager
) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(control_plane.api_client())
    owner = core.create_namespaced_config_map(
        "default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="gc-owner"))
    )
    assert owner.metadata is not None and owner.metadata.uid is not None
    core.create_namespaced_config_map(
        "default",
        client.V1ConfigMap(
            metadata=client.V1ObjectMeta(
                name="gc-dependent",
                owner_references=[
                    client.V1OwnerReference(
                        api_version="v1",
                        kind="ConfigMap",
                        name="gc-owner",
                        uid=owner.metadata.uid,
                    )
                ],
            )
        ),
    )
    core.delete_namespaced_config_map("gc-owner", "default")

    def dependent_gone() -> bool:
        try:
            core.read_namespaced_config_map("gc-dependent", "default")
        except ApiException as error:
            if error.status == 404:
                return True
            raise
        return False

    _eventually(dependent_gone, "garbage-collected", timeout=90)


# --- Object stores --------------------------------------------------------------------


def _put_if_absent(client: Minio, bucket: str, key: str, data: bytes) -> int:
    """PUT with ``If-None-Match: *``; returns the HTTP status (200, or 412 if it exists)."""
    try:
        response = client._execute(
            "PUT",
            bucket,
            key,
            body=data,
            headers={"If-None-Match": "*", "Content-Length": str(len(data))},
        )
    except S3Error as error:
        assert error.response is not None
        return int(error.response.status)
    return int(response.status)


@pytest.fixture(params=["minio", "seaweedfs"])
def s3_store(request: pytest.FixtureRequest) -> tuple[S3Server, str]:
    """Each object store the bench runs, with a fresh bucket on it."""
    server: S3Server = request.getfixturevalue(request.param)
    bucket: str = request.getfixturevalue(f"{request.param}_bucket")
    return server, bucket


def test_object_store_refuses_a_second_create_only_put(s3_store: tuple[S3Server, str]) -> None:
    server, bucket = s3_store
    client = server.client()
    assert _put_if_absent(client, bucket, "runs/r1/info.json", b"first") == 200
    assert _put_if_absent(client, bucket, "runs/r1/info.json", b"second") == 412
    assert client.get_object(bucket, "runs/r1/info.json").read() == b"first"


def test_object_store_keeps_its_data_across_a_stop_and_restart(
    s3_store: tuple[S3Server, str],
) -> None:
    server, bucket = s3_store
    client = server.client()
    client.put_object(bucket, "kept", io.BytesIO(b"still here"), len(b"still here"))
    endpoint = server.endpoint

    server.stop()
    assert not server.running
    # Short timeouts and no retries: the point is only that nothing answers.
    refusing = Minio(
        server.endpoint,
        access_key=server.access_key,
        secret_key=server.secret_key,
        secure=False,
        region="us-east-1",
        http_client=urllib3.PoolManager(timeout=2.0, retries=False),
    )
    with pytest.raises(urllib3.exceptions.HTTPError):
        refusing.get_object(bucket, "kept")

    server.start()
    assert server.endpoint == endpoint
    assert client.get_object(bucket, "kept").read() == b"still here"
