"""The operator's configuration, read once from its environment.

Every setting has an environment variable (the Helm chart sets them) and a default that
works on a laptop against a kind cluster. Secrets are named, never read: the operator
only puts ``secretKeyRef``s into the pods it creates, so a Secret named here must exist
in each namespace where AgentRuns run.

=====================================  ==============================================
``ALPINEAGENTS_NAMESPACES``            comma-separated namespaces to watch (glob
                                       patterns allowed); empty = the whole cluster
``ALPINEAGENTS_IMAGE``                 runner image for pods whose AgentRun has no
                                       ``spec.image``
``ALPINEAGENTS_STORE``                 store URL for AgentRuns without ``spec.store``
``ALPINEAGENTS_ANTHROPIC_SECRET``      Secret holding the model API key ("" = none)
``ALPINEAGENTS_ANTHROPIC_SECRET_KEY``  its key (default ``ANTHROPIC_API_KEY``)
``ALPINEAGENTS_STORE_SECRET``          Secret with the store's credentials ("" = none)
``ALPINEAGENTS_STORE_ACCESS_KEY``      its key for AWS_ACCESS_KEY_ID
``ALPINEAGENTS_STORE_SECRET_KEY``      its key for AWS_SECRET_ACCESS_KEY
``ANTHROPIC_BASE_URL``                 passed on to pods when set
``ALPINEAGENTS_PACER``                 the shared limiter's URL, passed on to pods (""
                                       = none: runs pace by the model's headers)
``ALPINEAGENTS_POD_COMMAND``           JSON list, the pods' command
``ALPINEAGENTS_RESYNC_SECONDS``        safety-net period: every run is looked at this
                                       often (from the watches, no request) and
                                       reconciled if a step would change something
``ALPINEAGENTS_METRICS_PORT``          Prometheus port (0 = no metrics server)
``ALPINEAGENTS_HEALTH_PORT``           liveness endpoint port (0 = none)
``ALPINEAGENTS_PEERING``               kopf peering name; empty (default) = standalone
``ALPINEAGENTS_SERVICE_ACCOUNT``       default serviceAccountName for pods ("" = none)
``ALPINEAGENTS_RUN_CREDENTIALS``       ``sts`` (default): each pod of an ``s3://`` store
                                       gets its own short-lived credentials for its
                                       run's States only; ``shared``: pods get the
                                       store Secret's key (for stores without STS)
``ALPINEAGENTS_RUN_CREDENTIALS_SECONDS``  lifetime of a run's credentials (900-43200);
                                       they are renewed with half of it left
``ALPINEAGENTS_STS_ROLE_ARN``          role to assume (AWS needs one; MinIO ignores it)
``ALPINEAGENTS_RUN_RESOURCES``         JSON resources (requests/limits) for pods whose
                                       AgentRun has no ``spec.resources``
``ALPINEAGENTS_RUN_MAX_RESOURCES``     JSON object of the most a run may ask of each
                                       resource (``{"memory": "8Gi"}``), requests and
                                       limits alike; more is refused (resource_caps)
``ALPINEAGENTS_ENCRYPTION_SECRET``     Secret with the encryption keyring for pods ("" =
                                       none); the store URL then carries
                                       ``encrypted=true`` (see alpineagents.store.encrypted)
``ALPINEAGENTS_ENCRYPTION_SECRET_KEY`` its key (default ``keys``)
``ALPINEAGENTS_PROTECTED_SECRETS``     comma-separated Secrets no AgentRun may name
                                       (env, envFrom, MCP headers): the chart lists
                                       every Secret it creates or is given
``ALPINEAGENTS_ALLOWED_STORES``        comma-separated store URLs a run's
                                       ``spec.store`` may point under, beside
                                       ``ALPINEAGENTS_STORE`` (see store_policy)
``ALPINEAGENTS_RUN_OTEL_ENV``          JSON object of ``OTEL_*`` variables for run pods
                                       (their traces: the chart's ``telemetry``)
``ALPINEAGENTS_WARM_POOL``             standby runner pods kept per namespace (default
                                       0: none; see standby_pool)
``ALPINEAGENTS_WARM_POOL_OWNER``       ``Role/<name>`` (in each namespace) or
                                       ``ClusterRole/<name>``: the installation's object
                                       that owns waiting standbys, so they go with it
                                       ("" = none; the chart names its own RBAC)
``ALPINEAGENTS_NOTIFICATIONS``        ``false``: spec.notify is refused (marked Failed;
                                       the chart's ``notifications.enabled``)
``ALPINEAGENTS_NOTIFY_ATTEMPTS``       tries of a run's end notification (spec.notify)
                                       before it is given up (default 8)
``ALPINEAGENTS_NOTIFY_BACKOFF_SECONDS`` wait after its first failed try, doubling up
                                       to 300 s (default 2)
``ALPINEAGENTS_VIEWER_URL``            the run viewer's address, linked from each
                                       notification ("" = no link)
``ALPINEAGENTS_RETENTION``            ``false``: no AgentRun is deleted after its TTL
                                       (the chart's ``retention.enabled``)
``ALPINEAGENTS_TTL_SECONDS_AFTER_FINISHED`` finished AgentRuns without their own
                                       spec.ttlSecondsAfterFinished are deleted this
                                       long after they ended ("" = kept; see retention)
``ALPINEAGENTS_DELETES_PER_SECOND``    the most AgentRuns retention deletes a second
                                       (default 5: the API's other callers go first)
``ALPINEAGENTS_STORE_RETENTION_DAYS``  days the bucket keeps the States of runs deleted
                                       with onDelete: Expire, by its own lifecycle
                                       rule ("" = no rule: such States are kept)
=====================================  ==============================================
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

from alpineagents_operator.kube.admission import parse_cap
from alpineagents_operator.kube.daily_spend import parse_spend_cap
from alpineagents_operator.kube.resource_caps import parse_quantity

DEFAULT_IMAGE = "ghcr.io/alpineagents/alpineagents:0.1.0"
DEFAULT_STORE = "file:///var/lib/alpineagents/runs"
DEFAULT_POD_COMMAND = ("python", "-m", "alpineagents", "run")
MIN_CREDENTIALS_SECONDS = 900  # the shortest session STS grants (AWS, MinIO, SeaweedFS)
MAX_CREDENTIALS_SECONDS = 43200  # the longest AWS grants a role session by default
RUN_CREDENTIALS_MODES = ("sts", "shared")
DEFAULT_RUN_RESOURCES: Mapping[str, Mapping[str, str]] = {
    "requests": {"cpu": "100m", "memory": "256Mi"},
    "limits": {"memory": "1Gi", "ephemeral-storage": "2Gi"},
}
"""A run pod's resources unless its AgentRun says: a runaway tool cannot take the node."""


