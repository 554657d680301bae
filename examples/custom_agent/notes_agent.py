"""A user-written agent for an AgentRun's ``spec.agent: notes_agent:make_agent``.

The runner imports this module (from the folder it runs in, or from PYTHONPATH), calls
``make_agent(spec)`` with the AgentRun's spec and runs the Agent it returns; the spec's
``model``, ``tools``, ``maxTurns`` and ``requireApproval`` apply on top of it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from alpineagents import Agent, tool

NOTES = Path("notes.jsonl")


@tool
def add_note(text: str) -> str:
    """Save a note for later.

    Args:
        text: what to remember
    """
    with NOTES.open("a", encoding="utf-8") as file:
        file.write(json.dumps({"text": text}) + "\n")
    return f"noted ({sum(1 for _ in NOTES.open(encoding='utf-8'))} notes so far)"


@tool
def list_notes() -> str:
    """List the saved notes, one per line."""
    if not NOTES.exists():
        return "(no notes yet)"
    return "\n".join(json.loads(line)["text"] for line in NOTES.open(encoding="utf-8"))


def make_agent(spec: dict[str, Any]) -> Agent:
    """The notes agent; ``spec["notesSystem"]``, if given, replaces its system prompt."""
    system = spec.get("notesSystem", "You keep the user's notes with add_note and list_notes.")
    return Agent(model=spec["model"], tools=[add_note, list_notes], system=system)
