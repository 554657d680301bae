"""One long run in a process of its own, to be killed and resumed (the resume benchmark).

``python benchmarks/long_run_child.py FOLDER ID WINDOW [--hang-at N]`` runs or
resumes State ``ID`` in a FileStore at ``FOLDER`` with our Agent's defaults, against the
model at ``ANTHROPIC_BASE_URL``. With ``--hang-at N`` the tool call of turn ``N`` prints
``hanging at N`` and never returns, so the parent can kill the process in the middle of
that call at a moment it knows.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "operator"), str(REPO)]

from alpineagents import FileStore, Message, State, StateNotFoundError, tool  # noqa: E402
from benchmarks.billed_runs import FIRST_MESSAGE, ours_agent, result  # noqa: E402

_hang_at: int | None = None


@tool
async def check_service(service: int) -> str:
    """Runs the health checks of one service and returns their log.

    Args:
        service: the service's number
    """
    if service == _hang_at:
        print(f"hanging at {service}", flush=True)
        await asyncio.Event().wait()  # until the parent's SIGKILL
    return result(service)


def main() -> None:
    global _hang_at
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("id")
    parser.add_argument("window", type=int)
    parser.add_argument("--hang-at", type=int, default=None)
    args = parser.parse_args()
    _hang_at = args.hang_at
    store = FileStore(args.folder)
    try:
        state = store.load(args.id)
    except StateNotFoundError:
        state = State(args.id, [Message.user(FIRST_MESSAGE)])
    agent = ours_agent(store, None, args.window, cached=True, tools=[check_service])
    agent.run(state)


if __name__ == "__main__":
    main()
