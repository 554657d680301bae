"""An AgentSchedule's ``schedule`` and ``timeZone``: the cron times, as CronJob reads them.

Five fields (minute, hour, day of month, month, day of week) or one of CronJob's macros
(``@hourly``, ``@daily``, ...), evaluated in an IANA time zone (UTC by default) with
cronsim, which also steps over daylight-saving changes as cron does. Times come back in
UTC.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


class InvalidSchedule(ValueError):
    """The schedule or its time zone cannot be read; ``reason`` is the Event's reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class CronTimes:
    """The times one cron expression names, in one time zone."""

    expression: str
    """Five fields (a macro already expanded)."""
    zone: tzinfo

    def most_recent(self, now: datetime) -> datetime:
        """The latest time at or before ``now``."""
        start = now.astimezone(self.zone).replace(microsecond=0) + timedelta(seconds=1)
        return next(CronSim(self.expression, start, reverse=True)).astimezone(UTC)

    def next_after(self, moment: datetime) -> datetime:
        """The first time after ``moment``."""
        start = moment.astimezone(self.zone).replace(microsecond=0)
        return next(CronSim(self.expression, start)).astimezone(UTC)

    def count_between(self, after: datetime, before: datetime, most: int) -> int:
        """How many times lie strictly between ``after`` and ``before`` (counted up to
        ``most`` + 1 at most: past that the exact number does not matter)."""
        count = 0
        for moment in CronSim(self.expression, after.astimezone(self.zone).replace(microsecond=0)):
            if moment.astimezone(UTC) >= before or count > most:
                break
            count += 1
        return count


def parse_cron(schedule: str, time_zone: str | None) -> CronTimes:
    """``schedule`` in ``time_zone`` (None: UTC), or :class:`InvalidSchedule` saying what
    is wrong and what to write instead."""
    text = " ".join(schedule.split())
    if text.upper().startswith(("TZ=", "CRON_TZ=")):
        raise InvalidSchedule(
            "InvalidSchedule",
            f"spec.schedule {schedule!r} names a time zone: put it in spec.timeZone instead "
            f"(e.g. timeZone: Europe/Berlin) and keep the five cron fields in spec.schedule",
        )
    expression = _MACROS.get(text.lower(), text)
    if len(expression.split(" ")) != 5:
        raise InvalidSchedule(
            "InvalidSchedule",
            f"spec.schedule {schedule!r} is not a cron schedule: give five fields "
            f"(minute hour day-of-month month day-of-week, e.g. '*/15 * * * *') or one of "
            f"{', '.join(sorted(_MACROS))}",
        )
    zone = _zone(time_zone)
    try:
        CronSim(expression, datetime.now(zone))
    except CronSimError as error:
        raise InvalidSchedule(
            "InvalidSchedule",
            f"spec.schedule {schedule!r} is not a cron schedule ({error}): give five fields "
            f"(minute 0-59, hour 0-23, day of month 1-31, month 1-12, day of week 0-6), "
            f"e.g. '*/15 * * * *'",
        ) from None
    return CronTimes(expression, zone)


def _zone(name: str | None) -> tzinfo:
    if not name:
        return UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidSchedule(
            "UnknownTimeZone",
            f"spec.timeZone {name!r} is not a time zone this operator knows: give an IANA "
            f"name such as Europe/Berlin, America/New_York or UTC",
        ) from None
