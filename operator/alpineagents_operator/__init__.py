"""The alpineagents operator: turns AgentRun custom resources into pods that resume.

Run it with ``python -m alpineagents_operator`` (see :mod:`alpineagents_operator.__main__`).
The reconcile logic is a pure function, :func:`alpineagents_operator.deciding.decide.decide`;
the kopf handlers in :mod:`alpineagents_operator.edge.handlers` only feed it and carry out
what it decides.

The names here are imported on first access, so importing one module of the operator
(``alpineagents_operator.kube.config``, say) loads only what that module needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from alpineagents_operator.deciding.decide import Decision, decide
    from alpineagents_operator.kube.config import OperatorConfig

_HOMES: dict[str, str] = {
    "Decision": ".deciding.decide",
    "OperatorConfig": ".kube.config",
    "decide": ".deciding.decide",
}

__all__ = ["Decision", "OperatorConfig", "decide"]


def __getattr__(name: str) -> Any:
    """Imports a public name's module on first access, then keeps the name here."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
