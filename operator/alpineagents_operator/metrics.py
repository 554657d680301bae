"""Prometheus metrics of the operator, served over HTTP on ``ALPINEAGENTS_METRICS_PORT``.

- ``alpineagents_runs{phase}``: AgentRuns this operator has seen, by phase.
- ``alpineagents_pod_restarts_total{reason}``: lost pods replaced (or given up on), by the
  reason they were lost (Evicted, OOMKilled, PodDeleted, NodeLost, Terminated, ...).
- ``alpineagents_resume_latency_seconds``: from the moment a replacement pod was due
  (the loss visible to the operator, plus the restart backoff) to its creation. This is
  the operator's own reaction time; with zero backoff, loss visible → pod created.
"""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_PHASES = (
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
        self._phases: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()
        for phase in _PHASES:
            self.runs.labels(phase=phase).set(0)

    def record_phase(self, namespace: str, name: str, phase: str | None) -> None:
        """Note a run's current phase (None: the run is gone)."""
        key = (namespace, name)
        with self._lock:
            old = self._phases.pop(key, None)
            if phase:
                self._phases[key] = phase
            if old == phase:
                return
            if old:
                self.runs.labels(phase=old).dec()
            if phase:
                self.runs.labels(phase=phase).inc()

    def record_loss(self, reason: str) -> None:
        self.restarts.labels(reason=reason).inc()

    def serve(self, port: int, address: str = "0.0.0.0") -> None:
        """Serve ``/metrics`` on ``port`` from a background thread."""
        start_http_server(port, addr=address, registry=self.registry)