@dataclass(frozen=True)
class OperatorConfig:
    """What the operator needs to know that is not in an AgentRun."""

    namespaces: tuple[str, ...] = ()
    """Namespaces (or glob patterns) to watch; empty means cluster-wide."""
    image: str = DEFAULT_IMAGE
    store: str = DEFAULT_STORE
    anthropic_secret: str = "anthropic"
    anthropic_secret_key: str = "ANTHROPIC_API_KEY"
    store_secret: str = ""
    store_access_key: str = "AWS_ACCESS_KEY_ID"
    store_secret_key: str = "AWS_SECRET_ACCESS_KEY"
    anthropic_base_url: str | None = None
    pacer_url: str = ""
    """The shared limiter every run pod asks for its turns (the chart's ``pacing``); "":
    none, each run paces itself by the model's rate-limit headers."""
    max_running: int | None = None
    """The most runs with a pod at once in the cluster (``admission.maxRunning``)."""
    max_running_per_namespace: int | None = None
    """The same per namespace (``admission.maxRunningPerNamespace``)."""
    namespace_caps: bool = False
    """Read each namespace's own cap from its annotation ``alpineagents.dev/max-running``
    (``admission.namespaceAnnotations``; needs get on Namespaces)."""
    daily_spend_usd_per_namespace: float | None = None
    """The most USD each namespace's runs may spend per UTC day
    (``admission.dailySpendUSDPerNamespace``; :mod:`.daily_spend`); None: no cap."""
    kueue: bool = False
    """Runs labelled ``kueue.x-k8s.io/queue-name`` are admitted by Kueue, where the
    cluster serves its Workload API (``admission.kueue.enabled``; :mod:`.kueue_admission`)."""
    pod_command: tuple[str, ...] = DEFAULT_POD_COMMAND
    service_account: str = ""
    resync_seconds: float = 30.0
    metrics_port: int = 9090
    health_port: int = 8080
    peering: str = ""
    """kopf peering name. Empty: run standalone (one operator replica; no KopfPeering
    CRD needed). Set it when running several replicas so only one acts at a time."""
    run_credentials: str = "sts"
    """``sts``: per-run credentials minted through the store's STS; ``shared``: the
    store Secret's key in every pod."""
    run_credentials_seconds: int = 3600
    sts_role_arn: str = ""
    run_resources: Mapping[str, Any] = field(default_factory=lambda: dict(DEFAULT_RUN_RESOURCES))
    max_run_resources: Mapping[str, str] = field(default_factory=dict)
    """The most a run's ``spec.resources`` may ask of each resource (no entry: no cap)."""
    prices: str = ""
    """The chart's ``runs.prices`` as JSON (ALPINEAGENTS_PRICES), passed to every run pod."""
    """Resources of run pods whose AgentRun has no ``spec.resources``."""
    encryption_secret: str = ""
    encryption_secret_key: str = "keys"
    protected_secrets: tuple[str, ...] = ()
    """Secrets no AgentRun may name (the chart's own: its MinIO root key, ...); the
    store and encryption Secrets are refused too, see :mod:`.refusals`."""
    allowed_stores: tuple[str, ...] = ()
    """Store URLs beside :attr:`store` under which ``spec.store`` may point (the
    operator's key goes nowhere else, see :mod:`.store_policy`)."""
    run_otel_env: Mapping[str, str] = field(default_factory=dict)
    """``OTEL_*`` variables every run pod gets (where its traces go); a run's own
    ``spec.env`` may override them."""
    warm_pool: int = 0
    """Standby runner pods kept waiting in each namespace (:mod:`.standby_pool`)."""
    warm_pool_owner: tuple[str, str] | None = None
    """(kind, name) of the object that owns waiting standbys: ``Role`` (the one of that
    name in the standby's namespace) or ``ClusterRole``. The chart names its operator's
    RBAC, which ``helm uninstall`` deletes: the garbage collector then takes the
    standbys. None: standbys have no owner until they are handed a run."""

    notifications: bool = True
    """Whether runs' ``spec.notify`` is sent (the chart grants reading Secrets only then)."""
    retention: bool = True
    """Whether finished runs are deleted after their TTL (the chart grants deleting
    AgentRuns only then)."""
    notify_attempts: int = 8
    """Tries of a run's end notification before it is given up (:mod:`.notifications`)."""
    notify_backoff_seconds: float = 2.0
    """Wait after a notification's first failed try; doubled after each, up to 300 s."""
    viewer_url: str = ""
    """The run viewer's address for the link in notifications ("": none)."""
    ttl_seconds_after_finished: int | None = None
    """Default ``spec.ttlSecondsAfterFinished`` (None: finished runs are kept)."""
    deletes_per_second: float = 5.0
    """The most finished AgentRuns retention deletes a second (:mod:`.retention`)."""
    store_retention_days: int | None = None
    """Days the store's bucket keeps the State of a run deleted with ``onDelete: Expire``
    (:mod:`alpineagents_operator.credentials.state_expiry`); None: no rule, kept."""

    @property
    def named_namespaces(self) -> tuple[str, ...]:
        """The entries of :attr:`namespaces` that name one namespace (not a glob or a
        ``!glob``): each is listed on its own, which a namespaced Role allows."""
        return tuple(n for n in self.namespaces if not set(n) & set("*?[!"))

    def watches_namespace(self, namespace: str) -> bool:
        """Whether :attr:`namespaces` takes in ``namespace``, as kopf matches them: each
        entry on its own, a glob (``!glob``: every namespace but those)."""
        if not self.namespaces:
            return True
        return any(
            not fnmatchcase(namespace, entry[1:])
            if entry.startswith("!")
            else fnmatchcase(namespace, entry)
            for entry in self.namespaces
        )

    @property
    def spend_cap_possible(self) -> bool:
        """Whether a daily spend cap may be in force: the chart's, or a namespace's own
        annotation (read only with ``admission.namespaceAnnotations``)."""
        return self.daily_spend_usd_per_namespace is not None or self.namespace_caps

    @property
    def per_run_credentials(self) -> bool:
        """Whether pods get credentials of their own instead of the store Secret's key."""
        return self.run_credentials == "sts"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OperatorConfig:
        """Read the configuration from ``env`` (default ``os.environ``)."""
        env = os.environ if env is None else env
        defaults = cls()

        def text(name: str, default: str) -> str:
            return env.get(name, default).strip()

        namespaces = tuple(
            n.strip() for n in text("ALPINEAGENTS_NAMESPACES", "").split(",") if n.strip()
        )
        command_json = text("ALPINEAGENTS_POD_COMMAND", "")
        command = defaults.pod_command
        if command_json:
            try:
                parsed = json.loads(command_json)
            except ValueError:
                parsed = None
            if not (
                isinstance(parsed, list) and parsed and all(isinstance(p, str) for p in parsed)
            ):
                raise ValueError(
                    f"ALPINEAGENTS_POD_COMMAND must be a JSON list of strings, got {command_json!r}"
                )
            command = tuple(parsed)
        mode = text("ALPINEAGENTS_RUN_CREDENTIALS", defaults.run_credentials).lower()
        if mode not in RUN_CREDENTIALS_MODES:
            raise ValueError(f"ALPINEAGENTS_RUN_CREDENTIALS must be sts or shared, not {mode!r}")
        lifetime = text(
            "ALPINEAGENTS_RUN_CREDENTIALS_SECONDS", str(defaults.run_credentials_seconds)
        )
        if not (
            lifetime.isdigit()
            and MIN_CREDENTIALS_SECONDS <= int(lifetime) <= MAX_CREDENTIALS_SECONDS
        ):
            raise ValueError(
                f"ALPINEAGENTS_RUN_CREDENTIALS_SECONDS must be whole seconds from "
                f"{MIN_CREDENTIALS_SECONDS} to {MAX_CREDENTIALS_SECONDS}, not {lifetime!r}"
            )
        resources_json = text("ALPINEAGENTS_RUN_RESOURCES", "")
        resources: Mapping[str, Any] = defaults.run_resources
        if resources_json:
            try:
                parsed_resources = json.loads(resources_json)
            except ValueError:
                parsed_resources = None
            if not (
                isinstance(parsed_resources, dict)
                and set(parsed_resources) <= {"requests", "limits", "claims"}
                and all(isinstance(v, dict) for v in parsed_resources.values())
            ):
                raise ValueError(
                    "ALPINEAGENTS_RUN_RESOURCES must be a JSON object like "
                    '{"requests": {"cpu": "100m"}, "limits": {"memory": "1Gi"}}, '
                    f"got {resources_json!r}"
                )
            resources = parsed_resources
        return cls(
            namespaces=namespaces,
            image=text("ALPINEAGENTS_IMAGE", defaults.image),
            store=text("ALPINEAGENTS_STORE", defaults.store),
            anthropic_secret=text("ALPINEAGENTS_ANTHROPIC_SECRET", defaults.anthropic_secret),
            anthropic_secret_key=text(
                "ALPINEAGENTS_ANTHROPIC_SECRET_KEY", defaults.anthropic_secret_key
            ),
            store_secret=text("ALPINEAGENTS_STORE_SECRET", defaults.store_secret),
            store_access_key=text("ALPINEAGENTS_STORE_ACCESS_KEY", defaults.store_access_key),
            store_secret_key=text("ALPINEAGENTS_STORE_SECRET_KEY", defaults.store_secret_key),
            anthropic_base_url=text("ANTHROPIC_BASE_URL", "") or None,
            pacer_url=text("ALPINEAGENTS_PACER", defaults.pacer_url),
            max_running=parse_cap(text("ALPINEAGENTS_MAX_RUNNING", ""), "ALPINEAGENTS_MAX_RUNNING"),
            max_running_per_namespace=parse_cap(
                text("ALPINEAGENTS_MAX_RUNNING_PER_NAMESPACE", ""),
                "ALPINEAGENTS_MAX_RUNNING_PER_NAMESPACE",
            ),
            namespace_caps=text("ALPINEAGENTS_NAMESPACE_CAPS", "").lower() in ("1", "true"),
            daily_spend_usd_per_namespace=parse_spend_cap(
                text("ALPINEAGENTS_DAILY_SPEND_USD_PER_NAMESPACE", ""),
                "ALPINEAGENTS_DAILY_SPEND_USD_PER_NAMESPACE",
            ),
            kueue=text("ALPINEAGENTS_KUEUE", "").lower() in ("1", "true"),
            pod_command=command,
            service_account=text("ALPINEAGENTS_SERVICE_ACCOUNT", defaults.service_account),
            resync_seconds=float(text("ALPINEAGENTS_RESYNC_SECONDS", str(defaults.resync_seconds))),
            metrics_port=int(text("ALPINEAGENTS_METRICS_PORT", str(defaults.metrics_port))),
            health_port=int(text("ALPINEAGENTS_HEALTH_PORT", str(defaults.health_port))),
            peering=text("ALPINEAGENTS_PEERING", defaults.peering),
            run_credentials=mode,
            run_credentials_seconds=int(lifetime),
            sts_role_arn=text("ALPINEAGENTS_STS_ROLE_ARN", defaults.sts_role_arn),
            run_resources=resources,
            max_run_resources=_max_resources(text("ALPINEAGENTS_RUN_MAX_RESOURCES", "")),
            prices=_prices(text("ALPINEAGENTS_PRICES", "")),
            encryption_secret=text("ALPINEAGENTS_ENCRYPTION_SECRET", defaults.encryption_secret),
            encryption_secret_key=text(
                "ALPINEAGENTS_ENCRYPTION_SECRET_KEY", defaults.encryption_secret_key
            ),
            protected_secrets=_names(text("ALPINEAGENTS_PROTECTED_SECRETS", "")),
            allowed_stores=_names(text("ALPINEAGENTS_ALLOWED_STORES", "")),
            warm_pool=_count(text("ALPINEAGENTS_WARM_POOL", "0"), "ALPINEAGENTS_WARM_POOL"),
            warm_pool_owner=_pool_owner(text("ALPINEAGENTS_WARM_POOL_OWNER", "")),
            run_otel_env=_otel_env(text("ALPINEAGENTS_RUN_OTEL_ENV", "")),
            notifications=_switch(
                text("ALPINEAGENTS_NOTIFICATIONS", "true"), "ALPINEAGENTS_NOTIFICATIONS"
            ),
            retention=_switch(text("ALPINEAGENTS_RETENTION", "true"), "ALPINEAGENTS_RETENTION"),
            notify_attempts=_positive(
                text("ALPINEAGENTS_NOTIFY_ATTEMPTS", str(defaults.notify_attempts)),
                "ALPINEAGENTS_NOTIFY_ATTEMPTS",
            ),
            notify_backoff_seconds=_seconds(
                text("ALPINEAGENTS_NOTIFY_BACKOFF_SECONDS", str(defaults.notify_backoff_seconds)),
                "ALPINEAGENTS_NOTIFY_BACKOFF_SECONDS",
            ),
            viewer_url=text("ALPINEAGENTS_VIEWER_URL", "").rstrip("/"),
            ttl_seconds_after_finished=_ttl(text("ALPINEAGENTS_TTL_SECONDS_AFTER_FINISHED", "")),
            deletes_per_second=_seconds(
                text("ALPINEAGENTS_DELETES_PER_SECOND", str(defaults.deletes_per_second)),
                "ALPINEAGENTS_DELETES_PER_SECOND",
                positive=True,
            ),
            store_retention_days=_days(text("ALPINEAGENTS_STORE_RETENTION_DAYS", "")),
        )


