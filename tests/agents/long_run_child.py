"""A long agent run on a store (a URL: file:// or s3://), killed and resumed by its parent (long-run tests).

Usage: python -m tests.agents.long_run_child STORE_URL STATE_ID WINDOW
Each turn the model asks for a page of about 2 KB; the run's window is WINDOW tokens, so
it clears older results and summarizes older turns many times over. It loads the State
when one is saved (a resume) and prints the answer.
"""

from __future__ import annotations

import sys

from alpineagents import Agent, Message, State, open_store, tool

url, state_id, window = sys.argv[1], sys.argv[2], int(sys.argv[3])


@tool
def fetch(page: int) -> str:
    """Fetches a page of about 2 KB.

    Args:
        page: which page
    """
    return f"page {page}: " + "lorem ipsum dolor sit amet " * 75


store = open_store(url)
agent = Agent("claude-sonnet-5", store, tools=[fetch], max_tokens=512, context_window=window)
try:
    state = store.load(state_id)
except LookupError:
    state = State(state_id, [Message.user("Fetch every page, then say Done.")])
print(agent.run(state), flush=True)
