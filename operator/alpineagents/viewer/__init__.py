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

The names here load their module when first read: the command line imports
:mod:`.command` for the ``ui`` command's arguments on every start (a pod's too, where a
resume waits for that start), and that alone must not load the viewer.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .service import RunViewer, ViewerError
    from .timeline import Row, Summary, Timeline

_HOMES = {
    "Row": ".timeline",
    "RunViewer": ".service",
    "Summary": ".timeline",
    "Timeline": ".timeline",
    "ViewerError": ".service",
}

__all__ = ["Row", "RunViewer", "Summary", "Timeline", "ViewerError"]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])
