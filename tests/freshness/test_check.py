"""The freshness check through the core, against the real operational store, moto's S3 and
real imports, with a controlled clock: a tenant expected daily by 06:00 (Berlin) with no
folder is late once, stays quiet on the next check, and is fresh again once its import
succeeds; a folder without its marker is "arrived, incomplete", not missing."""

from __future__ import annotations

import datetime as dt
import uuid
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleet_import.freshness.check import (
    FRESH,
    FRESH_AGAIN_EVENT,
    INCOMPLETE,
    LATE_EVENT,
    MISSING,
    NOT_LOADED,
    Landing,
    check_freshness,
    loads_due,
    tenants_to_check,
)
from fleet_import.freshness.policies import ANY_DATASET, load_policy
from fleet_import.freshness.slo import parse_slo
from fleet_import.importing.context import Committed
from fleet_import.importing.driver import import_folder
from fleet_import.intake.landing import LandingLayout
from fleet_import.sample_data import fleet_delivery, today_folder
from fleet_import.scope import Tenant, source_scope
from fleet_import.store.freshness_repository import FreshnessRepository, SucceededBatch
from tests.helpers import started_at, upload

ACME = Tenant.named("acme")
DAY = dt.date(2026, 7, 22)  # a Wednesday
DUE = dt.datetime(2026, 7, 22, 4, 0, tzinfo=dt.UTC)  # 06:00 in Berlin (CEST)
AFTER_DUE = DUE + dt.timedelta(minutes=30)


class Told(list):
    def __call__(self, name: str, payload) -> None:
        self.append((name, dict(payload)))


def make_checker(tmp_path: Path, database_url: str, s3, landing_bucket: str, slo: str):
    path = tmp_path / "freshness.yaml"
    path.write_text(f"landing: {{bucket: {landing_bucket}}}\ndefault: {slo}\n")
    policy = load_policy(path)
    store = FreshnessRepository(database_url)
    told = Told()

    def check(now: dt.datetime, tenants=("acme",)):
        return check_freshness(tenants, policy, store, Landing(s3), told, now)

    check.told = told  # type: ignore[attr-defined]
    check.store = store  # type: ignore[attr-defined]
    check.database_url = database_url  # type: ignore[attr-defined]
    return check


@pytest.fixture
def checker(tmp_path: Path, database_url: str, s3, landing_bucket: str):
    slo = "daily by 06:00 Europe/Berlin on business days"
    return make_checker(tmp_path, database_url, s3, landing_bucket, slo)


def deliver(s3, folder: str, *, marker: bool = True) -> None:
    files = fleet_delivery(trips=20, fuel=5, vehicles=3)
    if marker:
        files["_SUCCESS"] = b""
    upload(s3, folder, files)


def test_late_once_then_fresh_again_after_the_import(checker, import_ctx, s3, landing_bucket):
    folder = today_folder(landing_bucket, "acme", DAY)
    before = checker(DUE - dt.timedelta(minutes=1))  # yesterday's delivery is the one due
    [early] = before.verdicts
    assert early.state == MISSING and early.expected_by == DUE - dt.timedelta(days=1)
    assert [name for name, _ in checker.told] == [LATE_EVENT]  # yesterday's is missing too
    checker.told.clear()

    [late] = checker(AFTER_DUE).verdicts
    assert (late.tenant_id, late.dataset, late.state) == ("acme", ANY_DATASET, MISSING)
    assert late.expected_by == DUE and late.last_loaded is None
    assert late.found == f"no folder dated 2026-07-22 in s3://{landing_bucket}/"
    [(name, payload)] = checker.told
    assert name == LATE_EVENT  # another due time missed while late: a new late delivery
    assert payload["tenant_id"] == "acme" and payload["dataset"] == ANY_DATASET
    assert payload["expected_at"] == "2026-07-22T04:00:00+00:00"
    assert payload["found"] == late.found and payload["previous_state"] == MISSING

    checker.told.clear()
    assert checker(AFTER_DUE + dt.timedelta(minutes=10)).late  # still late ...
    assert checker.told == []  # ... and not told again

    deliver(s3, folder)
    outcome = import_folder(import_ctx, ACME, folder, "freshness-test")
    assert isinstance(outcome, Committed) and outcome.published
    started_at(checker.database_url, outcome.batch_id, AFTER_DUE + dt.timedelta(minutes=15))
    [fresh] = checker(AFTER_DUE + dt.timedelta(minutes=20)).verdicts
    assert fresh.state == FRESH and fresh.last_loaded is not None
    assert fresh.expected_by == DUE + dt.timedelta(days=1)  # the next one, Thursday 06:00
    [(name, payload)] = checker.told
    assert name == FRESH_AGAIN_EVENT
    assert payload["expected_at"] == "2026-07-22T04:00:00+00:00"
    assert payload["previous_state"] == MISSING and payload["found"] == "loaded"

    checker.told.clear()
    assert not checker(AFTER_DUE + dt.timedelta(minutes=30)).late
    assert checker.told == []
    # Friday's delivery loaded: the weekend expects nothing new, Monday 06:00 does.
    friday = today_folder(landing_bucket, "acme", dt.date(2026, 7, 24))
    deliver(s3, friday)
    loaded = import_folder(import_ctx, ACME, friday, "friday")
    assert isinstance(loaded, Committed)
    started_at(checker.database_url, loaded.batch_id, DUE + dt.timedelta(days=2))
    saturday = dt.datetime(2026, 7, 25, 12, tzinfo=dt.UTC)
    sunday = saturday + dt.timedelta(days=1)
    for moment in (saturday, sunday):
        [weekend] = checker(moment).verdicts
        assert weekend.state == FRESH, moment
        assert weekend.expected_by == dt.datetime(2026, 7, 27, 4, tzinfo=dt.UTC)
    assert checker.told == []
    [monday] = checker(dt.datetime(2026, 7, 27, 4, 1, tzinfo=dt.UTC)).verdicts
    assert monday.state == MISSING and [n for n, _ in checker.told] == [LATE_EVENT]


