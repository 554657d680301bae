"""The pod that runs one attempt of an AgentRun, as a plain manifest (no API calls).

The pod is owned by its AgentRun (deleted with it), never restarted in place
(``restartPolicy: Never``: a lost attempt is replaced by a new pod, attempt + 1, that
resumes from the store), and locked down: non-root, read-only root filesystem, no
privilege escalation, no capabilities, the runtime's seccomp profile, and no
service-account token. Writable space is two emptyDirs: ``/tmp`` and the working
directory ``/work``, each with a ``sizeLimit`` (the container's disk limit). Its resources
are the operator's defaults with the AgentRun's amounts over them (:func:`run_resources`):
a run can change a limit, not remove it.

The AgentRun's spec reaches the pod as a file: a Secret per attempt (:func:`spec_secret`,
``<pod>-spec``, owned by the AgentRun, unchanged once its pod exists) mounted read-only at
:data:`SPEC_DIR`. An environment variable could not carry it: exec refuses any single
variable over 128 KiB (``Argument list too long``), so a long prompt could never start.
A Secret rather than a ConfigMap because prompts and ``spec.env`` values may be
confidential, and the ``view`` role reads ConfigMaps; it holds up to 1 MiB, and the CRD
refuses a prompt that could not fit.

Environment (the runner's contract, :mod:`alpineagents.pod_contract`):
``ALPINEAGENTS_SPEC_FILE`` (where the spec is, as JSON), ``ALPINEAGENTS_STORE``,
``ALPINEAGENTS_STATE_ID``,
``ANTHROPIC_API_KEY`` from its Secret (``secretKeyRef``), ``ANTHROPIC_BASE_URL`` when the
operator has one, ``TERMINATION_MESSAGE_PATH``, and one ``ALPINEAGENTS_MCP_*`` variable per
Secret reference of ``spec.mcpServers`` (a header or a stdio server's env value,
``secretKeyRef``: the value never passes through the AgentRun). The AgentRun's own
``spec.env`` may override the model and store variables, not the ``ALPINEAGENTS_*`` ones nor
``TERMINATION_MESSAGE_PATH``.

Store credentials: with per-run credentials (the default, for ``s3://`` stores) the pod
mounts its run's own Secret (``<run>-store-credentials``, see
:mod:`alpineagents_operator.credentials.run_credentials`) read-only at :data:`CREDENTIALS_MOUNT` and
gets ``AWS_ACCESS_KEY_ID_FILE``, ``AWS_SECRET_ACCESS_KEY_FILE`` and
``AWS_SESSION_TOKEN_FILE`` pointing there (files, so renewals reach a running pod);
it never gets the store Secret. With ``shared`` credentials it gets the store Secret's
key as ``MINIO_ACCESS_KEY``/``MINIO_SECRET_KEY`` (never as ``AWS_*``, which the AWS SDK
would take for a Bedrock run's own identity).
"""

from __future__ import annotations

import base64
import json
from typing import Any

from alpineagents.pod_contract import (
    API_VERSION,
    ENV_ATTEMPT,
    ENV_ENCRYPTION_KEYS,
    ENV_PACER,
    ENV_PACER_SHARE,
    ENV_PREFIX,
    ENV_PRICES,
    ENV_SECRET_NAMES,
    ENV_SPEC_FILE,
    ENV_STANDBY_DOORBELL,
    ENV_STANDBY_ID,
    ENV_STATE_ID,
    ENV_STORE,
    ENV_TERMINATION_MESSAGE_PATH,
    KIND,
    STANDBY_LABEL,
    TERMINATION_MESSAGE_PATH,
    mcp_secret_refs,
    provider_pod_labels,
    provider_secret_refs,
)
from alpineagents_operator.kube.config import OperatorConfig
from alpineagents_operator.kube.views import (
    ATTEMPT_LABEL,
    CONTAINER_NAME,
    JSON,
    RUN_LABEL,
    STATE_ANNOTATION,
    AgentRunView,
    credentials_secret_name,
    pod_name_for,
)

