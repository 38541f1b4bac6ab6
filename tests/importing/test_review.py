"""Review of held batches (issue #24): approval loads exactly the held content from its
staged files, changed content is refused, rejection closes; real PostgreSQL and moto (an
overtaken approval on the fakes too)."""

from __future__ import annotations

import pytest

from fleet_import.importing.claim import new_owner
from fleet_import.importing.context import Claimed, Committed, Failed, ImportContext
from fleet_import.importing.driver import CoreSteps, import_batch, import_folder
from fleet_import.importing.guards import GuardOverride
from fleet_import.importing.review import (
    Approval,
    NotApproved,
    approve_held,
    check_approval,
    claim_approval,
    reject_held,
)
from fleet_import.sample_data import csv_bytes, fleet_delivery, today_folder, trips_table
from fleet_import.scope import Tenant
from fleet_import.store.details import FailureKind
from fleet_import.store.models import BatchStatus
from fleet_import.store.review_repository import ReviewRepository
from tests.fakes.world import memory_world
from tests.helpers import layout_admission, slice_rows, upload
from tests.importing.guard_helpers import redeliver, slice_snapshot
from tests.warehouse_helpers import WAREHOUSE_BACKENDS

ACME = Tenant.named("acme")


@pytest.fixture
def reviews(database_url: str) -> ReviewRepository:
    return ReviewRepository(database_url)


def held_redelivery(import_ctx: ImportContext, s3, folder: str) -> Failed:
    upload(s3, folder, fleet_delivery(trips=400))
    assert isinstance(import_folder(import_ctx, ACME, folder, "d1"), Committed)
    redeliver(s3, folder, {"trips-1.csv": csv_bytes(trips_table(10))})
    held = import_folder(import_ctx, ACME, folder, "d2")
    assert isinstance(held, Failed) and held.kind == FailureKind.HELD, held
    return held


@pytest.mark.parametrize("warehouse", WAREHOUSE_BACKENDS, indirect=True)
def test_approval_loads_the_held_content_from_its_staged_files(
    publishing_ctx: ImportContext, s3, landing_bucket: str, database_url: str, reviews
) -> None:
    import_ctx = publishing_ctx  # the approval is told by its batch's notify step
    folder = today_folder(landing_bucket, "acme")
    held = held_redelivery(import_ctx, s3, folder)
    assert [b.id for b in reviews.held_batches("acme")] == [held.batch_id]

    approved = approve_held(import_ctx, held.batch_id, admission=layout_admission())
    assert isinstance(approved, Committed) and approved.published, approved
    assert approved.batch_id != held.batch_id
    assert slice_rows(database_url, "fleet_trips", "acme", folder) == [(approved.batch_id, 10)]
    # Nothing parsed again: every file came from the held batch's cache entries.
    assert approved.summary["cache_hits"] == len(approved.summary["files"]) == 3
    batch = import_ctx.repo.get(approved.batch_id)
    assert batch.details["approves"] == str(held.batch_id)
    assert batch.details["guard"]["waived"] is True
    held_batch = import_ctx.repo.get(held.batch_id)
    assert held_batch.details["review"]["decision"] == "approved"
    assert held_batch.details["review"]["batch_id"] == str(approved.batch_id)
    assert held_batch.details["manifest"]["fingerprint"] == batch.details["manifest"]["fingerprint"]
    assert reviews.held_batches("acme") == []
    assert import_ctx.repo.list(status="running") == []
    names = [name for name, _ in import_ctx.recorded_events]
    assert "fleet.batch.held" in names
    (told,) = [p for name, p in import_ctx.recorded_events if name == "fleet.batch.approved"]
    assert told["batch_id"] == str(held.batch_id)
    assert told["approved_by"] == str(approved.batch_id)

    again = approve_held(import_ctx, held.batch_id, admission=layout_admission())
    assert isinstance(again, NotApproved) and "already approved" in again.reason


@pytest.mark.parametrize("warehouse", WAREHOUSE_BACKENDS, indirect=True)
def test_approval_of_content_that_changed_is_refused(
    import_ctx: ImportContext, s3, landing_bucket: str, database_url: str, reviews
) -> None:
    folder = today_folder(landing_bucket, "acme")
    held = held_redelivery(import_ctx, s3, folder)
    before = slice_snapshot(database_url, folder)
    upload(s3, folder, {"trips-1.csv": csv_bytes(trips_table(12))})  # changed meanwhile
    batches = len(import_ctx.repo.list())

    refused = approve_held(import_ctx, held.batch_id, admission=layout_admission())
    assert isinstance(refused, NotApproved), refused
    assert "content changed" in refused.reason and "files" in refused.reason
    assert len(import_ctx.repo.list()) == batches  # no batch made
    assert slice_snapshot(database_url, folder) == before
    assert [b.id for b in reviews.held_batches()] == [held.batch_id]  # still waits


