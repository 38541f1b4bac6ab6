"""Freshness SLOs: the expressions, strictly parsed, and "which delivery was due last" for a
controlled clock (business days, time zones across a DST change)."""

from __future__ import annotations

import datetime as dt

import pytest

from fleet_import.errors import InvalidInput
from fleet_import.freshness.slo import parse_slo

UTC = dt.UTC


def at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).astimezone(UTC)


def test_daily_by_a_local_time_names_the_folder_date_it_expects() -> None:
    slo = parse_slo("daily by 06:00 UTC")
    before = slo.last_due(at("2026-07-22T05:59:00+00:00"))
    after = slo.last_due(at("2026-07-22T06:00:00+00:00"))
    assert (before.delivery_date, before.at) == (dt.date(2026, 7, 21), at("2026-07-21T06:00Z"))
    assert (after.delivery_date, after.at) == (dt.date(2026, 7, 22), at("2026-07-22T06:00Z"))
    assert slo.next_due(at("2026-07-22T06:00:00+00:00")) == at("2026-07-23T06:00Z")
    assert parse_slo("daily by 6:00").zone == "UTC"


def test_europe_berlin_follows_daylight_saving_time() -> None:
    """06:00 in Berlin is 05:00 UTC in winter (CET) and 04:00 UTC in summer (CEST); the clocks
    went forward on 2026-03-29."""
    slo = parse_slo("daily by 06:00 Europe/Berlin")
    saturday = slo.last_due(at("2026-03-28T05:30:00+00:00"))  # 06:30 CET: due at 05:00 UTC
    assert (saturday.delivery_date, saturday.at) == (dt.date(2026, 3, 28), at("2026-03-28T05:00Z"))
    early_sunday = slo.last_due(at("2026-03-29T03:59:00+00:00"))  # 05:59 CEST: not due yet
    assert early_sunday.delivery_date == dt.date(2026, 3, 28)
    sunday = slo.last_due(at("2026-03-29T04:00:00+00:00"))  # 06:00 CEST
    assert (sunday.delivery_date, sunday.at) == (dt.date(2026, 3, 29), at("2026-03-29T04:00Z"))
    assert slo.next_due(at("2026-03-28T05:30:00+00:00")) == at("2026-03-29T04:00Z")
    # and back in October: 06:00 CET is 05:00 UTC again
    assert slo.next_due(at("2026-10-25T00:00:00+00:00")) == at("2026-10-25T05:00Z")


def test_business_days_skip_the_weekend() -> None:
    slo = parse_slo("daily by 06:00 Europe/Berlin on business days")
    # Saturday and Sunday noon, and Monday before 06:00: Friday's delivery is the one due.
    for moment in ("2026-07-25T12:00+02:00", "2026-07-26T12:00+02:00", "2026-07-27T05:00+02:00"):
        assert slo.last_due(at(moment)).delivery_date == dt.date(2026, 7, 24), moment
    assert slo.next_due(at("2026-07-24T07:00+02:00")) == at("2026-07-27T06:00+02:00")
    assert slo.last_due(at("2026-07-27T06:00+02:00")).delivery_date == dt.date(2026, 7, 27)


def test_hourly_within_minutes_past_the_hour() -> None:
    slo = parse_slo("hourly within 20 min")
    due = slo.last_due(at("2026-07-22T10:25:00+00:00"))
    assert (due.at, due.since, due.delivery_date) == (
        at("2026-07-22T10:20Z"),
        at("2026-07-22T10:00Z"),
        None,
    )
    assert slo.last_due(at("2026-07-22T10:19:00+00:00")).at == at("2026-07-22T09:20Z")
    assert slo.next_due(at("2026-07-22T10:20:00+00:00")) == at("2026-07-22T11:20Z")
    weekdays = parse_slo("hourly within 5 minutes Europe/Berlin on business days")
    assert weekdays.last_due(at("2026-07-25T12:00+02:00")).at == at("2026-07-24T23:05+02:00")
    assert weekdays.next_due(at("2026-07-25T12:00+02:00")) == at("2026-07-27T00:05+02:00")


def test_off_expects_nothing() -> None:
    slo = parse_slo(" OFF ")
    assert slo.off and slo.last_due(at("2026-07-22T10:00Z")) is None
    assert slo.next_due(at("2026-07-22T10:00Z")) is None


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("daily at 06:00", "expected 'daily by HH:MM"),
        ("daily by 25:00", "25:00 is no time of day"),
        ("daily by 06:00 Europe/Berln", "unknown time zone 'Europe/Berln'"),
        ("hourly within 75 min", "expected 0-59 minutes"),
        ("hourly by 06:00", "expected 'daily by HH:MM"),
        ("daily by 06:00 on weekends", "expected 'daily by HH:MM"),
        ("", "expected 'daily by HH:MM"),
    ],
)
def test_a_mistake_says_what_was_expected(text: str, why: str) -> None:
    with pytest.raises(InvalidInput, match=why.replace("(", r"\(")):
        parse_slo(text)


def test_not_text_is_refused() -> None:
    with pytest.raises(InvalidInput, match="got int"):
        parse_slo(6)


def test_a_naive_clock_is_refused() -> None:
    with pytest.raises(ValueError, match="aware"):
        parse_slo("daily by 06:00").last_due(dt.datetime(2026, 7, 22, 6))
