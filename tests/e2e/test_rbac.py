"""The operator's Role grants exactly what the operator calls: checked against the API
server's audit log (the bench's kube-apiserver keeps one, metadata only).

Two runs go through what an operator does: one is created, loses its pod, gets a
replacement (new credentials) and answers; one is deleted while its pod works (the pod
stopped, then its saved State deleted under the finalizer). Every request of the chart's ServiceAccount in the namespace must be granted
(none refused), and every permission of the Role must have been used.
"""

from __future__ import annotations

import json
import uuid

import pytest

from tests.e2e.environment import (
    SLOW_STEP,
    Environment,
    apply_run,
    in_phase,
    status,
    wait_for_run,
    wait_until_tool_runs,
)

pytestmark = pytest.mark.e2e


def test_the_charts_role_grants_exactly_what_the_operator_calls(node_env: Environment) -> None:
    e2e = node_env  # the bench's API server keeps the audit log this reads
    # A run whose pod is lost: replaced (new credentials in its Secret), then answered.
    lost = f"rbac-{uuid.uuid4().hex[:6]}"
    apply_run(e2e, lost, f"Run the slow step.\n{SLOW_STEP}")
    first = status(wait_until_tool_runs(e2e, lost))["pod"]
    e2e.kubectl("delete", "pod", first, "--wait=false")
    wait_for_run(e2e, lost, in_phase("Succeeded"), "Succeeded after its pod was lost", 300)
    # A run deleted while it works: its pod stopped, then its saved State (finalizer).
    deleted = f"rbac-{uuid.uuid4().hex[:6]}"
    apply_run(e2e, deleted, f"Run the slow step.\n{SLOW_STEP}", onDelete="Delete")
    wait_until_tool_runs(e2e, deleted)
    e2e.kubectl("delete", "agentrun", deleted, "--wait=false")
    wait_for_run(e2e, deleted, lambda run: run is None, "deleted", 300)

    calls = e2e.operator_calls() or []
    ours = [c for c in calls if (c.get("objectRef") or {}).get("namespace") == e2e.namespace]
    refused = [c for c in ours if (c.get("responseStatus") or {}).get("code") == 403]
    assert not refused, [(c["verb"], c["objectRef"]) for c in refused[:5]]
    used = {
        (
            c["objectRef"].get("apiGroup", ""),
            "/".join(
                filter(None, [c["objectRef"].get("resource"), c["objectRef"].get("subresource")])
            ),
            c["verb"],
        )
        for c in ours
    }
    # The operator's Role, and the Role of the one Lease its replicas elect a leader with.
    roles = [
        json.loads(e2e.kubectl("get", "role", name, "-o", "json").stdout)
        for name in (e2e.operator, f"{e2e.operator}-leader")
    ]
    granted = {
        (group, resource, verb)
        for role in roles
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert used <= granted, f"called without a grant: {sorted(used - granted)}"
    assert granted <= used, f"granted but never called: {sorted(granted - used)}"