WORK_DIR = "/work"
RUN_AS_USER = 65532  # the distroless "nonroot" user
GRACE_SECONDS = 30
"""Time between SIGTERM and SIGKILL: the runner saves and exits well within it."""
SPEC_DIR = "/etc/alpineagents"
"""Where the spec Secret is mounted (read-only)."""
SPEC_KEY = "spec.json"
"""The spec's file name in :data:`SPEC_DIR` (its key in the Secret)."""
_SPEC_VOLUME = "spec"
_SPEC_FILE_MODE = 0o440  # owner and group (fsGroup): the runner's user reads it, no one else
CREDENTIALS_MOUNT = "/var/run/secrets/alpineagents/store"
CREDENTIALS_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
"""The keys of a run's credentials Secret, each a file under :data:`CREDENTIALS_MOUNT`."""
_CREDENTIALS_VOLUME = "store-credentials"
STANDBY_LABELS_DIR = "/etc/alpineagents-standby"
"""Where a standby pod sees its own labels (file ``labels``), its doorbell
(:data:`~alpineagents.pod_contract.ENV_STANDBY_DOORBELL`)."""
_LABELS_VOLUME = "standby-labels"
DEFAULT_DISK_LIMIT = "2Gi"
"""Size limit of each writable emptyDir when the container has no ephemeral-storage limit."""


MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "alpineagents-operator"
"""Every pod the operator creates carries this value of :data:`MANAGED_BY_LABEL`."""


def run_labels(run_name: str) -> dict[str, str]:
    """Labels every pod of a run carries (the operator watches pods by the run label)."""
    return {
        "app.kubernetes.io/name": "alpineagents",
        "app.kubernetes.io/component": "agent-run",
        MANAGED_BY_LABEL: MANAGED_BY,
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


def spec_secret_name(run_name: str, attempt: int) -> str:
    """The Secret holding the spec for pod ``attempt`` (``<pod>-spec``)."""
    return f"{pod_name_for(run_name, attempt)}-spec"


def spec_secret(run: AgentRunView, attempt: int) -> JSON:
    """The Secret with the AgentRun's spec for pod ``attempt``, as the pod reads it.

    One per attempt, written before its pod is created and never changed after, so a pod
    always reads the spec it was created for (spec.approvals change between attempts) and
    no kubelet cache can serve an older one. They go with the AgentRun that owns them.
    """
    text = json.dumps(dict(run.spec), sort_keys=True, ensure_ascii=False)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": spec_secret_name(run.name, attempt),
            "namespace": run.namespace,
            "labels": {**run_labels(run.name), ATTEMPT_LABEL: str(attempt)},
            "annotations": {STATE_ANNOTATION: run.state_id},
            "ownerReferences": [owner_reference(run)],
        },
        "type": "Opaque",
        "data": {SPEC_KEY: base64.b64encode(text.encode("utf-8")).decode("ascii")},
    }


def uses_run_credentials(run: AgentRunView, config: OperatorConfig) -> bool:
    """Whether the run's pods get credentials of their own (per-run mode, an S3 store)."""
    return per_run_credentials_for(store_url(run, config), config)


def per_run_credentials_for(url: str, config: OperatorConfig) -> bool:
    """Whether pods on the store at ``url`` get credentials of their own."""
    return config.per_run_credentials and url.lower().startswith("s3://")


def run_resources(run: AgentRunView | None, config: OperatorConfig) -> JSON:
    """The agent container's resources: the operator's defaults, with each amount the
    AgentRun's ``spec.resources`` gives put over them. A run may raise or lower a limit,
    never remove one: a runaway tool cannot take the node's memory or disk."""
    merged: JSON = {
        part: dict(amounts) if isinstance(amounts, dict) else amounts
        for part, amounts in config.run_resources.items()
    }
    theirs = run.spec.get("resources") if run is not None else None
    for part, amounts in theirs.items() if isinstance(theirs, dict) else ():
        mine = merged.get(part)
        if isinstance(mine, dict) and isinstance(amounts, dict):
            merged[part] = {**mine, **amounts}
        else:
            merged[part] = amounts
    return merged


def pod_manifest(run: AgentRunView, attempt: int, config: OperatorConfig) -> JSON:
    """The Pod for attempt ``attempt`` of ``run`` (name ``<run>-<attempt>``)."""
    spec = run.spec
    labels = {**provider_pod_labels(spec), **run_labels(run.name), ATTEMPT_LABEL: str(attempt)}
    metadata: JSON = {
        "name": pod_name_for(run.name, attempt),
        "namespace": run.namespace,
        "labels": labels,
        "annotations": {STATE_ANNOTATION: run.state_id},
        "ownerReferences": [owner_reference(run)],
    }
    pod = _agent_pod(
        metadata,
        command=config.pod_command,
        image=str(spec.get("image") or config.image),
        env=_env(run, attempt, config),
        resources=run_resources(run, config),
        spec_secret=spec_secret_name(run.name, attempt),
        credentials_secret=(
            credentials_secret_name(run.name) if uses_run_credentials(run, config) else None
        ),
    )
    container = pod["spec"]["containers"][0]
    if spec.get("envFrom"):
        container["envFrom"] = list(spec["envFrom"])
    service_account = spec.get("serviceAccountName") or config.service_account
    if service_account:
        pod["spec"]["serviceAccountName"] = str(service_account)
    for field in ("nodeSelector", "tolerations", "affinity"):
        if spec.get(field):
            pod["spec"][field] = spec[field]
    return pod


