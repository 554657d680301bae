"""The store errors, one family: catch :class:`StoreError` for any of them.

Each also derives from the built-in exception that stores raised before the family
existed (``ValueError``, ``LookupError``, ``ConnectionError``, ``RuntimeError``), so code
that catches those keeps working, and a store of your own may raise the built-in ones.
This module sits below every other one (the State raises format errors while loading),
so it imports nothing of the package.
"""

from __future__ import annotations

__all__ = [
    "MissingBucketError",
    "StateExistsError",
    "StateFencedError",
    "StateFormatError",
    "StateNotFoundError",
    "StoreError",
    "StoreUnavailableError",
]


class StoreError(Exception):
    """Base of the errors a store raises about saved States."""


class StateNotFoundError(StoreError, LookupError):
    """No saved State has this id (``load``, or a write without ``create``)."""


class StateExistsError(StoreError, ValueError):
    """``create`` of an id a saved State already has: load it, or pick another id."""


class StateFormatError(StoreError, ValueError):
    """A saved State this version cannot read: another format, or a damaged history."""


class StateFencedError(StoreError, RuntimeError):
    """Another writer took this State over: this one must stop writing it.

    Raised by a write (or claim) whose conditional ``info.json`` PUT found another
    writer's version. Nothing this writer tried to save is visible to a load.
    """


class StoreUnavailableError(StoreError, ConnectionError):
    """The store could not be reached or did not answer in time; a retry may help."""


class MissingBucketError(StoreError, RuntimeError):
    """The bucket does not exist and the store may not (or could not) create it."""
