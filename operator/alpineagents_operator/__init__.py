"""The alpineagents operator: turns AgentRun custom resources into pods that resume.

Run it with ``python -m alpineagents_operator`` (see :mod:`alpineagents_operator.__main__`).
The reconcile logic is a pure function, :func:`alpineagents_operator.decide.decide`;
the kopf handlers in :mod:`alpineagents_operator.handlers` only feed it and carry out
what it decides.
"""

from .config import OperatorConfig
from .decide import Decision, decide

__all__ = ["Decision", "OperatorConfig", "decide"]
