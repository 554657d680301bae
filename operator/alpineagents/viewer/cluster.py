"""The viewer's view of a cluster: AgentRuns read, and approvals written, as their user.

It uses the user's own kubeconfig (``--context`` picks a context), like ``kubectl``: no
login and no secret of its own, and only what that user may do. In a pod (the chart's
viewer) it is the pod's ServiceAccount instead, with what the chart's Role grants. An approval is written
as ``kubectl patch agentrun NAME --type merge -p '{"spec": {"approvals": [...]}}'``
would, with the resourceVersion it read, so an answer given meanwhile is never lost.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from alpineagents.pod_contract import GROUP, PLURAL, VERSION, PendingApproval, state_id_for

JSON = dict[str, Any]
_TIMEOUT = (5, 20)  # (connect, read) seconds for one API call
_MERGE_PATCH = "application/merge-patch+json"
_POD_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


class ClusterError(Exception):
    """The cluster could not be read or refused a change; the message says which and why."""


@dataclass(frozen=True)
class ClusterRun:
    """One AgentRun as the viewer shows it."""

    namespace: str
    name: str
    state_id: str
    phase: str | None = None
    reason: str | None = None
    message: str | None = None
    attempt: int = 0
    restarts: int = 0
    created_at: datetime | None = None
    usage: Mapping[str, int] = field(default_factory=dict)
    pending_approvals: tuple[str, ...] = ()
    approvals: tuple[Mapping[str, Any], ...] = ()
    resource_version: str = ""

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> ClusterRun:
        """The run of an AgentRun as the API server returns it (a JSON dict)."""
        meta = _mapping(body.get("metadata"))
        spec = _mapping(body.get("spec"))
        status = _mapping(body.get("status"))
        namespace = str(meta.get("namespace") or "default")
        name = str(meta.get("name") or "")
        usage = _mapping(status.get("usage"))
        approvals = spec.get("approvals")
        return cls(
            namespace=namespace,
            name=name,
            state_id=str(
                status.get("stateId") or state_id_for(namespace, name, str(meta.get("uid") or ""))
            ),
            phase=str(status.get("phase") or "") or None,
            reason=status.get("reason") or None,
            message=status.get("message") or None,
            attempt=int(status.get("attempt") or 0),
            restarts=int(status.get("restarts") or 0),
            created_at=_parse_time(meta.get("creationTimestamp")),
            usage={
                "input_tokens": int(usage.get("inputTokens") or 0),
                "output_tokens": int(usage.get("outputTokens") or 0),
            },
            pending_approvals=tuple(
                p.call_id for p in PendingApproval.parse_all(status.get("pendingApprovals"))
            ),
            approvals=tuple(a for a in approvals if isinstance(a, Mapping))
            if isinstance(approvals, list)
            else (),
            resource_version=str(meta.get("resourceVersion") or ""),
        )

    def to_json(self) -> JSON:
        return {
            "namespace": self.namespace,
            "name": self.name,
            "state_id": self.state_id,
            "phase": self.phase,
            "reason": self.reason,
            "message": self.message,
            "attempt": self.attempt,
            "restarts": self.restarts,
            "created_at": self.created_at.isoformat() if self.created_at else None,
            "usage": dict(self.usage),
            "pending_approvals": list(self.pending_approvals),
        }


@dataclass(frozen=True)
class Answer:
    """A person's answer to one tool call that waits for approval."""

    call_id: str
    allow: bool
    note: str = ""


def approvals_patch(run: ClusterRun, answers: Sequence[Answer]) -> JSON:
    """The merge patch that adds ``answers`` to ``spec.approvals``.

    A merge patch replaces a list whole, so it carries every answer the run has, and the
    resourceVersion it read: the API server refuses it (409) if the run changed since.
    """
    answered = {answer.call_id for answer in answers}
    kept = [dict(a) for a in run.approvals if a.get("callId") not in answered]
    added: list[JSON] = []
    for answer in answers:
        item: JSON = {"callId": answer.call_id, "allow": answer.allow}
        if answer.note:
            item["note"] = answer.note
        added.append(item)
    return {
        "metadata": {"resourceVersion": run.resource_version},
        "spec": {"approvals": [*kept, *added]},
    }