def _pool_owner(text: str) -> tuple[str, str] | None:
    """``ALPINEAGENTS_WARM_POOL_OWNER``: ``Role/<name>`` or ``ClusterRole/<name>``."""
    if not text.strip():
        return None
    kind, _, name = text.strip().partition("/")
    if kind not in ("Role", "ClusterRole") or not name or "/" in name:
        raise ValueError(
            "ALPINEAGENTS_WARM_POOL_OWNER must be Role/<name> or ClusterRole/<name> (the "
            f"object that owns waiting standbys), got {text!r}"
        )
    return kind, name


def _max_resources(text: str) -> dict[str, str]:
    """``ALPINEAGENTS_RUN_MAX_RESOURCES``: a JSON object of resource names to quantities."""
    if not text.strip():
        return {}
    problem = (
        "ALPINEAGENTS_RUN_MAX_RESOURCES must be a JSON object of resource names to "
        f'quantities like {{"memory": "8Gi", "cpu": "4"}}, got {text!r}'
    )
    try:
        parsed = json.loads(text)
    except ValueError:
        raise ValueError(problem) from None
    if not isinstance(parsed, dict):
        raise ValueError(problem)
    caps = {str(name): str(amount) for name, amount in parsed.items() if amount is not None}
    for amount in caps.values():
        try:
            parse_quantity(amount)
        except ValueError:
            raise ValueError(problem) from None
    return caps