def test_an_approval_waives_nothing_for_content_that_changed_after_its_check(
    import_ctx: ImportContext, s3, landing_bucket: str, database_url: str, reviews
) -> None:
    """The folder changes between the approval's check and its load: the waiver names the
    reviewed content, so the guard check refuses the new one and nothing is committed."""
    folder = today_folder(landing_bucket, "acme")
    held = held_redelivery(import_ctx, s3, folder)
    before = slice_snapshot(database_url, folder)
    approval = check_approval(import_ctx, held.batch_id, admission=layout_admission())
    assert isinstance(approval, Approval), approval
    upload(s3, folder, {"trips-1.csv": csv_bytes(trips_table(12))})  # nobody reviewed these

    claimed = claim_approval(import_ctx, approval, new_owner())
    assert isinstance(claimed, Claimed), claimed
    steps = CoreSteps(import_ctx.normalize_workers)
    outcome = import_batch(import_ctx, approval.tenant, claimed, steps)
    assert isinstance(outcome, Failed), outcome
    assert "approval of held batch" in outcome.error
    assert "was given for other content" in outcome.error and "nothing was loaded" in outcome.error
    assert slice_snapshot(database_url, folder) == before
    assert import_ctx.repo.list(status="running") == []
    assert [b.id for b in reviews.held_batches()] == [held.batch_id]  # still waits


@pytest.mark.parametrize("warehouse", WAREHOUSE_BACKENDS, indirect=True)
def test_rejection_closes_a_held_batch(
    import_ctx: ImportContext, s3, landing_bucket: str, database_url: str, reviews
) -> None:
    folder = today_folder(landing_bucket, "acme")
    held = held_redelivery(import_ctx, s3, folder)
    before = slice_snapshot(database_url, folder)
    closed = reject_held(import_ctx, reviews, held.batch_id, "tenant resends tomorrow")
    assert not isinstance(closed, NotApproved), closed
    assert closed.status == BatchStatus.FAILED
    assert closed.details["review"]["decision"] == "rejected"
    assert closed.details["review"]["note"] == "tenant resends tomorrow"
    assert reviews.held_batches() == []
    refused = approve_held(import_ctx, held.batch_id, admission=layout_admission())
    assert isinstance(refused, NotApproved) and "already rejected" in refused.reason
    assert slice_snapshot(database_url, folder) == before
    # Only a held batch is reviewed.
    first = import_ctx.repo.list(status="succeeded")[0]
    assert isinstance(reject_held(import_ctx, reviews, first.id), NotApproved)


def test_an_approval_of_content_a_later_success_loaded_is_refused_as_overtaken(
    tmp_path,
) -> None:
    """The held content loaded another way since (a run with the guard lowered): approving
    it would load the same rows a second time. Refused, naming that batch; nothing loaded.
    On the fakes, no server."""
    world = memory_world(tmp_path)
    folder = world.deliver(files=fleet_delivery(trips=400))
    assert isinstance(import_folder(world.ctx, ACME, folder, "d1"), Committed)
    redeliver(world.s3, folder, {"trips-1.csv": csv_bytes(trips_table(10))})
    held = import_folder(world.ctx, ACME, folder, "d2")
    assert isinstance(held, Failed) and held.kind == FailureKind.HELD, held
    lowered = GuardOverride(min_rows_ratio=0.01, reason="lowered for one run")
    loader = import_folder(world.ctx, ACME, folder, "d3", guard=lowered)
    assert isinstance(loader, Committed), loader

    refused = approve_held(world.ctx, held.batch_id, admission=layout_admission())

    assert refused == NotApproved(
        held.batch_id,
        f"batch {held.batch_id} was overtaken: batch {loader.batch_id} loaded this content "
        "since; nothing to approve",
    )
    assert world.warehouse.slice_owner("acme", loader.scope) == loader.batch_id
    assert len(world.repo.list(status="succeeded")) == 2
