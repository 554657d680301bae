"""Prometheus metrics of the operator, served over HTTP on ``ALPINEAGENTS_METRICS_PORT``.

- ``alpineagents_runs{phase}``: AgentRuns this operator has seen, by phase.
- ``alpineagents_pod_restarts_total{reason}``: lost pods replaced (or given up on), by the
  reason they were lost (Evicted, OOMKilled, PodDeleted, NodeLost, Terminated, ...).
- ``alpineagents_resume_latency_seconds``: from the moment a replacement pod was due
  (the loss visible to the operator, plus the restart backoff) to its creation. This is
  the operator's own reaction time; with zero backoff, loss visible → pod created.
- ``alpineagents_loss_to_resume_seconds``: from the loss visible to the operator to the
  replacement pod's creation, backoff included: what a user waits.
- ``alpineagents_tokens_total{namespace,model,type}`` (type: input, output, cache_read,
  cache_creation) and ``alpineagents_cost_usd_total{namespace,model}``: what runs used,
  from their status (``usage``, ``costUSD``), counted as it grows. After an operator
  restart a finished run is not counted again; an active one counts from zero again.
- ``alpineagents_approvals_waiting{namespace}`` and
  ``alpineagents_approval_oldest_wait_seconds{namespace}``: tool calls waiting for a
  person, and how long the oldest has waited (since this operator first saw it).
- ``alpineagents_run_phase_oldest_seconds{phase}``: how long the run longest in each
  phase has been in it (a run stuck Pending or Interrupted shows here).
- ``alpineagents_run_restarts_max{namespace}``: the most restarts of a run not finished
  (a run whose resumes loop).
- ``alpineagents_store_errors_total{operation}`` (read, claim): store calls that failed.
- ``alpineagents_admission_in_use{namespace}`` and ``alpineagents_admission_queued{namespace}``:
  under admission caps, runs holding a place and runs in line (none without caps).
- ``alpineagents_admission_spend_today_usd{namespace}``: what each namespace's runs spent
  today (UTC), with a daily spend cap in force or namespace annotations read.

Labels are bounded: phases and types are fixed sets, loss reasons outside the known
ones count as ``Other``, and namespaces and models are those of the cluster's runs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

_Figures = TypeVar("_Figures")
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_LOSS_BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
_FINAL_PHASES = frozenset({"Succeeded", "Failed"})
# status.usage's keys and the ``type`` label each is counted under.
_TOKEN_TYPES = {
    "inputTokens": "input",
    "outputTokens": "output",
    "cacheReadInputTokens": "cache_read",
    "cacheCreationInputTokens": "cache_creation",
}
# Why pods are lost (pod_outcomes, pod_losses); anything else counts as "Other" (bounded label).
LOSS_REASONS = frozenset(
    {
        "Error",
        "Evicted",
        "Killed",
        "NodeLost",
        "NodeShutdown",
        "OOMKilled",
        "PodDeleted",
        "PodFailed",
        "PodTerminating",
        "RetryableError",
        "Terminated",
        # A pod's DisruptionTarget condition reasons (Kubernetes' own, a fixed set).
        "DeletionByTaintManager",
        "DisruptionTarget",
        "EvictionByEvictionAPI",
        "PreemptionByScheduler",
        "TerminationByKubelet",
    }
)
_PHASES = (
    "Queued",
    "Pending",
    "Running",
    "Interrupted",
    "WaitingForApproval",
    "Suspended",
    "Succeeded",
    "Failed",
)


class OperatorMetrics:
    """The operator's metrics, in a registry of their own (tests make several)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.runs = Gauge(
            "alpineagents_runs", "AgentRuns by phase.", ["phase"], registry=self.registry
        )
        self.restarts = Counter(
            "alpineagents_pod_restarts",
            "Pods lost before their run finished, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self.resume_latency = Histogram(
            "alpineagents_resume_latency_seconds",
            "Seconds from a replacement pod being due (loss seen + backoff) to its creation.",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.loss_to_resume = Histogram(
            "alpineagents_loss_to_resume_seconds",
            "Seconds from a pod's loss seen by the operator to its replacement's creation.",
            buckets=_LOSS_BUCKETS,
            registry=self.registry,
        )
        self.tokens = Counter(
            "alpineagents_tokens",
            "Tokens runs used, by namespace, model and type (input, output, cache_read, "
            "cache_creation).",
            ["namespace", "model", "type"],
            registry=self.registry,
        )
        self.cost = Counter(
            "alpineagents_cost_usd",
            "Estimated cost of runs in US dollars, by namespace and model.",
            ["namespace", "model"],
            registry=self.registry,
        )
        self.store_errors = Counter(
            "alpineagents_store_errors",
            "Store calls of the operator that failed, by operation (read, claim).",
            ["operation"],
            registry=self.registry,
        )
        for operation in ("read", "claim"):
            self.store_errors.labels(operation=operation)
        self.checks = Counter(
            "alpineagents_run_checks",
            "Runs looked at (at a resume after the operator started, a resync, a pod of a "
            "watch's listing, a pod's event), by whether a reconcile step followed (none: no "
            "request).",
            ["source", "stepped"],
            registry=self.registry,
        )
        self._phases: dict[tuple[str, str], str] = {}
        self._runs: dict[tuple[str, str], _RunSeen] = {}
        self._lost_at: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()
        for phase in _PHASES:
            self.runs.labels(phase=phase).set(0)
        self.registry.register(_FleetGauges(self))

    def watch_admission(
        self, figures: Callable[[], tuple[Mapping[str, int], Mapping[str, int]]]
    ) -> None:
        """Serve the admission gauges from ``figures`` (places in use, runs queued)."""
        self.registry.register(_AdmissionGauges(figures))

    def watch_spend(self, figures: Callable[[], Mapping[str, float]]) -> None:
        """Serve each namespace's spend today (USD, UTC day) from ``figures``."""
        self.registry.register(_SpendGauge(figures))

    def record_phase(self, namespace: str, name: str, phase: str | None) -> None:
        """Note a run's current phase (None: the run is gone)."""
        key = (namespace, name)
        with self._lock:
            old = self._phases.pop(key, None)
            if phase:
                self._phases[key] = phase
            else:
                self._runs.pop(key, None)
                self._lost_at.pop(key, None)
            if old == phase:
                return
            if old:
                self.runs.labels(phase=old).dec()
            if phase:
                self.runs.labels(phase=phase).inc()

    def record_loss(self, reason: str, run: tuple[str, str] | None = None) -> None:
        """A pod of ``run`` (namespace, name) was lost for ``reason``."""
        self.restarts.labels(reason=reason if reason in LOSS_REASONS else "Other").inc()
        if run is not None:
            with self._lock:
                self._lost_at.setdefault(run, time.monotonic())

    def record_replaced(self, run: tuple[str, str]) -> None:
        """The replacement pod of ``run``'s lost one was created."""
        with self._lock:
            lost = self._lost_at.pop(run, None)
        if lost is not None:
            self.loss_to_resume.observe(max(0.0, time.monotonic() - lost))

    def record_store_error(self, operation: str) -> None:
        """A store call of the operator failed (``read``: a State read; ``claim``)."""
        self.store_errors.labels(operation=operation).inc()

    def record_run(self, namespace: str, name: str, spec: Mapping[str, Any], status: Any) -> None:
        """Note what a run's ``status`` (as the operator last wrote or read it) says of its
        usage, cost, approvals and restarts."""
        status = status if isinstance(status, Mapping) else {}
        phase = str(status.get("phase") or "")
        key = (namespace, name)
        model = str(spec.get("model") or "unknown")
        usage = status.get("usage")
        usage = usage if isinstance(usage, Mapping) else {}
        totals = {t: _number(usage.get(k)) for k, t in _TOKEN_TYPES.items()}
        cost = _number(status.get("costUSD"))
        pending = status.get("pendingApprovals")
        calls = [str(a.get("callId")) for a in pending or [] if isinstance(a, Mapping)]
        now = time.monotonic()
        with self._lock:
            seen = self._runs.get(key)
            if seen is None:
                seen = self._runs[key] = _RunSeen()
                if phase in _FINAL_PHASES:  # counted before this operator started
                    seen.tokens, seen.cost = totals, cost
            grown = {t: v - seen.tokens.get(t, 0) for t, v in totals.items()}
            spent = cost - seen.cost
            seen.tokens, seen.cost = totals, max(cost, seen.cost)
            seen.namespace, seen.final = namespace, phase in _FINAL_PHASES
            seen.restarts = int(_number(status.get("restarts")))
            seen.approvals = {c: seen.approvals.get(c, now) for c in calls}
            if phase != seen.phase:
                seen.phase, seen.phase_since = phase, now
        for token_type, amount in grown.items():
            if amount > 0:
                self.tokens.labels(namespace=namespace, model=model, type=token_type).inc(amount)
        if spent > 0:
            self.cost.labels(namespace=namespace, model=model).inc(spent)

    def _fleet(self) -> list[_RunSeen]:
        with self._lock:
            return [
                _RunSeen(**{k: getattr(seen, k) for k in _RunSeen.__slots__})
                for seen in self._runs.values()
            ]

    def serve(self, port: int, address: str = "0.0.0.0") -> None:
        """Serve ``/metrics`` on ``port`` from a background thread."""
        start_http_server(port, addr=address, registry=self.registry)


class _RunSeen:
    """What the metrics keep of one run between its reconciles."""

    __slots__ = (
        "approvals",
        "cost",
        "final",
        "namespace",
        "phase",
        "phase_since",
        "restarts",
        "tokens",
    )

    def __init__(self, **values: Any) -> None:
        self.namespace: str = values.get("namespace", "")
        self.phase: str = values.get("phase", "")
        self.phase_since: float = values.get("phase_since", 0.0)
        self.final: bool = values.get("final", False)
        self.restarts: int = values.get("restarts", 0)
        self.tokens: dict[str, float] = values.get("tokens", {})
        self.cost: float = values.get("cost", 0.0)
        self.approvals: dict[str, float] = dict(values.get("approvals", {}))
        """Call id → when this operator first saw it waiting."""


def _read_beside_the_loop(figures: Callable[[], _Figures], empty: _Figures) -> _Figures:
    """``figures()`` read on the metrics server's thread while the event loop changes
    what it copies: a copy taken as a dict changes size is taken again."""
    for _ in range(3):
        try:
            return figures()
        except RuntimeError:
            continue
    return empty


class _AdmissionGauges(Collector):
    """Places held and runs in line by namespace, read from the ledger at each scrape."""

    def __init__(self, figures: Callable[[], tuple[Mapping[str, int], Mapping[str, int]]]) -> None:
        self._figures = figures

    def collect(self) -> Iterator[GaugeMetricFamily]:
        nothing: tuple[Mapping[str, int], Mapping[str, int]] = ({}, {})
        in_use, queued = _read_beside_the_loop(self._figures, nothing)
        for name, text, counts in (
            ("alpineagents_admission_in_use", "Runs holding a place, by namespace.", in_use),
            ("alpineagents_admission_queued", "Runs Queued for a place, by namespace.", queued),
        ):
            family = GaugeMetricFamily(name, text, labels=["namespace"])
            for namespace, count in sorted(counts.items()):
                family.add_metric([namespace], count)
            yield family


class _SpendGauge(Collector):
    """Each namespace's spend today under the daily spend cap, read at each scrape."""

    def __init__(self, figures: Callable[[], Mapping[str, float]]) -> None:
        self._figures = figures

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "alpineagents_admission_spend_today_usd",
            "What each namespace's runs spent today (UTC), in USD: the sum of their "
            "status.costUSD increments made today.",
            labels=["namespace"],
        )
        nothing: Mapping[str, float] = {}
        for namespace, usd in sorted(_read_beside_the_loop(self._figures, nothing).items()):
            family.add_metric([namespace], round(usd, 6))
        yield family