def _otel_env(text: str) -> dict[str, str]:
    """``ALPINEAGENTS_RUN_OTEL_ENV``: a JSON object of ``OTEL_*`` names to string values."""
    if not text.strip():
        return {}
    problem = "ALPINEAGENTS_RUN_OTEL_ENV must be a JSON object of OTEL_* names to strings"
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{problem}: {error}") from None
    if not isinstance(parsed, dict) or not all(
        isinstance(k, str) and k.startswith("OTEL_") and isinstance(v, str)
        for k, v in parsed.items()
    ):
        raise ValueError(f"{problem}, got {text!r}")
    return parsed


def _names(listed: str) -> tuple[str, ...]:
    """The items of a comma-separated setting, without blanks or repeats."""
    return tuple(dict.fromkeys(item.strip() for item in listed.split(",") if item.strip()))


def _prices(raw: str) -> str:
    """The price table as JSON, checked here so a bad one stops the operator, not each run."""
    if not raw or raw in ("{}", "null"):
        return ""
    try:
        table = json.loads(raw)
    except ValueError:
        table = None
    if not isinstance(table, dict) or not all(
        isinstance(p, dict) and all(isinstance(p.get(k), int | float) for k in ("input", "output"))
        for p in table.values()
    ):
        raise ValueError(
            'ALPINEAGENTS_PRICES must be a JSON object like {"claude-sonnet": {"input": 3, '
            f'"output": 15}} (USD per million tokens), got {raw!r}'
        )
    return raw


