"""Garbage collection paused while a load builds objects that all stay alive.

A load makes a few objects for each history entry and keeps every one. Python's
collector still runs a pass every few hundred new objects, and its full passes walk the
whole heap: on a long history they took half of a load's time and freed nothing.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """No collection passes inside the block (if collection was on, it is on again after)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
