"""A corpus of malformed AgentRuns, each turned away with a message that names what is
wrong: refused by the API server (the CRD's schema and rules), or ended Failed by the
operator without a retry. A healthy run works on beside them, unharmed, and succeeds.

tests/e2e/test_run_failures.py has the first few (no model, a negative maxTurns, an
agent that does not import, resources of no known quantity); this is the rest. The
healthy run's tool call goes through the bench's :class:`~tests.bench.tool_gate.ToolGate`
and is held until the last test, so these need the real node (they skip on a cluster of
your own).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import yaml

from tests.bench.tool_gate import ToolGate
from tests.e2e.environment import (
    JSON,
    Environment,
    apply_run,
    ended,
    gated,
    run_pods,
    status,
    wait_for_run,
)

pytestmark = pytest.mark.e2e


@dataclass(frozen=True)
class Malformed:
    """One malformed AgentRun and how it must be turned away."""

    id: str
    spec: JSON = field(default_factory=dict)
    """Changes to a valid spec (None: leave the field out)."""
    refused: tuple[str, ...] = ()
    """Texts the API server's refusal must hold (naming the field)."""
    reason: str = ""
    """Else: the reason the run ends Failed with, ..."""
    message: str = ""
    """... and a text its status.message must hold."""
    name_length: int | None = None
    hidden: str = ""
    """A text that must appear nowhere in the run's status or the operator's log (a secret)."""


# Port 9 on a pod's or the operator's own loopback: nothing listens there.
MALFORMED = [
    Malformed(
        "neither-prompt-nor-messages",
        {"prompt": None},
        refused=("give exactly one of spec.prompt",),
    ),
    Malformed(
        "prompt-not-a-string", {"prompt": 42}, refused=("spec.prompt", "must be of type string")
    ),
    Malformed(
        "maxTurns-not-a-number",
        {"maxTurns": "ten"},
        refused=("spec.maxTurns", "must be of type integer"),
    ),
    Malformed(
        "tools-not-a-list", {"tools": "shell"}, refused=("spec.tools", "must be of type array")
    ),
    Malformed(
        "restartPolicy-not-a-mapping",
        {"restartPolicy": 3},
        refused=("spec.restartPolicy", "must be of type object"),
    ),
    Malformed(
        "negative-maxRestarts",
        {"restartPolicy": {"maxRestarts": -1}},
        refused=("spec.restartPolicy.maxRestarts", "greater than or equal to 0"),
    ),
    Malformed(
        "2MB-prompt",
        {"prompt": "x" * 2_000_000},
        refused=("spec.prompt may be at most 262144 characters", "1 MiB"),
    ),
    Malformed(
        "unknown-tool", {"tools": ["shel"]}, refused=('spec.tools[0]: Unsupported value: "shel"',)
    ),
    Malformed("agent-not-an-import-path", {"agent": "my agent.py"}, refused=("spec.agent",)),
    Malformed(
        "first-message-not-the-users",
        {"prompt": None, "messages": [{"role": "assistant", "content": "hi"}]},
        refused=("the first of spec.messages must be the user's",),
    ),
    Malformed(
        "approval-without-an-answer",
        {"approvals": [{"callId": "toolu_1"}]},
        refused=("spec.approvals[0].allow: Required value",),
    ),
    Malformed(
        "unknown-onDelete",
        {"onDelete": "Forget"},
        refused=('spec.onDelete: Unsupported value: "Forget"',),
    ),
    Malformed(
        "name-over-the-limit",
        name_length=64,
        refused=("metadata.name may be at most 63 characters",),
    ),
    Malformed(
        "agent-factory-that-does-not-exist",
        {"agent": "alpineagents:no_such_factory"},
        reason="NotRetryable",
        message="'alpineagents' has no 'no_such_factory'",
    ),
    # A store URL that cannot work is refused by the CRD's rules on spec.store.
    Malformed(
        "store-url-of-no-known-kind",
        {"store": "ftp://runs.example.com/agents"},
        refused=("spec.store must be file:///path or s3://bucket/prefix",),
    ),
    Malformed(
        "store-url-with-a-password-in-it",
        {"store": "s3://AKIA1:topsecret@runs/x?endpoint=127.0.0.1:9"},
        refused=("spec.store must not hold credentials",),
        hidden="topsecret",
    ),
    Malformed(
        "store-url-without-a-bucket",
        {"store": "s3://?endpoint=127.0.0.1:9"},
        refused=("spec.store names no bucket",),
    ),
]


