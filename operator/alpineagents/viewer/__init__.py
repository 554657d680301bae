"""The run viewer: ``alpineagents ui`` shows runs and their whole lives in a browser.

It serves one page on 127.0.0.1 with the user's own store credentials and kubeconfig
(like ``kubectl proxy``): the runs list (subagents under their parent; in cluster mode
each AgentRun's phase, attempt, restarts and tokens), and a run's timeline (model
requests, tool calls as bars, outcomes, each attempt and resume, compactions, messages
sent while running, the answer, token use), updated live from what the store saved.
It only reads, unless approvals are turned on (``--allow-approvals``).

The parts: :mod:`.timeline` (entries to rows), :mod:`.service` (what the routes call),
:mod:`.cluster` (AgentRuns), :mod:`.web` (the Starlette routes), :mod:`.command`
(``alpineagents ui``) and ``static/`` (the page: plain JS and CSS, no framework).
Needs the ``ui`` extra: ``pip install 'alpineagents[ui]'``.
"""

from .service import RunViewer, ViewerError
from .timeline import Row, Summary, Timeline

__all__ = ["Row", "RunViewer", "Summary", "Timeline", "ViewerError"]
