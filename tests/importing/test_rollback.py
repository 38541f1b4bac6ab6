"""Rollback (issue #24): the normalized files of a scope's earlier successes are retained,
a rollback loads one's content again as a new batch, and is refused when its files are
gone; real PostgreSQL and moto."""

from __future__ import annotations

import pytest

from fleet_import.importing.context import Committed, ImportContext
from fleet_import.importing.driver import import_folder
from fleet_import.importing.guards import GuardOverride
from fleet_import.importing.rollback import NotRolledBack, rollback_slice
from fleet_import.publication.decisions import ROLLED_BACK_EVENT
from fleet_import.sample_data import csv_bytes, fleet_delivery, today_folder, trips_table
from fleet_import.scope import Tenant
from fleet_import.store.models import BatchStatus
from fleet_import.store.review_repository import ReviewRepository
from tests.helpers import layout_admission, slice_rows, upload
from tests.importing.guard_helpers import redeliver, retaining_ctx, slice_snapshot
from tests.warehouse_helpers import WAREHOUSE_BACKENDS

ACME = Tenant.named("acme")
ADMIT = layout_admission()
NO_GUARD = GuardOverride(waived=True, reason="test")


@pytest.fixture
def reviews(database_url: str) -> ReviewRepository:
    return ReviewRepository(database_url)


def unstamped(snapshot: dict[str, list[tuple]]) -> dict[str, list[tuple]]:
    """The slice's rows without their batch stamp (the last column): what a reload keeps."""
    return {table: [row[:-1] for row in rows] for table, rows in snapshot.items()}


@pytest.mark.parametrize("warehouse", WAREHOUSE_BACKENDS, indirect=True)
def test_rollback_restores_the_previous_slice_row_exact_as_a_new_batch(
    import_ctx: ImportContext, outbox, reviews, s3, landing_bucket: str, database_url: str
) -> None:
    ctx = retaining_ctx(import_ctx, outbox, reviews, keep_seconds=3600)
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=400))
    good = import_folder(ctx, ACME, folder, "d1")
    assert isinstance(good, Committed) and good.published, good
    good_slice = slice_snapshot(database_url, folder)

    redeliver(s3, folder, {"trips-1.csv": csv_bytes(trips_table(20, start=9000))})
    bad = import_folder(ctx, ACME, folder, "d2", guard=NO_GUARD)
    assert isinstance(bad, Committed) and bad.published, bad
    assert ctx.repo.get(good.batch_id).details["superseded_by"] == str(bad.batch_id)

    restored = rollback_slice(ctx, reviews, "acme", folder, admission=ADMIT)
    assert isinstance(restored, Committed) and restored.published, restored
    assert restored.batch_id not in (good.batch_id, bad.batch_id)
    assert restored.row_counts == good.row_counts
    assert unstamped(slice_snapshot(database_url, folder)) == unstamped(good_slice)
    assert slice_rows(database_url, "fleet_trips", "acme", folder) == [(restored.batch_id, 400)]
    assert ctx.warehouse.slice_owner("acme", f"fleet_s3:{folder}") == restored.batch_id
    # Nothing parsed again; the batch says what it rolled back to, and a newer success
    # supersedes the bad batch as any load would.
    assert restored.summary["cache_hits"] == len(restored.summary["files"]) == 4
    batch = ctx.repo.get(restored.batch_id)
    assert batch.status == BatchStatus.SUCCEEDED
    assert batch.details["rolled_back_to"] == str(good.batch_id)
    good_manifest = ctx.repo.get(good.batch_id).details["manifest"]
    assert batch.details["manifest"]["fingerprint"] == good_manifest["fingerprint"]
    assert ctx.repo.get(bad.batch_id).details["superseded_by"] == str(restored.batch_id)
    (event,) = [p for name, p in ctx.recorded_events if name == ROLLED_BACK_EVENT]
    assert event["rolled_back_to"] == str(good.batch_id)
    assert event["replaced"] == str(bad.batch_id)

    # Back to the bad one by id: its files were retained too.
    again = rollback_slice(ctx, reviews, "acme", folder, to=bad.batch_id, admission=ADMIT)
    assert isinstance(again, Committed), again
    assert slice_rows(database_url, "fleet_trips", "acme", folder) == [(again.batch_id, 20)]


