"""Slice guards, approval and rollback on Redshift through the emulator (issue #24): the
guard reads the registry's row_count, the held slice is untouched, the approval loads
from the cache, the rollback restores the earlier slice."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from fleet_import.contracts.fleet import FLEET_DATASETS
from fleet_import.importing.context import Committed, Failed, ImportContext
from fleet_import.importing.driver import import_folder
from fleet_import.importing.review import approve_held
from fleet_import.importing.rollback import rollback_slice
from fleet_import.publication.publisher import Publisher
from fleet_import.publication.retention import Retention
from fleet_import.s3.staging import StagingArea
from fleet_import.sample_data import csv_bytes, fleet_delivery, today_folder, trips_table
from fleet_import.scope import Tenant, source_scope
from fleet_import.store.models import FailureKind
from fleet_import.store.outbox import OutboxRepository
from fleet_import.store.review_repository import ReviewRepository
from fleet_import.warehouse.redshift.warehouse import RedshiftWarehouse
from tests.helpers import layout_admission, upload
from tests.importing.guard_helpers import redeliver
from tests.redshift_emulator import RedshiftEmulator

ACME = Tenant.named("acme")
ROLE = "arn:aws:iam::123456789012:role/fleet-redshift-copy"


@pytest.fixture
def redshift_ctx(database_url: str, repo, s3: Any, staging_bucket: str, tmp_path) -> Iterator:
    with RedshiftEmulator(database_url, s3) as emulator:
        warehouse = RedshiftWarehouse(
            emulator.connect_kwargs(password="pw"),
            s3=s3,
            staging_uri=f"s3://{staging_bucket}/redshift/",
            iam_role=ROLE,
            retry_delays=(0.0, 0.0, 0.0),
        )
        warehouse.ensure_tables(FLEET_DATASETS.values())
        staging = StagingArea(f"s3://{staging_bucket}/stage/", s3)
        publisher = Publisher(
            repo,
            OutboxRepository(database_url),
            warehouse,
            events=lambda name, payload: None,
            staging=staging,
            backoff=lambda attempts: 0.0,
            retention=Retention(ReviewRepository(database_url)),
        )
        yield ImportContext(
            repo=repo,
            warehouse=warehouse,
            s3=s3,
            staging=staging,
            lease_ttl=30,
            workdir=tmp_path / "work",
            publisher=publisher,
        )


@pytest.mark.slow
def test_held_approved_then_rolled_back_on_redshift(
    redshift_ctx: ImportContext, database_url: str, s3, landing_bucket: str
) -> None:
    ctx, reviews = redshift_ctx, ReviewRepository(database_url)
    folder = today_folder(landing_bucket, "acme")
    scope = source_scope(folder)
    upload(s3, folder, fleet_delivery(trips=400))
    good = import_folder(ctx, ACME, folder, "d1")
    assert isinstance(good, Committed) and good.published, good
    assert ctx.warehouse.registered_counts("acme", scope)["trips"] == 400

    redeliver(s3, folder, {"trips-1.csv": csv_bytes(trips_table(10))})
    held = import_folder(ctx, ACME, folder, "d2")
    assert isinstance(held, Failed) and held.kind == FailureKind.HELD, held
    assert ctx.warehouse.slice_owner("acme", scope) == good.batch_id
    assert ctx.warehouse.slice_counts("acme", scope)["trips"] == 400

    approved = approve_held(ctx, reviews, held.batch_id, admission=layout_admission())
    assert isinstance(approved, Committed) and approved.published, approved
    assert approved.summary["cache_hits"] == len(approved.summary["files"])
    assert ctx.warehouse.slice_counts("acme", scope)["trips"] == 10

    restored = rollback_slice(ctx, reviews, "acme", folder, admission=layout_admission())
    assert isinstance(restored, Committed) and restored.published, restored
    assert ctx.warehouse.slice_owner("acme", scope) == restored.batch_id
    assert ctx.warehouse.slice_counts("acme", scope) == good.row_counts
    assert ctx.repo.get(restored.batch_id).details["rolled_back_to"] == str(good.batch_id)
