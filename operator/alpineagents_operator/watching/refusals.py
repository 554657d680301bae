"""AgentRuns the operator refuses to act for, and why: checked before any step acts.

A refused run ends Failed at once with the reason and one Warning Event (the reconciler
calls :func:`run_refusal` before :func:`~alpineagents_operator.deciding.decide.decide`); no pod is
created, no credentials are minted and no store is contacted for it. The reasons:

``InvalidSpec``
    ``spec.env``/``spec.envFrom``/``spec.resources`` in a shape the CRD's schema lets
    through (those fields keep unknown fields) but a pod cannot take: a ``secretRef``
    given as a string, a ``secretKeyRef.name`` that is a list, two sources in one
    ``valueFrom``. Refused once here, instead of failing every step after.
``SecretNotAllowed``
    A Secret reference (``env[].valueFrom.secretKeyRef``, ``envFrom[].secretRef``, an MCP
    server's header or env ``secretKeyRef``) names a Secret that holds the operator's
    keys: one the chart lists in ``ALPINEAGENTS_PROTECTED_SECRETS`` (every Secret it
    creates or is given, such as its MinIO's root key), the store Secret (with per-run
    credentials), or the Secrets the operator writes for runs (``<run>-store-credentials``,
    ``<run>-<attempt>-spec``: another run's credentials and spec).
``ResourcesNotAllowed``
    ``spec.resources`` asks more of a resource than the platform's cap (the chart's
    ``runs.maxResources``, see :mod:`alpineagents_operator.kube.resource_caps`).
``StoreNotAllowed``
    ``spec.store`` points where the operator's key must not go (see
    :mod:`alpineagents_operator.credentials.store_policy`).
``StateIdMismatch``
    ``status.stateId`` names another State than the one derived from the run's
    namespace, name and uid. Status is writable by whoever may patch
    ``agentruns/status``; the operator never reads a State id from it, and a run whose
    status claims another one is refused rather than trusted (runs of earlier operator
    versions carry the derived id, and go on).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from alpineagents.pod_contract import state_id_for
from alpineagents_operator.credentials.store_policy import store_refusal
from alpineagents_operator.kube.config import OperatorConfig
from alpineagents_operator.kube.pods import store_url
from alpineagents_operator.kube.resource_caps import resources_over_cap
from alpineagents_operator.kube.views import TERMINAL_PHASES, AgentRunView, Refusal

__all__ = ["Refusal", "env_shape_problem", "run_refusal", "secret_names", "secret_not_allowed"]

_OPERATORS_SECRETS = re.compile(r".+-(store-credentials|[0-9]+-spec)")
"""Names of the Secrets the operator writes for runs (see ``credentials_secret_name`` and
``spec_secret_name``)."""
_VALUE_SOURCES: Mapping[str, Mapping[str, tuple[type, ...]]] = {
    # Each source's fields and their JSON types (core/v1 EnvVarSource); the first is required.
    "secretKeyRef": {"name": (str,), "key": (str,), "optional": (bool,)},
    "configMapKeyRef": {"name": (str,), "key": (str,), "optional": (bool,)},
    "fieldRef": {"fieldPath": (str,), "apiVersion": (str,)},
    "resourceFieldRef": {"resource": (str,), "containerName": (str,), "divisor": (str, int)},
}
_REQUIRED = {
    "secretKeyRef": ("name", "key"),
    "configMapKeyRef": ("name", "key"),
    "fieldRef": ("fieldPath",),
    "resourceFieldRef": ("resource",),
}
_FROM_SOURCES = ("secretRef", "configMapRef")


def run_refusal(run: AgentRunView, config: OperatorConfig) -> Refusal | None:
    """Why the operator refuses ``run`` (None: it does not). Finished and deleted runs are
    never refused: there is nothing left to start for them."""
    if run.deleting or run.status.phase in TERMINAL_PHASES:
        return None
    problem = env_shape_problem(run.spec)
    if problem is not None:
        return Refusal("InvalidSpec", problem)
    problem = _protected_secret_problem(run, config)
    if problem is not None:
        return Refusal("SecretNotAllowed", problem)
    problem = resources_over_cap(run.spec.get("resources"), config.max_run_resources)
    if problem is not None:
        return Refusal("ResourcesNotAllowed", problem)
    problem = store_refusal(store_url(run, config), config)
    if problem is not None:
        return Refusal("StoreNotAllowed", problem)
    problem = _state_id_problem(run)
    if problem is not None:
        return Refusal("StateIdMismatch", problem)
    return None


def env_shape_problem(spec: Mapping[str, Any]) -> str | None:
    """What is wrong with the shape of ``spec.env``, ``spec.envFrom`` or
    ``spec.resources`` (None: nothing). The CRD checks their outline only."""
    env = spec.get("env")
    if env is not None and not isinstance(env, list):
        return f"spec.env must be a list of variables, not {_kind(env)}"
    for index, item in enumerate(env or []):
        problem = _env_var_problem(item, f"spec.env[{index}]")
        if problem is not None:
            return problem
    env_from = spec.get("envFrom")
    if env_from is not None and not isinstance(env_from, list):
        return f"spec.envFrom must be a list of sources, not {_kind(env_from)}"
    for index, item in enumerate(env_from or []):
        problem = _env_from_problem(item, f"spec.envFrom[{index}]")
        if problem is not None:
            return problem
    return _resources_problem(spec.get("resources"))


def secret_names(spec: Mapping[str, Any]) -> list[str]:
    """Every Secret ``spec`` names: ``env[].valueFrom.secretKeyRef``,
    ``envFrom[].secretRef`` and ``mcpServers[]`` headers' and env's ``secretKeyRef`` for
    its pod, and ``notify.authSecretRef`` for the operator's notification.

    Only meaningful for a spec whose shape :func:`env_shape_problem` accepts; a name of
    another type is returned as its text, so it still cannot slip past a comparison.
    """
    names: list[Any] = []
    for item in _items(spec.get("env")):
        ref = _mapping(_mapping(item.get("valueFrom")).get("secretKeyRef"))
        if "name" in ref:
            names.append(ref["name"])
    for item in _items(spec.get("envFrom")):
        ref = _mapping(item.get("secretRef"))
        if "name" in ref:
            names.append(ref["name"])
    for server in _items(spec.get("mcpServers")):
        for field_name in ("headers", "env"):
            for item in _items(server.get(field_name)):
                ref = _mapping(item.get("secretKeyRef"))
                if "name" in ref:
                    names.append(ref["name"])
    ref = _mapping(_mapping(spec.get("notify")).get("authSecretRef"))
    if "name" in ref:
        names.append(ref["name"])
    return [name if isinstance(name, str) else repr(name) for name in names]


def secret_not_allowed(name: str, config: OperatorConfig) -> bool:
    """Whether no run may name Secret ``name`` (it holds the installation's keys, or is
    one the operator writes for runs)."""
    protected = set(config.protected_secrets)
    if config.per_run_credentials and config.store_secret:
        protected.add(config.store_secret)
    return name in protected or bool(_OPERATORS_SECRETS.fullmatch(name))


# ------------------------------------------------------------------------------ internals
def _protected_secret_problem(run: AgentRunView, config: OperatorConfig) -> str | None:
    protected = set(config.protected_secrets)
    if config.per_run_credentials and config.store_secret:
        protected.add(config.store_secret)
    for name in secret_names(run.spec):
        if name in protected:
            return (
                f"spec.env/envFrom/mcpServers/notify names Secret {name!r}, which holds keys of "
                f"the operator's installation (its store, its bundled MinIO, its model or "
                f"encryption keys): run pods get only what the operator gives them. Remove "
                f"the reference; put a value the run needs in a Secret of its own"
            )
        if _OPERATORS_SECRETS.fullmatch(name):
            return (
                f"spec.env/envFrom/mcpServers/notify names Secret {name!r}: names ending in "
                f"-store-credentials or -<number>-spec are the operator's, holding a run's "
                f"store credentials or spec. Rename your Secret (or remove the reference)"
            )
    return None


def _state_id_problem(run: AgentRunView) -> str | None:
    claimed = run.status.state_id
    derived = state_id_for(run.namespace, run.name, run.uid)
    if claimed is None or claimed == derived:
        return None
    return (
        f"status.stateId is {claimed!r}, but this AgentRun's State is {derived!r} (from its "
        f"namespace, name and uid): status was changed by someone other than the operator, "
        f"which never reads a State id from it. Create the AgentRun again"
    )


def _env_var_problem(item: Any, where: str) -> str | None:
    if not isinstance(item, Mapping):
        return f"{where} must be an object with name and value or valueFrom, not {_kind(item)}"
    name = item.get("name")
    if not isinstance(name, str) or not name:
        return f"{where}.name must be a non-empty string, not {_kind(name)}"
    unknown = sorted(set(item) - {"name", "value", "valueFrom"})
    if unknown:
        return (
            f"{where} ({name}) has unknown field(s) {', '.join(unknown)}: give value or valueFrom"
        )
    if "value" in item and not isinstance(item["value"], str):
        return f"{where}.value ({name}) must be a string, not {_kind(item['value'])}"
    if "valueFrom" not in item:
        return None
    if "value" in item:
        return f"{where} ({name}) gives both value and valueFrom: give one"
    source = item["valueFrom"]
    if not isinstance(source, Mapping) or len(source) != 1:
        return (
            f"{where}.valueFrom ({name}) must be an object with exactly one of "
            f"{', '.join(_VALUE_SOURCES)}, not {_kind(source)}"
        )
    ((kind, ref),) = source.items()
    fields = _VALUE_SOURCES.get(kind)
    if fields is None:
        return (
            f"{where}.valueFrom.{kind} ({name}) is unknown: use one of {', '.join(_VALUE_SOURCES)}"
        )
    return _ref_problem(ref, f"{where}.valueFrom.{kind}", fields, _REQUIRED[kind])


def _env_from_problem(item: Any, where: str) -> str | None:
    if not isinstance(item, Mapping):
        return f"{where} must be an object with secretRef or configMapRef, not {_kind(item)}"
    unknown = sorted(set(item) - {"prefix", *_FROM_SOURCES})
    if unknown:
        return f"{where} has unknown field(s) {', '.join(unknown)}: give secretRef or configMapRef"
    if "prefix" in item and not isinstance(item["prefix"], str):
        return f"{where}.prefix must be a string, not {_kind(item['prefix'])}"
    given = [kind for kind in _FROM_SOURCES if kind in item]
    if len(given) != 1:
        return f"{where} must give exactly one of secretRef or configMapRef"
    kind = given[0]
    fields = {"name": (str,), "optional": (bool,)}
    return _ref_problem(item[kind], f"{where}.{kind}", fields, ("name",))


def _ref_problem(
    ref: Any, where: str, fields: Mapping[str, tuple[type, ...]], required: tuple[str, ...]
) -> str | None:
    if not isinstance(ref, Mapping):
        return f"{where} must be an object like {{name: ...}}, not {_kind(ref)}"
    unknown = sorted(set(ref) - set(fields))
    if unknown:
        return f"{where} has unknown field(s) {', '.join(unknown)}; known: {', '.join(fields)}"
    for field_name in required:
        if field_name not in ref:
            return f"{where} needs {field_name}"
    for field_name, value in ref.items():
        types = fields[field_name]
        # bool is an int in Python; JSON keeps them apart.
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            return f"{where}.{field_name} must be a {types[0].__name__}, not {_kind(value)}"
        if isinstance(value, str) and not value:
            return f"{where}.{field_name} must not be empty"
    return None


def _resources_problem(resources: Any) -> str | None:
    if resources is None:
        return None
    if not isinstance(resources, Mapping):
        return f"spec.resources must be an object with requests and limits, not {_kind(resources)}"
    unknown = sorted(set(resources) - {"requests", "limits"})
    if unknown:
        return f"spec.resources has unknown field(s) {', '.join(unknown)}: give requests, limits"
    for part, amounts in resources.items():
        if not isinstance(amounts, Mapping):
            return f"spec.resources.{part} must be an object like {{memory: 1Gi}}, not {_kind(amounts)}"
        for resource, amount in amounts.items():
            if isinstance(amount, bool) or not isinstance(amount, (str, int, float)):
                return (
                    f"spec.resources.{part}.{resource} must be a quantity like '1Gi' or "
                    f"'500m', not {_kind(amount)}"
                )
    return None


def _items(value: Any) -> list[Mapping[str, Any]]:
    return [item for item in value if isinstance(item, Mapping)] if isinstance(value, list) else []


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _kind(value: Any) -> str:
    """A value's JSON kind, for messages (never the value: it may be confidential)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, list):
        return "a list"
    return "an object"