@pytest.mark.parametrize("warehouse", WAREHOUSE_BACKENDS, indirect=True)
def test_rollback_is_refused_when_the_files_are_gone(
    import_ctx: ImportContext, outbox, reviews, s3, landing_bucket: str, database_url: str
) -> None:
    ctx = retaining_ctx(import_ctx, outbox, reviews, keep_seconds=0)
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=400))
    first = import_folder(ctx, ACME, folder, "d1")
    redeliver(s3, folder, {"trips-1.csv": csv_bytes(trips_table(300, start=5000))})
    second = import_folder(ctx, ACME, folder, "d2")
    redeliver(s3, folder, {"trips-1.csv": csv_bytes(trips_table(350, start=7000))})
    third = import_folder(ctx, ACME, folder, "d3")
    assert all(isinstance(o, Committed) for o in (first, second, third))

    # The previous success is always kept; the one before it was past its retention.
    assert isinstance(
        rollback_slice(ctx, reviews, "acme", folder, to=second.batch_id, admission=ADMIT), Committed
    )
    before = slice_snapshot(database_url, folder)
    refused = rollback_slice(ctx, reviews, "acme", folder, to=first.batch_id, admission=ADMIT)
    assert isinstance(refused, NotRolledBack), refused
    assert "are gone" in refused.reason and "trips-1.csv" in refused.reason
    assert slice_snapshot(database_url, folder) == before
    assert ctx.repo.list(status="running") == []

    owner = ctx.warehouse.slice_owner("acme", f"fleet_s3:{folder}")
    same = rollback_slice(ctx, reviews, "acme", folder, to=owner, admission=ADMIT)
    assert isinstance(same, NotRolledBack) and "owns the slice already" in same.reason


def test_default_rollbacks_walk_back_and_never_forward_to_what_a_rollback_removed(
    import_ctx: ImportContext, outbox, reviews, s3, landing_bucket: str, database_url: str
) -> None:
    """Each default rollback goes one delivery further back: the content the slice shows and
    every content a rollback removed are skipped (the second of two rollbacks chose the
    removed batch again, the newest success not owning the slice). A new delivery after
    them rolls back to what the slice showed before it, and then no further."""
    ctx = retaining_ctx(import_ctx, outbox, reviews, keep_seconds=3600)
    folder = today_folder(landing_bucket, "acme")

    def deliver(trips: int, start: int, key: str) -> Committed:
        redeliver(s3, folder, {"trips-1.csv": csv_bytes(trips_table(trips, start=start))})
        loaded = import_folder(ctx, ACME, folder, key, guard=NO_GUARD)
        assert isinstance(loaded, Committed) and loaded.published, loaded
        return loaded

    def rollback() -> Committed | NotRolledBack:
        return rollback_slice(ctx, reviews, "acme", folder, admission=ADMIT)

    def trips_now() -> int:
        [(_, rows)] = slice_rows(database_url, "fleet_trips", "acme", folder)
        return rows

    upload(s3, folder, fleet_delivery(trips=400))
    oldest = deliver(300, 1000, "d0")
    deliver(200, 2000, "d1")  # good
    truncated = deliver(10, 3000, "d2")
    first = rollback()
    assert isinstance(first, Committed) and trips_now() == 200  # back to good
    second = rollback()
    assert isinstance(second, Committed) and trips_now() == 300, second  # not to truncated
    assert ctx.repo.get(second.batch_id).details["rolled_back_to"] == str(oldest.batch_id)
    none_left = rollback()
    assert isinstance(none_left, NotRolledBack) and "--to" in none_left.reason, none_left
    assert trips_now() == 300

    deliver(50, 4000, "d3")
    after_new = rollback()  # back to what the slice showed: oldest's content, via `second`
    assert isinstance(after_new, Committed) and trips_now() == 300
    assert ctx.repo.get(after_new.batch_id).details["rolled_back_to"] == str(second.batch_id)
    # The slice shows oldest's content through two rollbacks: no batch of it is loaded again
    # (one level only chose `oldest` itself; found by test_slice_sequences on the fakes).
    nothing_new = rollback()
    assert isinstance(nothing_new, NotRolledBack) and "--to" in nothing_new.reason, nothing_new
    named = rollback_slice(ctx, reviews, "acme", folder, to=truncated.batch_id, admission=ADMIT)
    assert isinstance(named, Committed) and trips_now() == 10  # named: loaded again
