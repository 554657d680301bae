"""The pod that runs one attempt of an AgentRun, as a plain manifest (no API calls).

The pod is owned by its AgentRun (deleted with it), never restarted in place
(``restartPolicy: Never``: a lost attempt is replaced by a new pod, attempt + 1, that
resumes from the store), and locked down: non-root, read-only root filesystem, no
privilege escalation, no capabilities, the runtime's seccomp profile, and no
service-account token. Writable space is two emptyDirs: ``/tmp`` and the working
directory ``/work``.

Environment (the runner's contract, :mod:`alpineagents.pod_contract`): ``ALPINEAGENTS_SPEC`` (the
AgentRun's spec as JSON), ``ALPINEAGENTS_STORE``, ``ALPINEAGENTS_STATE_ID``,
``ANTHROPIC_API_KEY`` and the store credentials from Secrets (``secretKeyRef``),
``ANTHROPIC_BASE_URL`` when the operator has one, ``TERMINATION_MESSAGE_PATH``, and one
``ALPINEAGENTS_MCP_*`` variable per Secret reference of ``spec.mcpServers`` (a header or a
stdio server's env value, ``secretKeyRef``: the value never passes through the
AgentRun). The AgentRun's own ``spec.env`` may override the model and store variables,
not the ``ALPINEAGENTS_*`` ones nor ``TERMINATION_MESSAGE_PATH``.
"""

from __future__ import annotations

import json
from typing import Any

from alpineagents.pod_contract import (
    API_VERSION,
    ENV_ATTEMPT,
    ENV_PREFIX,
    ENV_SPEC,
    ENV_STATE_ID,
    ENV_STORE,
    ENV_TERMINATION_MESSAGE_PATH,
    KIND,
    TERMINATION_MESSAGE_PATH,
    mcp_secret_refs,
)

from .config import OperatorConfig
from .views import (
    ATTEMPT_LABEL,
    CONTAINER_NAME,
    JSON,
    RUN_LABEL,
    STATE_ANNOTATION,
    AgentRunView,
    pod_name_for,
)

WORK_DIR = "/work"
RUN_AS_USER = 65532  # the distroless "nonroot" user
GRACE_SECONDS = 30
"""Time between SIGTERM and SIGKILL: the runner saves and exits well within it."""


def run_labels(run_name: str) -> dict[str, str]:
    """Labels every pod of a run carries (the operator watches pods by the run label)."""
    return {
        "app.kubernetes.io/name": "alpineagents",
        "app.kubernetes.io/component": "agent-run",
        "app.kubernetes.io/managed-by": "alpineagents-operator",
        RUN_LABEL: run_name,
    }


def owner_reference(run: AgentRunView) -> JSON:
    """The pod's owner: its AgentRun, as the controller (garbage-collected with it)."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": run.name,
        "uid": run.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def store_url(run: AgentRunView, config: OperatorConfig) -> str:
    """Where the run's State is saved: ``spec.store``, or the operator's default."""
    return str(run.spec.get("store") or config.store)


def pod_manifest(run: AgentRunView, attempt: int, config: OperatorConfig) -> JSON:
    """The Pod for attempt ``attempt`` of ``run`` (name ``<run>-<attempt>``)."""
    spec = run.spec
    labels = {**run_labels(run.name), ATTEMPT_LABEL: str(attempt)}
    container: JSON = {
        "name": CONTAINER_NAME,
        "image": str(spec.get("image") or config.image),
        "command": list(config.pod_command),
        "workingDir": WORK_DIR,
        "env": _env(run, attempt, config),
        "terminationMessagePath": TERMINATION_MESSAGE_PATH,
        # A crash before the runner wrote its report still leaves a reason behind.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_USER,
            "runAsGroup": RUN_AS_USER,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "work", "mountPath": WORK_DIR},
        ],
    }
    if spec.get("envFrom"):
        container["envFrom"] = list(spec["envFrom"])
    if spec.get("resources"):
        container["resources"] = dict(spec["resources"])
    pod_spec: JSON = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": GRACE_SECONDS,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_USER,
            "runAsGroup": RUN_AS_USER,
            "fsGroup": RUN_AS_USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [
            {"name": "tmp", "emptyDir": {}},
            {"name": "work", "emptyDir": {}},
        ],
    }
    service_account = spec.get("serviceAccountName") or config.service_account
    if service_account:
        pod_spec["serviceAccountName"] = str(service_account)
    for field in ("nodeSelector", "tolerations", "affinity"):
        if spec.get(field):
            pod_spec[field] = spec[field]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name_for(run.name, attempt),
            "namespace": run.namespace,
            "labels": labels,
            "annotations": {STATE_ANNOTATION: run.state_id},
            "ownerReferences": [owner_reference(run)],
        },
        "spec": pod_spec,
    }


def _secret_env(name: str, secret: str, key: str) -> JSON:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


def _env(run: AgentRunView, attempt: int, config: OperatorConfig) -> list[JSON]:
    ours: list[JSON] = [
        {"name": ENV_SPEC, "value": json.dumps(dict(run.spec), sort_keys=True)},
        {"name": ENV_STORE, "value": store_url(run, config)},
        {"name": ENV_STATE_ID, "value": run.state_id},
        {"name": ENV_ATTEMPT, "value": str(attempt)},
        {"name": ENV_TERMINATION_MESSAGE_PATH, "value": TERMINATION_MESSAGE_PATH},
    ]
    ours.extend(_secret_env(ref.variable, ref.secret, ref.key) for ref in mcp_secret_refs(run.spec))
    if config.anthropic_secret:
        ours.append(
            _secret_env("ANTHROPIC_API_KEY", config.anthropic_secret, config.anthropic_secret_key)
        )
    if config.anthropic_base_url:
        ours.append({"name": "ANTHROPIC_BASE_URL", "value": config.anthropic_base_url})
    if config.store_secret:
        ours.append(_secret_env("AWS_ACCESS_KEY_ID", config.store_secret, config.store_access_key))
        ours.append(
            _secret_env("AWS_SECRET_ACCESS_KEY", config.store_secret, config.store_secret_key)
        )
    # The runner's contract variables are the operator's; the rest the AgentRun may override.
    fixed = {item["name"] for item in ours if str(item["name"]).startswith(ENV_PREFIX)}
    fixed.add(ENV_TERMINATION_MESSAGE_PATH)
    theirs: list[Any] = [
        item
        for item in run.spec.get("env") or []
        if not (isinstance(item, dict) and item.get("name") in fixed)
    ]
    taken = {item.get("name") for item in theirs if isinstance(item, dict)}
    return [item for item in ours if item["name"] not in taken] + theirs
