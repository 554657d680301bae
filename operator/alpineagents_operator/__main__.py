"""Run the operator: ``python -m alpineagents_operator``.

This is ``kopf run -m alpineagents_operator.edge.handlers`` with the settings taken from the
environment (see :mod:`alpineagents_operator.kube.config`):

- watches the namespaces in ``ALPINEAGENTS_NAMESPACES`` (empty: the whole cluster);
- standalone (no peering) unless ``ALPINEAGENTS_PEERING`` names a peering;
- serves kopf's liveness endpoint on ``http://0.0.0.0:$ALPINEAGENTS_HEALTH_PORT/healthz``
  (default 8080; 0 turns it off): it answers 200 with the probe results, among them
  ``secondsSinceLastStep``, while the operator's loop is alive;
- serves Prometheus metrics on ``$ALPINEAGENTS_METRICS_PORT`` (default 9090; 0: off);
- logs at ``ALPINEAGENTS_LOG_LEVEL`` (INFO: the operator's decisions and kopf's warnings;
  DEBUG adds kopf's own detail, a line for each handler that succeeded among it);
- with ``ALPINEAGENTS_LEADER_LEASE`` set, waits as a standby until it holds that Lease
  and acts only while it does (see :mod:`alpineagents_operator.edge.leadership`).

It connects with in-cluster credentials inside a pod, else with ``$KUBECONFIG``. SIGTERM
or Ctrl+C stops it cleanly; agent pods keep running and are adopted by the next start.
"""

from __future__ import annotations

import logging
import os
import signal
import threading

import kopf

from alpineagents_operator.edge.leadership import LeaderElector, LeaseSettings, StandbyHealth
from alpineagents_operator.kube.config import OperatorConfig

_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def main() -> None:
    """Start the operator and block until it is stopped."""
    config = OperatorConfig.from_env()
    level = os.environ.get("ALPINEAGENTS_LOG_LEVEL", "INFO").upper()
    kopf.configure(verbose=level == "DEBUG", quiet=level in ("WARNING", "ERROR"))
    if level != "DEBUG":
        # kopf logs each handler's success at INFO: a line for every watch event, written
        # on the event loop's thread. In a burst of 30 lost pods that was a tenth of the
        # operator's CPU and delayed the resumes; its warnings and errors still show (and
        # are posted as Events from WARNING up, as before).
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    from alpineagents_operator.edge import (
        handlers,  # registers the handlers with kopf's default registry
    )

    del handlers
    elector = _lead(LeaseSettings.from_env(), config.health_port)
    try:
        _run_kopf(config)
    finally:
        if elector is not None:
            elector.release()


def _lead(settings: LeaseSettings | None, health_port: int) -> LeaderElector | None:
    """Wait as a standby until this replica holds the Lease (nothing to wait for without
    one); its liveness endpoint answers meanwhile."""
    if settings is None:
        return None
    from alpineagents_operator.kube.cluster import api_client_from_environment

    elector = LeaderElector(settings, api_client_from_environment())
    health = StandbyHealth(health_port, elector) if health_port else None
    # In a container the operator is PID 1, which has no default action for SIGTERM:
    # unhandled, a deleted standby stood by through its pod's whole grace period, could
    # take the Lease meanwhile and was then SIGKILLed as the new leader. kopf installs
    # its own handlers once it runs.
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in _STOP_SIGNALS}
    try:
        held = elector.acquire(stop)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if health is not None:
            health.close()
    if not held or stop.is_set():
        if held:
            elector.release()
        logging.getLogger(__name__).info("stopped while standing by")
        raise SystemExit(0)
    return elector


def _run_kopf(config: OperatorConfig) -> None:
    kopf.run(
        standalone=not config.peering,
        peering_name=config.peering or None,
        clusterwide=not config.namespaces,
        namespaces=config.namespaces,
        liveness_endpoint=(
            f"http://0.0.0.0:{config.health_port}/healthz" if config.health_port else None
        ),
    )


if __name__ == "__main__":
    main()
