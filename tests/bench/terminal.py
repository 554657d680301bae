"""Children that get Ctrl+C the way a program started from a terminal does.

A shell that starts pytest in the background (``pytest &``, CI runners, ``nohup``) sets
SIGINT to "ignored", and every child inherits that: a test's SIGINT would then do nothing.
``subprocess.Popen(..., preexec_fn=default_sigint)`` gives the child the default
disposition back, as a terminal would; a Python child then installs its usual
KeyboardInterrupt handler at startup.
"""

from __future__ import annotations

import signal


def default_sigint() -> None:
    """``preexec_fn`` for a child that must react to SIGINT even if this process ignores it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
