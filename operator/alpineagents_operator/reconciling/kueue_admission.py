"""Admission by Kueue, for AgentRuns labelled ``kueue.x-k8s.io/queue-name``.

With ``admission.kueue.enabled`` (``ALPINEAGENTS_KUEUE``) and Kueue's Workload API
served by the cluster (looked up once, and again a minute later while it is not), a run
labelled with a LocalQueue is admitted by Kueue instead of the operator's own caps:

- before its pod starts, the run's Workload (:func:`~.kueue_workloads.workload_manifest`)
  is made; the run is ``Queued`` (reason ``WaitingForKueue``, the LocalQueue named) until
  Kueue admits it, then its pod starts as any run's does;
- a watch of the Workloads the operator made steps their run when Kueue changes them;
- when the run ends, its Workload is marked ``Finished`` and its quota frees; while the
  run waits for approval or is suspended it has none (a new one queues when it resumes);
- when Kueue evicts the Workload (preemption, deactivation), :mod:`.decide` stops the pod
  gracefully and queues the run again (its place is ``withdrawn``); once the pod is gone
  the quota is handed back, and a readmitted run resumes from its saved State. Neither
  counts as a restart or a failure.

The Workload of a resumed run is the same admitted Workload: a lost pod's replacement
never queues again behind new runs.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from alpineagents_operator.kube.admission import NO_PLACE, Verdict
from alpineagents_operator.kube.config import OperatorConfig
from alpineagents_operator.kube.kueue_workloads import (
    GROUP,
    PLURAL,
    VERSION,
    WorkloadState,
    finished_patch,
    quota_returned_patch,
    read_workload,
    verdict_for,
    workload_manifest,
    workload_name,
)
from alpineagents_operator.kube.pods import owner_reference, pod_manifest
from alpineagents_operator.kube.views import (
    JSON,
    RUN_LABEL,
    TERMINAL_PHASES,
    AgentRunView,
    Phase,
    PodView,
)

__all__ = ["KueueAdmission", "WorkloadApi"]

_log = logging.getLogger(__name__)
_TIMEOUT = (10, 60)
_LOOK_AGAIN = 60.0
"""Seconds before asking again whether the Workload API is served, while it is not."""
_WATCH_SECONDS = 300
_MERGE_PATCH = "application/merge-patch+json"

RunKey = tuple[str, str]


class WorkloadApi:
    """The Workload calls, blocking (call them off the event loop)."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self._api_client = api_client
        self._custom: Any = client.CustomObjectsApi(api_client)

    def served(self) -> bool:
        """Whether the API server serves Kueue's Workloads (in the version used here)."""
        from kubernetes.client.exceptions import ApiException

        try:
            self._custom.get_api_resources(GROUP, VERSION, _request_timeout=_TIMEOUT)
        except ApiException as error:
            if error.status == 404:
                return False
            raise
        return True

    def get(self, namespace: str, name: str) -> JSON | None:
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

    def create(self, manifest: JSON) -> JSON:
        """Create the Workload; one made meanwhile (another step) is read instead."""
        from kubernetes.client.exceptions import ApiException

        namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
        try:
            body: JSON = self._custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, manifest, _request_timeout=_TIMEOUT
            )
        except ApiException as error:
            found = self.get(namespace, name) if error.status == 409 else None
            if found is None:
                raise
            return found
        return body

    def patch_status(self, namespace: str, name: str, patch: JSON) -> JSON | None:
        """Merge-patch the Workload's status; None when it changed since the read the
        patch was made from (409: the next step patches from a fresh read)."""
        from kubernetes.client.exceptions import ApiException

        try:
            body: JSON = self._custom.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                patch,
                _content_type=_MERGE_PATCH,
                _request_timeout=_TIMEOUT,
            )
        except ApiException as error:
            if error.status in (404, 409):
                return None
            raise
        return body

    def delete(self, namespace: str, name: str) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self._custom.delete_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, _request_timeout=_TIMEOUT
            )
        except ApiException as error:
            if error.status != 404:
                raise

    def watch(self, namespace: str, changed: Callable[[str], None], stop: threading.Event) -> None:
        """Call ``changed(run name)`` for each event of the namespace's Workloads the
        operator made, until ``stop`` is set; a broken watch is started again."""
        from kubernetes import watch

        watching: Any = watch  # untyped
        while not stop.is_set():
            try:
                stream = watching.Watch().stream(
                    self._custom.list_namespaced_custom_object,
                    GROUP,
                    VERSION,
                    namespace,
                    PLURAL,
                    label_selector=RUN_LABEL,
                    timeout_seconds=_WATCH_SECONDS,
                )
                for event in stream:
                    labels = (event.get("object") or {}).get("metadata", {}).get("labels") or {}
                    if labels.get(RUN_LABEL):
                        changed(str(labels[RUN_LABEL]))
                    if stop.is_set():
                        return
            except Exception as error:  # the watch is started again; steps go on meanwhile
                _log.warning("watch of Workloads in %s broke: %s", namespace, error)
                stop.wait(5.0)


