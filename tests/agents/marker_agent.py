"""An agent for the operator's end-to-end tests, named in an AgentRun as
``agent: tests.agents.marker_agent:make_agent``.

Its one tool, ``step(name)``, leaves a marker file each time it *starts* (so a test can
count how often a call really ran, across pods), then waits until the test releases it.
The folder is the pod's ``MARKER_DIR`` (set through ``spec.env``):

- ``<name>.started.<pid>``: written when the step starts, one per run of the tool;
- ``<name>.release``: the test creates it to let the step finish (create it before
  the run to make the step return at once);
- ``hold.<attempt>``: while it exists, the pod of that attempt (``ALPINEAGENTS_ATTEMPT``)
  waits before it builds its agent, so before it touches the store.

With the scripted model in echo mode, a prompt line ``use step {"name": "a"}`` makes
the model call the tool.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from alpineagents import Agent, tool

_POLL_SECONDS = 0.05


@tool
def step(name: str) -> str:
    """Do one slow step of the job; it takes until it is released.

    Args:
        name: Which step.
    """
    folder = Path(os.environ["MARKER_DIR"])
    (folder / f"{name}.started.{os.getpid()}").write_text(str(time.time()))
    release = folder / f"{name}.release"
    # The tool is what a real slow step would be: busy until something outside says so.
    while not release.exists():
        time.sleep(_POLL_SECONDS)
    return f"{name} done"


def make_agent(spec: dict[str, Any]) -> Agent:
    """The Agent for an AgentRun spec: its model, and the ``step`` tool."""
    hold = Path(os.environ["MARKER_DIR"]) / f"hold.{os.environ.get('ALPINEAGENTS_ATTEMPT', '')}"
    while hold.exists():
        time.sleep(_POLL_SECONDS)
    return Agent(str(spec["model"]), tools=[step], max_tokens=1024)