def _count(value: str, name: str) -> int:
    if not value.isdigit():
        raise ValueError(f"{name} must be a whole number of pods (0 or more), not {value!r}")
    return int(value)


def _switch(value: str, name: str) -> bool:
    if value.lower() not in ("true", "false", "1", "0"):
        raise ValueError(f"{name} must be true or false, not {value!r}")
    return value.lower() in ("true", "1")


def _positive(value: str, name: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{name} must be a whole number, 1 or more, not {value!r}")
    return int(value)


def _seconds(value: str, name: str, *, positive: bool = False) -> float:
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if number < 0 or (positive and number == 0) or number != number:
        more = "more than 0" if positive else "0 or more"
        raise ValueError(f"{name} must be a number, {more}, not {value!r}")
    return number


def _days(value: str) -> int | None:
    """``ALPINEAGENTS_STORE_RETENTION_DAYS``: "" sets no lifecycle rule."""
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ValueError(
            "ALPINEAGENTS_STORE_RETENTION_DAYS (the chart's store.retention.days) must be "
            f"whole days (1 or more), or empty for no lifecycle rule, not {value!r}"
        )
    return int(value)


def _ttl(value: str) -> int | None:
    """``ALPINEAGENTS_TTL_SECONDS_AFTER_FINISHED``: "" keeps finished runs."""
    if not value:
        return None
    if not value.isdigit():
        raise ValueError(
            "ALPINEAGENTS_TTL_SECONDS_AFTER_FINISHED must be whole seconds (0 or more), or "
            f"empty to keep finished AgentRuns, not {value!r}"
        )
    return int(value)
