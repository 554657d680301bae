"""Garbage collection paused while a load builds objects that all stay alive.

A load makes a few objects for each history entry and keeps every one. Python's
collector still runs a pass every few hundred new objects, and its full passes walk the
whole heap: on a long history they took half of a load's time and freed nothing.

Even paused, what a load made is young: the first pass after it walks every one of those
objects, and the next older generation's pass walks them again, to find nothing to free
(a loaded State lives as long as its run). ``paused(long_lived=True)`` hands them to the
oldest generation when the block ends, which only full passes walk: ``gc.freeze()`` then
``gc.unfreeze()``, two list splices. Before the block, a pass over the youngest objects
(the few hundred made since the last pass) frees the young garbage of the rest of the
process, so that none of it is moved along; what other threads make during the block is
moved with the load's and freed by the next full pass if it is garbage. A process that
froze objects itself (``gc.freeze()`` before forking workers) keeps them frozen: then
nothing is moved.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def paused(*, long_lived: bool = False) -> Iterator[None]:
    """No collection passes inside the block (if collection was on, it is on again after).

    ``long_lived``: what the block makes is kept (a loaded State): it goes straight to the
    oldest generation (see the module's text)."""
    if not gc.isenabled():
        yield
        return
    move = long_lived and gc.get_freeze_count() == 0
    if move:
        gc.collect(0)
    gc.disable()
    try:
        yield
    finally:
        if move and gc.get_freeze_count() == 0:
            gc.freeze()
            gc.unfreeze()
        gc.enable()
