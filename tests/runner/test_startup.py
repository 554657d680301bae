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
    "alpineagents.viewer.service",  # the `ui` command's arguments are parsed, its viewer unused
    "alpineagents.viewer.timeline",
    "starlette",
    "alpineagents.testing",
)

# The pod's command itself (`python -m alpineagents run`, the spec as JSON from the
# environment), with a note of what is loaded when the store's first write begins.
_POD_START = f"""
import json, sys
from alpineagents import cli
from alpineagents.store.file import FileStore
heavy = {NOT_BEFORE_THE_FIRST_SAVE!r}
first = []
write = FileStore.write
def noting(self, *args, **kwargs):
    if not first:
        first.append(sorted(m for m in heavy if m in sys.modules))
    return write(self, *args, **kwargs)
FileStore.write = noting
code = cli.main(["run"])
print(json.dumps({{"exit": code, "loaded": first[0] if first else None}}))
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

    model_server.add(reply("The email may have gone out; I stop here."))
    spec = {"model": "claude-sonnet-5", "prompt": "Send the email.", "tools": ["shell"]}
    env = child_env(
        model_server,
        PYTHONPATH=str(REPO / "operator"),
        ALPINEAGENTS_SPEC=json.dumps(spec),
        ALPINEAGENTS_STORE=str(workspace.runs),
        ALPINEAGENTS_STATE_ID="job",
    )
    done = subprocess.run(
        [sys.executable, "-c", _POD_START],
        capture_output=True,
        text=True,
        env=env,
        cwd=workspace.work,
        check=True,
    )
    probe = json.loads(done.stdout.strip().splitlines()[-1])
    assert probe["exit"] == 0, done.stderr  # it resumed the lost run and answered
    assert probe["loaded"] == []
    (result,) = tool_results(workspace.store.load("job"))
    assert result.outcome == "aborted"  # the first save closed the lost call
    assert "closed as aborted: toolu_held" in done.stderr