def standby_manifest(namespace: str, name: str, config: OperatorConfig) -> JSON:
    """A warm pool's standby pod: a run pod for no run yet (see
    :mod:`alpineagents.runner.standby`). It has what every run pod of the pool's kind has
    (the operator's image, resources, model and store settings); what a run adds (its
    spec, State id, attempt and credentials) comes later in its assignment. Its store
    credentials, in ``<name>-store-credentials``, reach only its own standby folder
    until the operator puts the run's in their place."""
    per_run = per_run_credentials_for(config.store, config)
    env: list[JSON] = [
        {"name": ENV_STANDBY_ID, "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
        {"name": ENV_STANDBY_DOORBELL, "value": f"{STANDBY_LABELS_DIR}/labels"},
        {"name": ENV_STORE, "value": config.store},
        {"name": ENV_TERMINATION_MESSAGE_PATH, "value": TERMINATION_MESSAGE_PATH},
        *_common_env(config, per_run),
    ]
    _name_secret_values(env)
    metadata: JSON = {
        "name": name,
        "namespace": namespace,
        "labels": {
            "app.kubernetes.io/name": "alpineagents",
            # As a run pod's: the same NetworkPolicy holds it (nothing may connect to it).
            "app.kubernetes.io/component": "agent-run",
            MANAGED_BY_LABEL: MANAGED_BY,
            STANDBY_LABEL: "true",
        },
    }
    pod = _agent_pod(
        metadata,
        command=config.pod_command,
        image=config.image,
        env=env,
        resources=run_resources(None, config),
        spec_secret=None,
        credentials_secret=standby_credentials_secret_name(name) if per_run else None,
    )
    # The kubelet rewrites this file within a moment of a relabelling (its hand-over):
    # the runner watches it instead of asking the store five times a second.
    pod["spec"]["containers"][0]["volumeMounts"].append(
        {"name": _LABELS_VOLUME, "mountPath": STANDBY_LABELS_DIR, "readOnly": True}
    )
    pod["spec"]["volumes"].append(
        {
            "name": _LABELS_VOLUME,
            "downwardAPI": {
                "items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]
            },
        }
    )
    if config.service_account:
        pod["spec"]["serviceAccountName"] = config.service_account
    return pod


def standby_credentials_secret_name(pod_name: str) -> str:
    """The Secret a standby pod mounts its store credentials from."""
    return f"{pod_name}-store-credentials"


def _agent_pod(
    metadata: JSON,
    *,
    command: tuple[str, ...],
    image: str,
    env: list[JSON],
    resources: JSON,
    spec_secret: str | None,
    credentials_secret: str | None,
) -> JSON:
    """The locked-down pod every runner gets (a run's or a standby's)."""
    container: JSON = {
        "name": CONTAINER_NAME,
        "image": image,
        "command": list(command),
        "workingDir": WORK_DIR,
        "env": env,
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
    volumes: list[JSON] = [
        # Bounded like the container's disk: a tool filling them is evicted, not the node.
        {"name": "tmp", "emptyDir": {"sizeLimit": _disk_limit(resources)}},
        {"name": "work", "emptyDir": {"sizeLimit": _disk_limit(resources)}},
    ]
    if spec_secret is not None:
        container["volumeMounts"].append(
            {"name": _SPEC_VOLUME, "mountPath": SPEC_DIR, "readOnly": True}
        )
        volumes.append(
            {
                "name": _SPEC_VOLUME,
                "secret": {"secretName": spec_secret, "defaultMode": _SPEC_FILE_MODE},
            }
        )
    if credentials_secret is not None:
        container["volumeMounts"].append(
            {"name": _CREDENTIALS_VOLUME, "mountPath": CREDENTIALS_MOUNT, "readOnly": True}
        )
        volumes.append(
            {
                "name": _CREDENTIALS_VOLUME,
                # Readable by the run's group only (fsGroup); updated in place by the
                # kubelet when the operator renews the credentials.
                "secret": {"secretName": credentials_secret, "defaultMode": 0o440},
            }
        )
    container["resources"] = resources
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {
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
            "volumes": volumes,
        },
    }


def _disk_limit(resources: JSON) -> str:
    limits = resources.get("limits")
    amount = limits.get("ephemeral-storage") if isinstance(limits, dict) else None
    return str(amount or DEFAULT_DISK_LIMIT)


def _secret_env(name: str, secret: str, key: str) -> JSON:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


def _common_env(config: OperatorConfig, per_run_credentials: bool) -> list[JSON]:
    """The variables every runner of this operator gets (model, prices, traces, keys,
    store credentials), run pod or standby."""
    ours: list[JSON] = []
    if config.anthropic_secret:
        ours.append(
            _secret_env("ANTHROPIC_API_KEY", config.anthropic_secret, config.anthropic_secret_key)
        )
    if config.anthropic_base_url:
        ours.append({"name": "ANTHROPIC_BASE_URL", "value": config.anthropic_base_url})
    if config.prices:
        ours.append({"name": ENV_PRICES, "value": config.prices})
    if config.pacer_url:
        # The run's share of the key is its namespace's, read by the kubelet: no run can
        # claim another's (spec.env cannot set ALPINEAGENTS_ variables).
        ours.append({"name": ENV_PACER, "value": config.pacer_url})
        ours.append(
            {
                "name": ENV_PACER_SHARE,
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
            }
        )
    ours += [{"name": k, "value": v} for k, v in config.run_otel_env.items()]  # traces
    if config.encryption_secret:
        ours.append(
            _secret_env(ENV_ENCRYPTION_KEYS, config.encryption_secret, config.encryption_secret_key)
        )
    if per_run_credentials:
        ours += [
            {"name": f"{key}_FILE", "value": f"{CREDENTIALS_MOUNT}/{key}"}
            for key in CREDENTIALS_KEYS
        ]
    elif config.store_secret and not config.per_run_credentials:
        # Under the store's own names, not AWS_*: the AWS SDK's chain would take those
        # before the pod's identity, and sign a Bedrock run's requests with the store's key.
        ours.append(_secret_env("MINIO_ACCESS_KEY", config.store_secret, config.store_access_key))
        ours.append(_secret_env("MINIO_SECRET_KEY", config.store_secret, config.store_secret_key))
    return ours


def _env(run: AgentRunView, attempt: int, config: OperatorConfig) -> list[JSON]:
    ours: list[JSON] = [
        {"name": ENV_SPEC_FILE, "value": f"{SPEC_DIR}/{SPEC_KEY}"},
        {"name": ENV_STORE, "value": store_url(run, config)},
        {"name": ENV_STATE_ID, "value": run.state_id},
        {"name": ENV_ATTEMPT, "value": str(attempt)},
        {"name": ENV_TERMINATION_MESSAGE_PATH, "value": TERMINATION_MESSAGE_PATH},
    ]
    ours.extend(_secret_env(ref.variable, ref.secret, ref.key) for ref in mcp_secret_refs(run.spec))
    ours.extend(
        _secret_env(ref.variable, ref.secret, ref.key) for ref in provider_secret_refs(run.spec)
    )
    ours += _common_env(config, uses_run_credentials(run, config))
    # The runner's contract variables are the operator's; the rest the AgentRun may override.
    fixed = {item["name"] for item in ours if str(item["name"]).startswith(ENV_PREFIX)}
    fixed |= {ENV_TERMINATION_MESSAGE_PATH, ENV_SECRET_NAMES}
    theirs: list[Any] = [
        item
        for item in run.spec.get("env") or []
        if not (isinstance(item, dict) and item.get("name") in fixed)
    ]
    taken = {item.get("name") for item in theirs if isinstance(item, dict)}
    env = [item for item in ours if item["name"] not in taken] + theirs
    _name_secret_values(env)
    return env


def _name_secret_values(env: list[Any]) -> None:
    """Tell the runner which of ``env``'s values come from Secrets (appended), so it masks
    them wherever it writes."""
    from_secrets = [
        str(item["name"])
        for item in env
        if isinstance(item, dict) and "secretKeyRef" in (item.get("valueFrom") or {})
    ]
    if from_secrets:
        env.append({"name": ENV_SECRET_NAMES, "value": ",".join(from_secrets)})
