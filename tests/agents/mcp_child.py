"""A child process that runs an agent with an MCP server until its parent kills it.

Usage: python -m tests.agents.mcp_child FOLDER STATE_ID URL
It prints ``saved <kinds>`` after each save, so the parent can kill it at an exact point.
"""

from __future__ import annotations

import sys
from typing import Any

from alpineagents import Agent, FileStore, Message, State
from alpineagents.mcp import MCPServer

folder, state_id, url = sys.argv[1], sys.argv[2], sys.argv[3]


class ReportingStore(FileStore):
    """Tells the parent what each save wrote."""

    def write(
        self,
        state_id: str,
        entries: list[dict[str, Any]],
        info: dict[str, Any],
        *,
        create: bool = False,
    ) -> None:
        super().write(state_id, entries, info, create=create)
        print("saved " + " ".join(e["kind"] for e in entries), flush=True)


agent = Agent(
    model="claude-sonnet-5",
    store=ReportingStore(folder),
    tools=[MCPServer("calc", url=url)],
    max_tokens=1024,
)
agent.run(State(id=state_id, messages=[Message.user("Add 2 and 3, and count slowly")]))