def run_name() -> str:
    return f"b-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module")
def run_alongside(node_env: Environment, gate: ToolGate) -> Iterator[str]:
    """A healthy run that works on while the bad manifests come and go: its tool call is
    held until the last test of the corpus releases it."""
    name = f"alongside-{uuid.uuid4().hex[:6]}"
    apply_run(node_env, name, gated(gate, name))
    gate.wait_started(name, timeout=300)
    wait_for_run(node_env, name, lambda r: status(r).get("phase") == "Running", "Running", 300)
    yield name
    gate.release(name)


def unharmed(env: Environment, name: str) -> None:
    now = status(wait_for_run(env, name, lambda r: r is not None, "present"))
    assert now["phase"] == "Running" and now["attempt"] == 1, now
    assert now.get("restarts", 0) == 0 and not now.get("reason"), now


@pytest.mark.parametrize("bad", MALFORMED, ids=[m.id for m in MALFORMED])
def test_a_malformed_agentrun_is_turned_away_with_a_clear_message(
    node_env: Environment, run_alongside: str, bad: Malformed
) -> None:
    name = run_name()
    if bad.name_length is not None:
        name = (name + "-" + "n" * bad.name_length)[: bad.name_length]
    spec: JSON = {
        "model": "claude-sonnet-5",
        "prompt": "hi",
        "restartPolicy": {"initialBackoffSeconds": 0},
    }
    for key, value in bad.spec.items():
        if value is None:
            spec.pop(key, None)
        else:
            spec[key] = value
    manifest = {
        "apiVersion": "alpineagents.dev/v1",
        "kind": "AgentRun",
        "metadata": {"name": name},
        "spec": spec,
    }
    # create, not a client-side apply: that copies a 2 MB manifest into an annotation.
    created = node_env.kubectl("create", "-f", "-", check=False, input=yaml.safe_dump(manifest))
    if bad.refused:
        assert created.returncode != 0, f"{bad.id} was accepted"
        for text in bad.refused:
            assert text in created.stderr, created.stderr
        if bad.hidden:
            assert bad.hidden not in created.stderr, "the refusal repeats a secret"
    else:
        assert created.returncode == 0, created.stderr
        turned_away = status(
            wait_for_run(
                node_env,
                name,
                lambda r: (
                    status(r).get("phase") == "Failed" or status(r).get("reason") == bad.reason
                ),
                f"Failed or reason {bad.reason}",
                300,
            )
        )
        assert turned_away["reason"] == bad.reason, turned_away
        assert bad.message in turned_away["message"], turned_away
        assert turned_away["phase"] == "Failed", turned_away
        assert len(run_pods(node_env, name)) <= 1  # not retried: it would fail the same way
        if bad.hidden:
            said = json.dumps(turned_away) + node_env.operator_log()
            assert bad.hidden not in said, "a secret reached the status or the operator's log"
        node_env.kubectl("delete", "agentrun", name, "--wait=false")
    unharmed(node_env, run_alongside)


def test_a_name_at_the_length_limit_runs(
    node_env: Environment, gate: ToolGate, run_alongside: str
) -> None:
    name = (run_name() + "-" + "n" * 63)[:63]
    gate.release(name)
    apply_run(node_env, name, gated(gate, name))
    done = ended(node_env, name)
    assert done["phase"] == "Succeeded", done
    assert [p["metadata"]["name"] for p in run_pods(node_env, name)] == [f"{name}-1"]
    unharmed(node_env, run_alongside)


def test_the_run_alongside_the_malformed_ones_succeeds(
    node_env: Environment, gate: ToolGate, run_alongside: str
) -> None:
    unharmed(node_env, run_alongside)
    gate.release(run_alongside)
    done = ended(node_env, run_alongside)
    assert done["phase"] == "Succeeded", done
    assert done["answer"].startswith("shell returned: exit code 0"), done
    assert done.get("restarts", 0) == 0 and gate.starts(run_alongside) == 1