class KueueAdmission:
    """Kueue's verdicts for the runs it admits (see the module's docstring).

    :meth:`refresh` (off the event loop's blocking path) reads and writes the run's
    Workload before each step; :meth:`verdict` answers from what it read.
    """

    def __init__(
        self,
        config: OperatorConfig,
        api: WorkloadApi,
        requeue: Callable[[str, str, float], None],
        list_pods: Callable[[str, str], list[JSON]],
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._config = config
        self._api = api
        self._requeue = requeue
        self._list_pods = list_pods
        self._clock = clock
        self._served: bool | None = None
        self._asked_at = 0.0
        self._states: dict[RunKey, WorkloadState] = {}
        self._names: dict[RunKey, str] = {}
        """Each run's Workload, for when the run is gone."""
        self._deleting: set[asyncio.Task[None]] = set()
        self._watched: set[str] = set()
        self._stop = threading.Event()

    def governs(self, run: AgentRunView) -> bool:
        """Whether Kueue admits ``run`` (labelled, and the Workload API served)."""
        return bool(run.queue_name) and self._served is True

    def verdict(self, run: AgentRunView) -> Verdict | None:
        """Kueue's verdict for ``run`` as last read (None: Kueue does not admit it)."""
        if not self.governs(run):
            return None
        state = self._states.get((run.namespace, run.name), WorkloadState())
        return verdict_for(run, state)

    async def refresh(self, run: AgentRunView, *, spend_held: bool = False) -> None:
        """Bring the run's Workload in line with the run, and read its state.
        ``spend_held``: the daily spend cap holds the run now (its verdict, not the
        run's status, which still says so for a step after the cap is raised)."""
        if not run.queue_name or not await self._is_served():
            return
        self._watch(run.namespace)
        key = (run.namespace, run.name)
        name = workload_name(run)
        self._names[key] = name
        body = await asyncio.to_thread(self._api.get, run.namespace, name)
        state = read_workload(body)
        phase = run.status.phase
        if run.deleting or phase in TERMINAL_PHASES:
            if body is not None and not state.finished:
                message = str(run.status.raw.get("message") or "")
                patch = finished_patch(body, self._clock(), str(phase or "Failed"), message)
                await asyncio.to_thread(self._api.patch_status, run.namespace, name, patch)
            self._states.pop(key, None)
            return
        if phase in NO_PLACE or spend_held:
            # Waiting for approval, suspended or held by the daily spend cap: no quota once
            # no pod runs (a new Workload queues when it may go on), and none asked for
            # by a run applied at the cap.
            if body is not None and not await self._pod_alive(run):
                await asyncio.to_thread(self._api.delete, run.namespace, name)
            self._states.pop(key, None)
            return
        if body is None:
            pod_spec = pod_manifest(run, max(run.status.attempt, 1), self._config)["spec"]
            manifest = workload_manifest(run, pod_spec, owner_reference(run))
            body = await asyncio.to_thread(self._api.create, manifest)
            _log.info("%s/%s: workload %s made in LocalQueue %s", *key, name, run.queue_name)
            state = read_workload(body)
        elif (
            state.evicted
            and state.reserved
            and phase not in (Phase.PENDING, Phase.RUNNING)
            and not await self._pod_alive(run)
        ):
            # Queued again after the eviction, and no pod runs: the quota goes back.
            patch = quota_returned_patch(body, self._clock())
            answered = await asyncio.to_thread(self._api.patch_status, run.namespace, name, patch)
            state = read_workload(answered) if answered is not None else state
            _log.info("%s/%s: workload %s evicted, its quota handed back", *key, name)
        self._states[key] = state

    def forget(self, key: RunKey) -> None:
        """The run is gone: its Workload goes too (as its owner reference would have it
        where a garbage collector runs), so its quota frees at once."""
        self._states.pop(key, None)
        name = self._names.pop(key, None)
        if name is not None:
            task = asyncio.get_running_loop().create_task(
                asyncio.to_thread(self._api.delete, key[0], name)
            )
            self._deleting.add(task)
            task.add_done_callback(self._deleting.discard)

    def close(self) -> None:
        self._stop.set()

    async def _pod_alive(self, run: AgentRunView) -> bool:
        pods = await asyncio.to_thread(self._list_pods, run.namespace, run.name)
        return any(PodView.from_pod(p).alive for p in pods)

    async def _is_served(self) -> bool:
        if self._served is None or (
            self._served is False and time.monotonic() - self._asked_at > _LOOK_AGAIN
        ):
            self._asked_at = time.monotonic()
            served = await asyncio.to_thread(self._api.served)
            if served != self._served:
                _log.info(
                    "Kueue's Workload API (%s/%s) is %s: runs labelled with a LocalQueue "
                    "are admitted by %s",
                    GROUP,
                    VERSION,
                    "served" if served else "not served",
                    "Kueue" if served else "the operator's own caps",
                )
            self._served = served
        return self._served is True

    def _watch(self, namespace: str) -> None:
        if namespace in self._watched:
            return
        self._watched.add(namespace)
        loop = asyncio.get_running_loop()

        def changed(run_name: str) -> None:
            if not self._stop.is_set():  # no steps asked for once the operator stops
                loop.call_soon_threadsafe(self._requeue, namespace, run_name, 0.0)

        threading.Thread(
            target=self._api.watch,
            args=(namespace, changed, self._stop),
            name=f"kueue-workloads-{namespace}",
            daemon=True,
        ).start()
