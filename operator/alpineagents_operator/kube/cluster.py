"""The operator's few Kubernetes calls, on JSON dicts, with the official (sync) client.

Every read here goes to the API server, not to a watch cache: a reconcile step looks at
what is, including the pod it created a moment ago. The methods block; the reconciler
calls them on worker threads.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import socket
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from alpineagents.pod_contract import STANDBY_LABEL
from alpineagents_operator.kube.views import GROUP, JSON, KIND, PLURAL, RUN_LABEL, VERSION, RunEvent

_log = logging.getLogger(__name__)
_MERGE_PATCH = "application/merge-patch+json"
_TIMEOUT = (10, 60)  # (connect, read) seconds: a hung API call must not stall a run forever
COMPONENT = "alpineagents-operator"
CALL_THREADS = 32
"""Threads making the operator's blocking calls, and API connections kept open for them
(the client's own pool holds 5 per CPU: calls beyond it wait for or open a connection)."""


def api_client_from_environment() -> Any:
    """A ``kubernetes.client.ApiClient``: in-cluster credentials inside a pod, else the
    kubeconfig (``$KUBECONFIG`` or ``~/.kube/config``)."""
    from kubernetes import client
    from kubernetes import config as _config

    config: Any = _config  # its loaders are untyped
    configuration = client.Configuration()
    if os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG"):
        config.load_incluster_config(client_configuration=configuration)
    else:
        config.load_kube_config(client_configuration=configuration)
    configuration.connection_pool_maxsize = CALL_THREADS
    return client.ApiClient(configuration)


class SecretConflict(Exception):
    """A Secret the operator wanted to write exists and belongs to something else."""


class StatusConflict(Exception):
    """A conditional status patch found the run changed since it was read."""


class PodRefused(Exception):
    """The API server refused a pod or its spec Secret (invalid, too large, or forbidden
    by a quota or policy)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"pod refused ({status}): {message}")
        self.status = status
        self.message = message


def failure_text(error: BaseException) -> str:
    """One line saying what went wrong: an API server's answer as its code and message
    (without the headers, which differ every time), anything else as type and text."""
    from kubernetes.client.exceptions import ApiException

    if isinstance(error, ApiException):
        return f"the API server answered {error.status}: {_api_message(error)}"
    return f"{type(error).__name__}: {error}"


def _api_message(error: Any) -> str:
    try:
        return str(json.loads(error.body)["message"])
    except (ValueError, KeyError, TypeError):
        return str(error.reason or error)


def _finish(response: Any) -> bytes:
    """Read a raw response to its end, then give its connection back to the pool.

    A connection handed back with part of a body unread would give the next request on
    it that rest as its status line.
    """
    try:
        return bytes(response.data)
    finally:
        response.release_conn()


class Cluster:
    """Reads and writes AgentRuns, their pods and Events."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self._api_client = api_client
        self._core: Any = client.CoreV1Api(api_client)
        self._custom: Any = client.CustomObjectsApi(api_client)
        self._rbac: Any = client.RbacAuthorizationV1Api(api_client)
        self._instance = socket.gethostname()

    def close(self) -> None:
        self._api_client.close()

    @property
    def api_client(self) -> Any:
        """The ``kubernetes.client.ApiClient`` this talks through (for other APIs' calls)."""
        return self._api_client

    # ------------------------------------------------------------------ AgentRuns
    def get_run(self, namespace: str, name: str) -> JSON | None:
        """The AgentRun, or None if there is none."""
        from kubernetes.client.exceptions import ApiException

        try:
            body: JSON = self._custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, _request_timeout=_TIMEOUT
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return body

    def namespace_annotations(self, namespace: str) -> dict[str, str] | None:
        """The Namespace's annotations (None: no such Namespace)."""
        from kubernetes.client.exceptions import ApiException

        try:
            body = self._core.read_namespace(namespace, _request_timeout=_TIMEOUT)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return dict(body.metadata.annotations or {})

    def list_runs(self, namespace: str | None) -> list[JSON]:
        """All AgentRuns in ``namespace`` (None: every namespace)."""
        if namespace is None:
            listing = self._custom.list_cluster_custom_object(
                GROUP, VERSION, PLURAL, _request_timeout=_TIMEOUT
            )
        else:
            listing = self._custom.list_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, _request_timeout=_TIMEOUT
            )
        return list(listing.get("items") or [])

    def patch_status(self, namespace: str, name: str, patch: Mapping[str, Any]) -> JSON | None:
        """Merge-patch the AgentRun's status subresource; returns the run as the API
        server answered (None if the run is gone).

        A merge patch changes only the fields it names, so the operator never sends a
        whole status it read earlier (and never clobbers a newer write).
        """
        from kubernetes.client.exceptions import ApiException

        try:
            response = self._custom.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                {"status": dict(patch)},
                _content_type=_MERGE_PATCH,
                _preload_content=False,
                _request_timeout=_TIMEOUT,
            )
            answered: JSON = json.loads(_finish(response))
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return answered

    def patch_status_at(
        self, namespace: str, name: str, resource_version: str, patch: Mapping[str, Any]
    ) -> JSON | None:
        """:meth:`patch_status` only if the run is still at ``resource_version``: raises
        :class:`StatusConflict` if anything wrote to it since (None: the run is gone).

        How a mark that must be written once (a notification's claim) is written once,
        by one operator, however many read the same run at the same time."""
        from kubernetes.client.exceptions import ApiException

        try:
            response = self._custom.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                {"metadata": {"resourceVersion": resource_version}, "status": dict(patch)},
                _content_type=_MERGE_PATCH,
                _preload_content=False,
                _request_timeout=_TIMEOUT,
            )
            answered: JSON = json.loads(_finish(response))
        except ApiException as error:
            if error.status == 404:
                return None
            if error.status == 409:
                raise StatusConflict(
                    f"{namespace}/{name} changed since {resource_version}"
                ) from None
            raise
        return answered

    def delete_run(self, namespace: str, name: str, uid: str) -> bool:
        """Delete the AgentRun if it is still the one with ``uid`` (a run made again under
        the same name is not); False if it is gone or another. Its finalizers (the saved
        State's, with ``onDelete: Delete``) run as for a deletion by hand."""
        from kubernetes.client.exceptions import ApiException

        try:
            _finish(
                self._custom.delete_namespaced_custom_object(
                    GROUP,
                    VERSION,
                    namespace,
                    PLURAL,
                    name,
                    body={"preconditions": {"uid": uid}, "propagationPolicy": "Background"},
                    _preload_content=False,
                    _request_timeout=_TIMEOUT,
                )
            )
        except ApiException as error:
            if error.status in (404, 409):
                return False
            raise
        return True

    def secret_value(self, namespace: str, name: str, key: str) -> str | None:
        """One value of a Secret, decoded (None: no such Secret or key; PermissionError:
        the operator may not read it). Only a run's notification reads one (its auth
        header, see :mod:`.notifications`); the value is never logged."""
        from kubernetes.client.exceptions import ApiException

        try:
            response = self._core.read_namespaced_secret(
                name, namespace, _preload_content=False, _request_timeout=_TIMEOUT
            )
            secret = json.loads(_finish(response))
        except ApiException as error:
            if error.status == 404:
                return None
            if error.status == 403:
                raise PermissionError(f"the operator may not read Secrets in {namespace}") from None
            raise
        encoded = (secret.get("data") or {}).get(key)
        if not isinstance(encoded, str):
            return None
        return base64.b64decode(encoded).decode("utf-8", errors="replace")

    # ------------------------------------------------------------------ pods
    def list_pods(self, namespace: str, run_name: str) -> list[JSON]:
        """The pods labelled with ``run_name`` (of any owner)."""
        response = self._core.list_namespaced_pod(
            namespace,
            label_selector=f"{RUN_LABEL}={run_name}",
            _preload_content=False,
            _request_timeout=_TIMEOUT,
        )
        listing = json.loads(_finish(response))
        return list(listing.get("items") or [])

    def list_run_pods_page(
        self, namespace: str | None, limit: int, token: str = ""
    ) -> tuple[list[JSON], str]:
        """One page of every pod carrying a run label, in ``namespace`` (None: every
        namespace): its pods, and the token for the next page ("" after the last)."""
        options: dict[str, Any] = {
            "label_selector": RUN_LABEL,
            "limit": limit,
            "_preload_content": False,
            "_request_timeout": _TIMEOUT,
        }
        if token:
            options["_continue"] = token
        if namespace is None:
            response = self._core.list_pod_for_all_namespaces(**options)
        else:
            response = self._core.list_namespaced_pod(namespace, **options)
        listing = json.loads(_finish(response))
        return list(listing.get("items") or []), str(
            (listing.get("metadata") or {}).get("continue") or ""
        )

    def create_pod(self, manifest: Mapping[str, Any]) -> bool:
        """Create a pod; False if one with that name exists already (it is adopted)."""
        from kubernetes.client.exceptions import ApiException

        namespace = manifest["metadata"]["namespace"]
        try:
            response = self._core.create_namespaced_pod(
                namespace, dict(manifest), _preload_content=False, _request_timeout=_TIMEOUT
            )
            _finish(response)
        except ApiException as error:
            if error.status == 409:
                return False
            if error.status in (400, 403, 422):
                raise PodRefused(int(error.status), _api_message(error)) from None
            raise
        return True

    def delete_pod(self, namespace: str, name: str) -> None:
        """Delete a pod gracefully (its own terminationGracePeriodSeconds); gone is fine."""
        from kubernetes.client.exceptions import ApiException

        try:
            response = self._core.delete_namespaced_pod(
                name, namespace, _preload_content=False, _request_timeout=_TIMEOUT
            )
            _finish(response)
        except ApiException as error:
            if error.status != 404:
                raise

    # ------------------------------------------------------------------ the warm pool
    def list_standbys(self, namespace: str) -> list[JSON]:
        """The warm pool's pods in ``namespace``, waiting ones and those handed a run."""
        response = self._core.list_namespaced_pod(
            namespace,
            label_selector=STANDBY_LABEL,
            _preload_content=False,
            _request_timeout=_TIMEOUT,
        )
        listing = json.loads(_finish(response))
        return list(listing.get("items") or [])

    def create_standby(self, manifest: Mapping[str, Any]) -> JSON:
        """Create a standby pod; returns it as created (its uid names its store folder)."""
        response = self._core.create_namespaced_pod(
            manifest["metadata"]["namespace"],
            dict(manifest),
            _preload_content=False,
            _request_timeout=_TIMEOUT,
        )
        created: JSON = json.loads(_finish(response))
        return created

    def rbac_owner(self, namespace: str, kind: str, name: str) -> JSON:
        """An owner reference to the ``Role`` ``name`` in ``namespace`` or the
        ``ClusterRole`` ``name`` (what owns waiting standbys, see
        :attr:`~.config.OperatorConfig.warm_pool_owner`)."""
        if kind == "Role":
            response = self._rbac.read_namespaced_role(
                name, namespace, _preload_content=False, _request_timeout=_TIMEOUT
            )
        else:
            response = self._rbac.read_cluster_role(
                name, _preload_content=False, _request_timeout=_TIMEOUT
            )
        meta = json.loads(_finish(response))["metadata"]
        return {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": kind,
            "name": name,
            "uid": meta["uid"],
        }

    def hand_standby(
        self,
        namespace: str,
        name: str,
        labels: Mapping[str, str],
        owner: JSON,
        annotations: Mapping[str, str],
    ) -> bool:
        """Turn a waiting standby pod into a run's pod: its labels and its owner (the run
        alone, in place of the pool's owner). Only if it is still waiting (a JSON-patch ``test`` of its standby label); False if it is not
        (taken, or gone)."""
        from kubernetes.client.exceptions import ApiException

        patch: list[JSON] = [
            {"op": "test", "path": _STANDBY_LABEL_PATH, "value": "true"},
            {"op": "replace", "path": _STANDBY_LABEL_PATH, "value": "taken"},
            *(
                {"op": "add", "path": "/metadata/labels/" + _pointer(key), "value": value}
                for key, value in labels.items()
            ),
            {"op": "add", "path": "/metadata/ownerReferences", "value": [dict(owner)]},
            {"op": "add", "path": "/metadata/annotations", "value": dict(annotations)},
        ]
        try:
            _finish(
                self._core.patch_namespaced_pod(
                    name,
                    namespace,
                    patch,
                    _content_type="application/json-patch+json",
                    _preload_content=False,
                    _request_timeout=_TIMEOUT,
                )
            )
        except ApiException as error:
            if error.status in (404, 422):
                return False
            raise
        return True

    def delete_secret(self, namespace: str, name: str) -> None:
        """Delete a Secret; gone is fine."""
        from kubernetes.client.exceptions import ApiException

        try:
            _finish(
                self._core.delete_namespaced_secret(
                    name, namespace, _preload_content=False, _request_timeout=_TIMEOUT
                )
            )
        except ApiException as error:
            if error.status != 404:
                raise

    # ------------------------------------------------------------------ Secrets
    def apply_secret(self, manifest: Mapping[str, Any], *, probably_exists: bool = False) -> None:
        """Create the Secret, or replace the data and annotations of the one there.

        The operator may create and patch Secrets, never read them. A Secret that exists
        is only changed if its first owner is the same object (a JSON-patch ``test``), so
        a Secret of someone else's with that name is never overwritten: that raises
        :class:`SecretConflict`. With ``probably_exists`` the patch is tried first (one
        request instead of two when it does exist).
        """
        from kubernetes.client.exceptions import ApiException

        if probably_exists:
            try:
                self._patch_secret(manifest)
                return
            except ApiException as error:
                if error.status != 404:
                    raise
        try:
            _finish(
                self._core.create_namespaced_secret(
                    manifest["metadata"]["namespace"],
                    dict(manifest),
                    _preload_content=False,
                    _request_timeout=_TIMEOUT,
                )
            )
            return
        except ApiException as error:
            if error.status != 409:
                raise
        self._patch_secret(manifest)

    def _patch_secret(self, manifest: Mapping[str, Any]) -> None:
        from kubernetes.client.exceptions import ApiException

        meta = manifest["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        owner_uid = meta["ownerReferences"][0]["uid"]
        patch = [
            {"op": "test", "path": "/metadata/ownerReferences/0/uid", "value": owner_uid},
            {"op": "replace", "path": "/data", "value": dict(manifest["data"])},
            {"op": "replace", "path": "/metadata/annotations", "value": dict(meta["annotations"])},
        ]
        try:
            _finish(
                self._core.patch_namespaced_secret(
                    name,
                    namespace,
                    patch,
                    _content_type="application/json-patch+json",
                    _preload_content=False,
                    _request_timeout=_TIMEOUT,
                )
            )
        except ApiException as error:
            if error.status == 422:  # the test failed: not ours (or has no owner)
                raise SecretConflict(
                    f"Secret {namespace}/{name} exists and does not belong to this AgentRun; "
                    f"rename or delete it so the run's credentials can go there"
                ) from None
            raise

    def apply_pod_secret(self, manifest: Mapping[str, Any]) -> None:
        """:meth:`apply_secret` for a Secret a pod cannot start without (its spec): the
        API server refusing it (400/413/422: over 1 MiB, ...) or a Secret of that name
        owned by something else raise :class:`PodRefused`, as a refused pod would."""
        from kubernetes.client.exceptions import ApiException

        name = manifest["metadata"]["name"]
        try:
            self.apply_secret(manifest)
        except SecretConflict:
            raise PodRefused(
                409,
                f"its Secret {name} exists and does not belong to this AgentRun; rename or "
                f"delete that Secret",
            ) from None
        except ApiException as error:
            if error.status in (400, 413, 422):
                raise PodRefused(
                    int(error.status), f"its Secret {name}: {_api_message(error)}"
                ) from None
            raise

    # ------------------------------------------------------------------ Events
    def post_event(self, run: Mapping[str, Any], event: RunEvent) -> None:
        """Post a core/v1 Event about the AgentRun ``run`` (its JSON body; an object of
        another kind of ours, such as an AgentSchedule, names its own ``kind``)."""
        meta = run.get("metadata") or {}
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")  # core/v1 Events: seconds
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "generateName": f"{meta.get('name')}.",
                "namespace": meta.get("namespace"),
            },
            "involvedObject": {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": run.get("kind") or KIND,
                "name": meta.get("name"),
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
            },
            "type": event.type,
            "reason": event.reason,
            "message": event.message[:1024],
            "source": {"component": COMPONENT},
            "reportingComponent": f"{GROUP}/operator",
            "reportingInstance": self._instance,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            response = self._core.create_namespaced_event(
                meta.get("namespace"), body, _preload_content=False, _request_timeout=_TIMEOUT
            )
            _finish(response)
        except Exception as error:  # an Event is a courtesy: never fail a step for it
            _log.warning("could not post Event %s on %s: %s", event.reason, meta.get("name"), error)


_STANDBY_LABEL_PATH = "/metadata/labels/" + STANDBY_LABEL.replace("/", "~1")


def _pointer(key: str) -> str:
    """``key`` as one JSON-pointer step (``/`` and ``~`` escaped)."""
    return key.replace("~", "~0").replace("/", "~1")