def test_a_folder_without_its_marker_is_arrived_incomplete(
    tmp_path, database_url, s3, landing_bucket
):
    # S3 stamps objects with the real time: the marker's age is judged against a real clock.
    checker = make_checker(tmp_path, database_url, s3, landing_bucket, "daily by 00:00 UTC")
    now = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=1)
    folder = today_folder(landing_bucket, "acme", now.date())
    deliver(s3, folder, marker=False)
    [verdict] = checker(now).verdicts
    assert verdict.state == INCOMPLETE and verdict.late
    assert verdict.found == "arrived, incomplete: waiting for its _SUCCESS marker"
    assert verdict.folder == folder
    [(name, payload)] = checker.told
    assert name == LATE_EVENT and payload["state"] == INCOMPLETE and payload["folder"] == folder

    upload(s3, folder, {"_SUCCESS": b""})  # complete now, but nobody imported it yet
    [verdict] = checker(now + dt.timedelta(minutes=5)).verdicts
    assert verdict.state == NOT_LOADED and verdict.folder == folder
    assert len(checker.told) == 1  # the same late delivery: not told again


def test_tenants_without_a_registry_are_those_the_store_knows(
    checker, import_ctx, s3, landing_bucket
) -> None:
    assert tenants_to_check(None, checker.store) == []
    folder = today_folder(landing_bucket, "acme", DAY)
    deliver(s3, folder)
    loaded = import_folder(import_ctx, ACME, folder, "known")
    started_at(checker.database_url, loaded.batch_id, DUE - dt.timedelta(minutes=5))
    assert tenants_to_check(None, checker.store) == ["acme"]
    [verdict] = checker(AFTER_DUE).verdicts
    assert verdict.state == FRESH
    assert checker.told == []  # fresh the first time: nothing to tell


def test_berlin_across_the_dst_change(tmp_path, database_url, s3, landing_bucket, import_ctx):
    """06:00 in Berlin is 05:00 UTC on Saturday 2026-03-28 (CET) and 04:00 UTC on Sunday
    (CEST, the clocks went forward): Sunday's delivery is late from 04:00 UTC."""
    checker = make_checker(
        tmp_path, database_url, s3, landing_bucket, "daily by 06:00 Europe/Berlin"
    )
    saturday = today_folder(landing_bucket, "acme", dt.date(2026, 3, 28))
    deliver(s3, saturday)
    loaded = import_folder(import_ctx, ACME, saturday, "sat")
    assert isinstance(loaded, Committed)
    started_at(database_url, loaded.batch_id, dt.datetime(2026, 3, 28, 5, 30, tzinfo=dt.UTC))
    [before] = checker(dt.datetime(2026, 3, 29, 3, 59, tzinfo=dt.UTC)).verdicts  # 05:59 CEST
    assert before.state == FRESH
    assert before.expected_by == dt.datetime(2026, 3, 29, 4, 0, tzinfo=dt.UTC)
    [after] = checker(dt.datetime(2026, 3, 29, 4, 0, tzinfo=dt.UTC)).verdicts
    assert after.state == MISSING and after.found.startswith("no folder dated 2026-03-29")
    assert [name for name, _ in checker.told] == [LATE_EVENT]


