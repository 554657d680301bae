"""Whether the replica holding the Lease is known dead, from its pod: a standby need not
wait out the whole lease after a crash that the kubelet has already reported.

A replica's identity in the Lease is its pod's name, a ``_``, and a suffix its process
drew at start (:class:`~alpineagents_operator.edge.leadership.LeaseSettings`). The process that
holds the Lease is therefore dead, and cannot act again, when:

- it ran in the standby's own pod (same pod name, another suffix): the kubelet starts a
  container again only after the one before it exited;
- its pod is gone (deleted and finalized: the kubelet reported its containers stopped), or
  is another pod of the same name (another uid), or has ended (phase Failed or Succeeded);
- its container has terminated, or waits to start again after it exited (the kubelet's
  crash-loop back-off), or restarted since the standby first saw that holder (the restart
  count grew): the holder's process was in the container that ran before.

The kubelet reports a container's death within a second or two. Anything else (a pod not
Ready, a node not answering, a pod being deleted, whose leader hands the Lease back on
SIGTERM) proves nothing, and the standby waits for the lease as before. Taking the Lease
is still an update guarded by the resourceVersion the standby read, so of two standbys one
wins, and a leader that is in fact alive loses nothing but a renewal it will see refused.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

_log = logging.getLogger(__name__)

CONTAINER = "operator"
"""The operator's container in the chart's pod (another pod's only container counts too)."""

PodReader = Callable[[str], "dict[str, Any] | None"]
"""Reads a pod of the Lease's namespace by name: its body, or None if there is none."""


def pod_name(identity: str) -> str:
    """The pod a holder identity names (its part before the last ``_``)."""
    return identity.rsplit("_", 1)[0]


class HolderLiveness:
    """Tells a standby when the Lease's holder is known dead (see the module docstring).

    ``own_identity`` is this replica's; ``read_pod`` reads a pod by name, None when it does
    not exist, and raises when it cannot tell (then the holder counts as alive)."""

    def __init__(self, own_identity: str, read_pod: PodReader) -> None:
        self._own_pod = pod_name(own_identity)
        self._own_identity = own_identity
        self._read_pod = read_pod
        self._first_seen: dict[str, tuple[str, int]] = {}  # holder → (pod uid, restarts)

    def dead(self, holder: str) -> str:
        """Why the holder's process is known dead, or "" while it may be alive."""
        if not holder or holder == self._own_identity:
            return ""
        name = pod_name(holder)
        if name == self._own_pod:
            return f"it ran in this pod ({name}), whose container has started again"
        try:
            pod = self._read_pod(name)
        except Exception as error:  # no proof either way: wait for the lease
            _log.debug("cannot read pod %s: %s", name, error)
            return ""
        if pod is None:
            return f"its pod {name} is gone"
        status = pod.get("status") or {}
        if status.get("phase") in ("Failed", "Succeeded"):
            return f"its pod {name} has ended ({status['phase']})"
        container = _container(status)
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        restarts = int((container or {}).get("restartCount") or 0)
        first = self._first_seen.setdefault(holder, (uid, restarts))
        if uid != first[0]:
            return f"its pod {name} is another pod of that name now"
        if container is None:
            return ""
        state = container.get("state") or {}
        if "terminated" in state:
            return f"its pod {name}'s container has terminated"
        if "waiting" in state and "terminated" in (container.get("lastState") or {}):
            # The kubelet's back-off before it starts a crashed container again (10 s
            # after a second crash, then longer): the restart count grows only when it
            # starts, so without this a standby would wait out the back-off.
            reason = (state.get("waiting") or {}).get("reason") or "waiting"
            return f"its pod {name}'s container has exited and waits to start again ({reason})"
        if restarts > first[1]:
            return f"its pod {name}'s container has restarted"
        return ""

    def forget(self, holder: str) -> None:
        """Drop what was first seen of a holder that no longer holds the Lease."""
        self._first_seen.pop(holder, None)


def _container(status: dict[str, Any]) -> dict[str, Any] | None:
    statuses = list(status.get("containerStatuses") or [])
    for container in statuses:
        if container.get("name") == CONTAINER:
            return dict(container)
    return dict(statuses[0]) if len(statuses) == 1 else None


def api_pod_reader(api_client: Any, namespace: str, timeout: float) -> PodReader:
    """A :data:`PodReader` on the API server: ``get`` on pods of ``namespace``."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core: Any = client.CoreV1Api(api_client)  # typed for models, not raw responses

    def read(name: str) -> dict[str, Any] | None:
        try:
            response = core.read_namespaced_pod(
                name, namespace, _request_timeout=(timeout, timeout), _preload_content=False
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        try:
            return dict(json.loads(response.data))
        finally:
            response.release_conn()

    return read
