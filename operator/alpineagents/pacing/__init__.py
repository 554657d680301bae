"""Sharing a key's rate limits: a run waits for capacity instead of failing.

Every model request asks a :class:`Pacer` for its turn first. :class:`HeaderPacer` paces
one process by the provider's own signals (``anthropic-ratelimit-*``, ``retry-after``);
:class:`SharedPacer` asks the fleet's shared limiter (:mod:`.service`, ``alpineagents
pacer``), which hands out a key's turns in a fair order. A refusal (429, 529) goes back to
the pacer as a wait; each wait is reported as a :class:`Throttle`.
"""

from __future__ import annotations

import hashlib

from .pacer import HeaderPacer, Pacer, Report, Throttle, Ticket
from .shared import SharedPacer
from .signals import Limit, RateSignals, request_cost

__all__ = [
    "HeaderPacer",
    "Limit",
    "Pacer",
    "RateSignals",
    "Report",
    "SharedPacer",
    "Throttle",
    "Ticket",
    "key_fingerprint",
    "request_cost",
]


def key_fingerprint(key: str) -> str:
    """A name for an API key that does not reveal it: the shared limiter groups runs by it."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]
