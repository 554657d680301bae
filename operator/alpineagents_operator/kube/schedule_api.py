"""The Kubernetes calls an AgentSchedule's step makes: read it and its runs, create and
delete runs, patch its status. Blocking, on JSON dicts (the keeper calls them on a
worker thread); Events go through :meth:`.Cluster.post_event`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from alpineagents_operator.kube.cluster import failure_text
from alpineagents_operator.kube.schedule_names import SCHEDULE_LABEL, SCHEDULE_PLURAL
from alpineagents_operator.kube.views import GROUP, JSON, PLURAL, VERSION

_MERGE_PATCH = "application/merge-patch+json"
_TIMEOUT = (10, 60)


class RunRefused(Exception):
    """The API server refused the run a schedule made (its template is invalid, or a
    quota or policy forbids it); the message is the server's."""


def _finish(response: Any) -> JSON:
    try:
        body: JSON = json.loads(response.data)
        return body
    finally:
        response.release_conn()


class ScheduleApi:
    """AgentSchedules and the AgentRuns they own, through one ``ApiClient``."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self._custom: Any = client.CustomObjectsApi(api_client)

    def get_schedule(self, namespace: str, name: str) -> JSON | None:
        """The AgentSchedule, or None if it is gone."""
        return self._get(namespace, SCHEDULE_PLURAL, name)

    def list_runs(self, namespace: str, schedule: str) -> list[JSON]:
        """The AgentRuns labelled with ``schedule``'s name (the caller checks the owner)."""
        listing = _finish(
            self._custom.list_namespaced_custom_object(
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                label_selector=f"{SCHEDULE_LABEL}={schedule}",
                _preload_content=False,
                _request_timeout=_TIMEOUT,
            )
        )
        return list(listing.get("items") or [])

    def get_run(self, namespace: str, name: str) -> JSON | None:
        """The AgentRun, or None if there is none."""
        return self._get(namespace, PLURAL, name)

    def _get(self, namespace: str, plural: str, name: str) -> JSON | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return _finish(
                self._custom.get_namespaced_custom_object(
                    GROUP,
                    VERSION,
                    namespace,
                    plural,
                    name,
                    _preload_content=False,
                    _request_timeout=_TIMEOUT,
                )
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def create_run(self, manifest: Mapping[str, Any]) -> JSON | None:
        """Create the AgentRun; None if one of that name exists (409: that time is done),
        :class:`RunRefused` if the server will not have it."""
        from kubernetes.client.exceptions import ApiException

        try:
            return _finish(
                self._custom.create_namespaced_custom_object(
                    GROUP,
                    VERSION,
                    manifest["metadata"]["namespace"],
                    PLURAL,
                    dict(manifest),
                    _preload_content=False,
                    _request_timeout=_TIMEOUT,
                )
            )
        except ApiException as error:
            if error.status == 409:
                return None
            if error.status in (400, 403, 422):
                raise RunRefused(failure_text(error)) from None
            raise

    def delete_run(self, namespace: str, name: str) -> None:
        """Delete the AgentRun (its pods stop, as for any deleted run); gone is fine."""
        from kubernetes.client.exceptions import ApiException

        try:
            _finish(
                self._custom.delete_namespaced_custom_object(
                    GROUP,
                    VERSION,
                    namespace,
                    PLURAL,
                    name,
                    propagation_policy="Background",
                    _preload_content=False,
                    _request_timeout=_TIMEOUT,
                )
            )
        except ApiException as error:
            if error.status != 404:
                raise

    def patch_status(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        """Merge-patch the schedule's status (only the fields named); gone is fine."""
        from kubernetes.client.exceptions import ApiException

        try:
            _finish(
                self._custom.patch_namespaced_custom_object_status(
                    GROUP,
                    VERSION,
                    namespace,
                    SCHEDULE_PLURAL,
                    name,
                    {"status": dict(patch)},
                    _content_type=_MERGE_PATCH,
                    _preload_content=False,
                    _request_timeout=_TIMEOUT,
                )
            )
        except ApiException as error:
            if error.status != 404:
                raise
