"""Freshness SLOs: when a tenant's delivery is expected, parsed from one line of text, and
"which delivery was due last, and when" for an explicit clock.

    daily by 06:00 Europe/Berlin          the folder dated D is loaded by 06:00 on D, local
    daily by 06:00 on business days       the same, Monday to Friday only (UTC)
    hourly within 20 min                  something loaded in each hour, by 20 past
    hourly within 20 min Europe/Berlin on business days
    off                                   no expectation (a tenant exempt from the default)

The time zone is an IANA name (default UTC); the due time is local, so a daily SLO follows
daylight saving time. Business days are Monday to Friday in that zone; public holidays are
not known. Every function takes `now` (aware): tests, the flow and the CLI pass their clock.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from fleet_import.errors import InvalidInput

OFF = "off"
EXPECTED_FORMS = (
    "'daily by HH:MM [Area/City] [on business days]', "
    "'hourly within N min [Area/City] [on business days]' or 'off'"
)
_HOUR = dt.timedelta(hours=1)
_DAY = dt.timedelta(days=1)
_FIRST_WEEKEND_DAY = 5  # date.weekday(): Saturday
_SYNTAX = re.compile(
    r"(?:daily\s+by\s+(?P<at>\d{1,2}:\d{2})"
    r"|hourly\s+within\s+(?P<within>\d+)\s*(?:min|mins|minutes?))"
    r"(?:\s+(?P<zone>(?!on\s)[A-Za-z][A-Za-z0-9_+\-]*(?:/[A-Za-z0-9_+\-]+)*))?"
    r"(?P<business>\s+on\s+business\s+days)?",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Due:
    """The delivery a check expects now: due at `at`; `delivery_date` is the folder date it
    names (daily), `since` the earliest load that counts for it (hourly: the hour's start)."""

    at: dt.datetime
    since: dt.datetime
    delivery_date: dt.date | None = None


@dataclass(frozen=True)
class Slo:
    """One expectation: daily by `at` (local), or hourly within `within` past the hour."""

    text: str
    zone: str = "UTC"
    daily_at: dt.time | None = None
    hourly_within: dt.timedelta | None = None
    business_days: bool = False

    @property
    def off(self) -> bool:
        return self.daily_at is None and self.hourly_within is None

    @property
    def tz(self) -> ZoneInfo:
        return ZoneInfo(self.zone)

    def last_due(self, now: dt.datetime) -> Due | None:
        """The most recent due time at or before `now` (None when off)."""
        _aware(now)
        if self.daily_at is not None:
            day = now.astimezone(self.tz).date()
            while not self._counts(day) or self._daily(day) > now:
                day -= _DAY
            return Due(self._daily(day), self._daily(day) - _DAY, day)
        if self.hourly_within is not None:
            due = self._hour_start(now) + self.hourly_within
            while due > now or not self._counts(due.astimezone(self.tz).date()):
                due = self._hour_start(due - _HOUR) + self.hourly_within
            return Due(due, due - self.hourly_within)
        return None

    def next_due(self, now: dt.datetime) -> dt.datetime | None:
        """The first due time after `now` (None when off)."""
        _aware(now)
        if self.daily_at is not None:
            day = now.astimezone(self.tz).date()
            while not self._counts(day) or self._daily(day) <= now:
                day += _DAY
            return self._daily(day)
        if self.hourly_within is not None:
            due = self._hour_start(now) + self.hourly_within
            while due <= now or not self._counts(due.astimezone(self.tz).date()):
                due = self._hour_start(due + _HOUR) + self.hourly_within
            return due
        return None

    def _counts(self, day: dt.date) -> bool:
        return not self.business_days or day.weekday() < _FIRST_WEEKEND_DAY

    def _daily(self, day: dt.date) -> dt.datetime:
        assert self.daily_at is not None
        local = dt.datetime.combine(day, self.daily_at, self.tz)
        return local.astimezone(dt.UTC)

    def _hour_start(self, moment: dt.datetime) -> dt.datetime:
        """The start of the local hour holding `moment`, in UTC (a zone offset by half an
        hour has its hours start at :30 UTC)."""
        local = moment.astimezone(self.tz)
        return (
            local
            - dt.timedelta(
                minutes=local.minute, seconds=local.second, microseconds=local.microsecond
            )
        ).astimezone(dt.UTC)


def parse_slo(text: object) -> Slo:
    """One SLO from its text; InvalidInput says what was expected (the caller adds where)."""
    if not isinstance(text, str):
        raise InvalidInput(f"expected text like {EXPECTED_FORMS}, got {type(text).__name__}")
    spelled = " ".join(text.split())
    if spelled.lower() == OFF:
        return Slo(OFF)
    found = _SYNTAX.fullmatch(spelled)
    if found is None:
        raise InvalidInput(f"{text!r}: expected {EXPECTED_FORMS}")
    zone = found["zone"] or "UTC"
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidInput(f"{text!r}: unknown time zone {zone!r} (an IANA name)") from None
    business = found["business"] is not None
    if found["at"] is not None:
        hours, minutes = (int(part) for part in found["at"].split(":"))
        if hours > 23 or minutes > 59:
            raise InvalidInput(f"{text!r}: {found['at']} is no time of day (00:00-23:59)")
        return Slo(spelled, zone, daily_at=dt.time(hours, minutes), business_days=business)
    within = int(found["within"])
    if not 0 <= within < 60:
        raise InvalidInput(f"{text!r}: within {within} min: expected 0-59 minutes past the hour")
    return Slo(spelled, zone, hourly_within=dt.timedelta(minutes=within), business_days=business)


def _aware(now: dt.datetime) -> None:
    if now.tzinfo is None:
        raise ValueError("a freshness check needs an aware `now` (a time zone)")