class Cluster:
    """AgentRuns in the namespaces the kubeconfig's user may list."""

    def __init__(self, api_client: Any, namespaces: Sequence[str] = ()) -> None:
        from kubernetes import client

        self._api_client = api_client
        self._custom: Any = client.CustomObjectsApi(api_client)
        self.namespaces = tuple(namespaces)
        """Only these namespaces; none: every namespace the user may list, else the
        context's."""
        self.context_namespace = "default"
        self.where = ""
        """The context and server, for the page's header."""

    @classmethod
    def from_kubeconfig(
        cls, path: str | None = None, context: str | None = None, namespaces: Sequence[str] = ()
    ) -> Cluster:
        """The cluster of ``context`` (default: the current one) in the kubeconfig at ``path``
        (default: ``$KUBECONFIG``, else ``~/.kube/config``)."""
        from kubernetes import config as _config

        config: Any = _config  # its loaders are untyped
        try:
            api_client = config.new_client_from_config(config_file=path, context=context)
            contexts, active = config.list_kube_config_contexts(config_file=path)
        except Exception as error:
            raise ClusterError(f"kubeconfig: {error}") from None
        chosen = next((c for c in contexts if c.get("name") == context), active) or {}
        cluster = cls(api_client, namespaces)
        cluster.context_namespace = str((chosen.get("context") or {}).get("namespace") or "default")
        cluster.where = f"{chosen.get('name', '?')} ({api_client.configuration.host})"
        return cluster

    @classmethod
    def in_cluster(cls, namespaces: Sequence[str] = ()) -> Cluster:
        """The cluster this pod runs in, as its ServiceAccount (the chart's viewer)."""
        from kubernetes import client
        from kubernetes import config as _config

        config: Any = _config  # its loaders are untyped
        try:
            config.load_incluster_config()
            namespace = Path(_POD_NAMESPACE).read_text(encoding="utf-8").strip()
        except Exception as error:
            raise ClusterError(f"not in a pod with a ServiceAccount token: {error}") from None
        api_client = client.ApiClient()
        cluster = cls(api_client, namespaces)
        cluster.context_namespace = namespace or "default"
        cluster.where = f"this cluster ({api_client.configuration.host})"
        return cluster

    def close(self) -> None:
        self._api_client.close()

    def runs(self) -> list[ClusterRun]:
        """Every AgentRun the user may list: in ``namespaces``, else in all namespaces, else
        (when listing all is forbidden) in the context's namespace."""
        from kubernetes.client.exceptions import ApiException

        try:
            if not self.namespaces:
                try:
                    listing = self._custom.list_cluster_custom_object(
                        GROUP, VERSION, PLURAL, _request_timeout=_TIMEOUT
                    )
                except ApiException as error:
                    if error.status != 403:
                        raise
                    listing = self._list_in(self.context_namespace)
            else:
                items = [i for n in self.namespaces for i in self._list_in(n).get("items") or []]
                listing = {"items": items}
        except ApiException as error:
            raise ClusterError(f"listing AgentRuns: {_api_message(error)}") from None
        except Exception as error:
            raise ClusterError(f"listing AgentRuns: {type(error).__name__}: {error}") from None
        return [ClusterRun.from_body(item) for item in listing.get("items") or []]

    def run_of(self, state_id: str) -> ClusterRun | None:
        """The AgentRun whose saved State is ``state_id``, if there is one."""
        return next((run for run in self.runs() if run.state_id == state_id), None)

    def approve(self, run: ClusterRun, answers: Sequence[Answer]) -> None:
        """Add a person's answers to the run's ``spec.approvals`` (one merge patch)."""
        from kubernetes.client.exceptions import ApiException

        try:
            response = self._custom.patch_namespaced_custom_object(
                GROUP,
                VERSION,
                run.namespace,
                PLURAL,
                run.name,
                approvals_patch(run, answers),
                _content_type=_MERGE_PATCH,
                _preload_content=False,
                _request_timeout=_TIMEOUT,
            )
            try:
                bytes(response.data)
            finally:
                response.release_conn()
        except ApiException as error:
            if error.status == 409:
                raise ClusterError(
                    f"AgentRun {run.namespace}/{run.name} changed while you answered: "
                    f"reload and answer again"
                ) from None
            raise ClusterError(
                f"patching AgentRun {run.namespace}/{run.name}: {_api_message(error)}"
            ) from None

    def _list_in(self, namespace: str) -> JSON:
        listing: JSON = self._custom.list_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, _request_timeout=_TIMEOUT
        )
        return listing


def _api_message(error: Any) -> str:
    try:
        return f"{error.status} {json.loads(error.body)['message']}"
    except (ValueError, KeyError, TypeError):
        return f"{error.status} {error.reason}"


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _parse_time(value: Any) -> datetime | None:
    """A Kubernetes timestamp (RFC 3339, ``Z`` for UTC), or None."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
