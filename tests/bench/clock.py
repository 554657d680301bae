"""A clock whose seconds pass only when a test says so: one for a model server, a limiter
and a pacer at once (a pacer's ``sleep`` moves it)."""

from __future__ import annotations


class FakeClock:
    """Seconds that pass only when a test says so (:meth:`advance`, or a pacer's
    :meth:`sleep`)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