def test_datasets_and_hourly_slos_on_the_real_clock(
    tmp_path, database_url, s3, landing_bucket, import_ctx
):
    """A dataset's SLO counts only batches that loaded it; an hourly one only loads started
    in the hour (batches are stamped by the database clock, so this one runs on it)."""
    path = tmp_path / "freshness.yaml"
    path.write_text(
        f"landing: {{bucket: {landing_bucket}}}\n"
        "datasets: {trips: hourly within 59 min, returns: daily by 00:00}\n"
    )
    policy = load_policy(path)
    store = FreshnessRepository(database_url)
    told = Told()
    now = dt.datetime.now(dt.UTC)

    def check(moment):
        report = check_freshness(["acme"], policy, store, Landing(s3), told, moment)
        return {v.dataset: v for v in report.verdicts}

    before = check(now)
    assert before["trips"].state == MISSING and before["trips"].found.startswith("no new files")
    folder = today_folder(landing_bucket, "acme", now.date())
    deliver(s3, folder)
    loaded = import_folder(import_ctx, ACME, folder, "hourly")
    assert isinstance(loaded, Committed)
    # Judged a second after the first check: the same due time, whatever the real clock
    # says by now; the batch dated within that second, as if the import had been that fast
    # (one started after the moment judged did not exist then).
    started_at(database_url, loaded.batch_id, now + dt.timedelta(milliseconds=500))
    after = check(now + dt.timedelta(seconds=1))
    assert after["trips"].state == FRESH
    assert after["returns"].state == NOT_LOADED
    assert (
        after["returns"].found
        == "arrived, complete, not loaded (no succeeded batch loaded returns)"
    )
    assert sorted(name for name, _ in told) == [FRESH_AGAIN_EVENT, LATE_EVENT, LATE_EVENT]


def test_checks_running_at_once_tell_a_change_once(database_url: str) -> None:
    """A verdict is judged against the remembered one while its row is locked: a second
    check that reads while the first is still deciding waits, then sees the first's verdict
    and tells nothing (read unlocked, both would tell the same change)."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from fleet_import.store.freshness_repository import StoredVerdict

    store = FreshnessRepository(database_url)
    late = StoredVerdict("acme", ANY_DATASET, MISSING, True, DUE, "no folder", AFTER_DUE)
    fresh = StoredVerdict("acme", ANY_DATASET, FRESH, False, None, "loaded", DUE)
    store.remember(fresh, lambda previous: False)  # a row both checks find (and lock)
    deciding = threading.Event()

    def first(previous: StoredVerdict) -> bool:
        deciding.set()
        time.sleep(1.0)  # the second check reads meanwhile
        return not previous.late

    with ThreadPoolExecutor(max_workers=2) as pool:
        one = pool.submit(store.remember, late, first)
        assert deciding.wait(10)
        two = pool.submit(store.remember, late, lambda previous: not previous.late)
        (before_one, told_one), (before_two, told_two) = one.result(), two.result()
    assert (before_one.state, told_one) == (FRESH, True)
    assert (before_two.state, before_two.late, told_two) == (MISSING, True, False)
    [stored] = store.verdicts()
    assert stored.late and stored.expected_at == DUE and stored.changed_at == AFTER_DUE


def test_late_tenants_share_the_landing_listings(checker, s3, landing_bucket) -> None:
    """One LIST of the tenants' level however many tenants are late, then one per folder
    that exists (the layout enters `{tenant}/fleet/{yyyy-mm-dd}/` by name)."""
    deliver(s3, today_folder(landing_bucket, "globex", DAY), marker=False)
    prefixes: list[str] = []

    def count(params, **_):
        prefixes.append(params.get("Prefix", ""))

    s3.meta.events.register("before-parameter-build.s3.ListObjectsV2", count)
    try:
        report = checker(AFTER_DUE, tenants=("acme", "globex", "initech"))
    finally:
        s3.meta.events.unregister("before-parameter-build.s3.ListObjectsV2", count)
    states = {v.tenant_id: v.state for v in report.verdicts}
    assert states == {"acme": MISSING, "globex": INCOMPLETE, "initech": MISSING}
    # acme and initech have no folder at all: the tenants' level says so, nothing more listed
    assert prefixes == ["", "globex/fleet/2026-07-22/"]


_JULY = dt.datetime(2026, 7, 1, tzinfo=dt.UTC)


@given(
    slo_text=st.sampled_from(
        ["daily by 06:00 Europe/Berlin", "daily by 23:30 UTC on business days", "daily by 00:00"]
    ),
    now_minutes=st.integers(0, 60 * 24 * 20),
    started_minutes=st.integers(0, 60 * 24 * 20),
    folder_day=st.integers(0, 20),
)
def test_a_load_counts_only_if_it_existed_and_its_folder_was_due_by_then(
    slo_text: str, now_minutes: int, started_minutes: int, folder_day: int
) -> None:
    """Whatever the moment judged: a batch started after it, or one whose folder is dated
    after its day (in the SLO's zone), never makes the due delivery loaded."""
    slo = parse_slo(slo_text)
    now = _JULY + dt.timedelta(minutes=now_minutes)
    due = slo.last_due(now)
    assert due is not None
    dated = _JULY.date() + dt.timedelta(days=folder_day)
    folder = today_folder("landing", "acme", dated)
    started = _JULY + dt.timedelta(minutes=started_minutes)
    batch = SucceededBatch("acme", source_scope(folder), uuid.uuid4(), started, ())
    counted = loads_due(batch, due, slo, LandingLayout(), now)
    if batch.started_at > now or dated > now.astimezone(slo.tz).date():
        assert not counted
    else:
        assert counted == (dated >= due.delivery_date)