class _FleetGauges(Collector):
    """Gauges computed at each scrape from the runs the metrics have seen."""

    def __init__(self, metrics: OperatorMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = time.monotonic()
        runs = self._metrics._fleet()
        waiting = GaugeMetricFamily(
            "alpineagents_approvals_waiting",
            "Tool calls waiting for a person's answer, by namespace.",
            labels=["namespace"],
        )
        oldest_wait = GaugeMetricFamily(
            "alpineagents_approval_oldest_wait_seconds",
            "Seconds the oldest tool call waiting for an answer has waited, by namespace.",
            labels=["namespace"],
        )
        in_phase = GaugeMetricFamily(
            "alpineagents_run_phase_oldest_seconds",
            "Seconds the run longest in each phase has been in it.",
            labels=["phase"],
        )
        restarts = GaugeMetricFamily(
            "alpineagents_run_restarts_max",
            "The most restarts of a run not finished, by namespace.",
            labels=["namespace"],
        )
        namespaces = sorted({r.namespace for r in runs})
        for namespace in namespaces:
            mine = [r for r in runs if r.namespace == namespace]
            since = [t for r in mine for t in r.approvals.values()]
            waiting.add_metric([namespace], len(since))
            oldest_wait.add_metric([namespace], now - min(since) if since else 0.0)
            active = [r.restarts for r in mine if not r.final]
            restarts.add_metric([namespace], max(active, default=0))
        for phase in _PHASES:
            started = [r.phase_since for r in runs if r.phase == phase]
            in_phase.add_metric([phase], now - min(started) if started else 0.0)
        yield from (waiting, oldest_wait, in_phase, restarts)

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())


def _number(value: Any) -> float:
    """A status number (``costUSD`` is a string) as a float; 0 when it is not one."""
    if isinstance(value, bool):
        return 0.0
    try:
        return float(value or 0)
    except (TypeError, ValueError):
        return 0.0
