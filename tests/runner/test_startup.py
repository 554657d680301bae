"""A resumed runner's start: what it loads before it reads, claims and saves its State.

A pod's start is most of a resume's wait (issue 26), so the runner reads and claims the
State and saves its first entry before it loads anything only a model call needs (the
model client, MCP, tracing's SDK, YAML for manifest files). Each check runs the pod's
path in a fresh interpreter, since this one has loaded everything already.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys

from alpineagents.testing import ModelServer, reply, tool_use
from tests.bench.runner_process import (
    BLOCKING,
    Workspace,
    child_env,
    tool_results,
    wait_for_file,
)
from tests.paths import REPO

NOT_BEFORE_THE_FIRST_SAVE = (
    "anthropic",
    "httpx",
    "mcp",
    "opentelemetry",
    "kubernetes",
    "yaml",
    "alpineagents.viewer",
    "alpineagents.testing",
)

# The runner's own steps up to its first save after a resume (alpineagents.runner.run),
# as a pod runs them: the spec as JSON from the environment, the store from its URL.
_POD_PATH = f"""
import json, os, sys
from alpineagents.runner import (
    build_agent, open_run_store, open_state, parse_spec, spec_from_environment,
)
plan = parse_spec(spec_from_environment(os.environ))
store = open_run_store(None)
agent = build_agent(plan)
state, aborted = open_state(store, os.environ["ALPINEAGENTS_STATE_ID"], plan)
store.claim(state.id)
store.save(state)
heavy = {NOT_BEFORE_THE_FIRST_SAVE!r}
loaded = sorted(m for m in heavy if m in sys.modules)
print(json.dumps({{"aborted": aborted, "loaded": loaded}}))
"""


def test_a_resume_reads_claims_and_saves_before_loading_the_model_client(
    workspace: Workspace, model_server: ModelServer, leftover_commands: list[int]
) -> None:
    model_server.add(reply(tool_use("shell", {"command": BLOCKING}, id="toolu_held")))
    manifest = workspace.manifest(tools=["shell"], prompt="Send the email.")
    runner = workspace.start(manifest)
    leftover_commands.append(int(wait_for_file(workspace.work / "started")))
    runner.signal(signal.SIGKILL)  # the pod lost mid tool call
    assert runner.wait() == -signal.SIGKILL

    spec = {"model": "claude-sonnet-5", "prompt": "Send the email.", "tools": ["shell"]}
    env = child_env(
        model_server,
        PYTHONPATH=str(REPO / "operator"),
        ALPINEAGENTS_SPEC=json.dumps(spec),
        ALPINEAGENTS_STORE=str(workspace.runs),
        ALPINEAGENTS_STATE_ID="job",
    )
    done = subprocess.run(
        [sys.executable, "-c", _POD_PATH],
        capture_output=True,
        text=True,
        env=env,
        cwd=workspace.work,
        check=True,
    )
    probe = json.loads(done.stdout.strip().splitlines()[-1])
    assert probe["aborted"] == ["toolu_held"]  # it did resume the lost run
    assert probe["loaded"] == []
    (result,) = tool_results(workspace.store.load("job"))
    assert result.outcome == "aborted"  # and its first save went through
