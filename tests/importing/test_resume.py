"""Publication and resume through the core: failures are resumable without reloading."""

from __future__ import annotations

import time

import psycopg

from fleet_import.importing.context import Committed, Failed, ImportContext
from fleet_import.importing.driver import import_folder
from fleet_import.importing.resume import resume_batch
from fleet_import.publication.publisher import Publisher
from fleet_import.retry import Backoff
from fleet_import.sample_data import csv_bytes, fleet_delivery, today_folder, trips_table
from fleet_import.scope import Tenant, split_folder
from fleet_import.store.details import FailureKind
from fleet_import.store.models import (
    BatchStatus,
    NotResumable,
)
from fleet_import.store.outbox import OutboxRepository, StepStatus
from fleet_import.warehouse.postgres.warehouse import PostgresWarehouse
from tests.helpers import slice_rows, upload
from tests.s3fixtures import put_objects

ACME = Tenant.named("acme")


def counting_warehouse(ctx: ImportContext, database_url: str) -> PostgresWarehouse:
    """A fresh warehouse (COPY counter at zero) for both the pipeline and the publisher."""
    warehouse = PostgresWarehouse(database_url)
    ctx.warehouse = warehouse
    patched_steps = ctx.publisher.steps
    ctx.publisher = Publisher(
        ctx.repo,
        OutboxRepository(database_url),
        warehouse,
        events=ctx.events,
        staging=ctx.staging,
        backoff=Backoff((0.0,)),
    )
    ctx.publisher.steps.update(patched_steps)  # keep a test's failing step in place
    return warehouse


def failing_notify(ctx: ImportContext, failures: int) -> list[str]:
    calls: list[str] = []
    original = ctx.publisher.steps["notify"]

    def notify(step_ctx) -> None:
        calls.append(str(step_ctx.batch.id))
        if len(calls) <= failures:
            raise RuntimeError("notification service is down")
        original(step_ctx)

    ctx.publisher.steps["notify"] = notify
    return calls


def test_import_publishes_and_supersedes_the_previous_batch(
    publishing_ctx: ImportContext, s3, landing_bucket: str
) -> None:
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=40))
    first = import_folder(publishing_ctx, ACME, folder, "d1")
    assert isinstance(first, Committed) and first.published
    second = import_folder(publishing_ctx, ACME, folder, "d2", force=True)  # same content
    assert isinstance(second, Committed) and second.published
    assert publishing_ctx.repo.get(second.batch_id).status == BatchStatus.SUCCEEDED
    assert publishing_ctx.repo.get(first.batch_id).details["superseded_by"] == str(second.batch_id)
    names = [name for name, _ in publishing_ctx.recorded_events]
    assert names.count("fleet.slice.published") == 2
    assert names.count("fleet.batch.published") == 2


def test_a_replaced_file_leaves_no_normalized_file_behind(
    publishing_ctx: ImportContext, s3, landing_bucket: str, staging_bucket: str, database_url: str
) -> None:
    """The staging area holds what the slice was loaded from, nothing of the content a later
    delivery replaced."""
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=40))
    assert import_folder(publishing_ctx, ACME, folder, "d1").published
    bucket, prefix = split_folder(folder)
    put_objects(s3, bucket, {prefix + "trips-1.csv": csv_bytes(trips_table(30, start=500))})
    second = import_folder(publishing_ctx, ACME, folder, "d2")
    assert isinstance(second, Committed) and second.published, second

    with psycopg.connect(database_url) as conn:
        cached = conn.execute("SELECT output_uri, details FROM normalized_files").fetchall()
    expected = {uri for uri, _ in cached} | {
        details["rejects_uri"] for _, details in cached if details.get("rejects_uri")
    }
    assert len(cached) == len(second.summary["files"])
    staged = s3.list_objects_v2(Bucket=staging_bucket, Prefix="stage/acme/normalized/")
    assert {f"s3://{staging_bucket}/{o['Key']}" for o in staged.get("Contents", [])} == expected


def test_publication_failure_is_resumed_without_copying_a_row(
    publishing_ctx: ImportContext, s3, landing_bucket: str, database_url: str
) -> None:
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=60))
    calls = failing_notify(publishing_ctx, failures=1)
    failed = import_folder(publishing_ctx, ACME, folder, "d1")
    assert isinstance(failed, Failed) and failed.kind == FailureKind.FAILED_PUBLICATION
    assert "notification service is down" in failed.error
    batch = publishing_ctx.repo.get(failed.batch_id)
    assert batch.status == BatchStatus.FAILED and batch.details["warehouse_committed"]
    assert slice_rows(database_url, "fleet_trips", "acme", folder) == [(failed.batch_id, 60)]

    warehouse = counting_warehouse(publishing_ctx, database_url)
    resumed = resume_batch(publishing_ctx, OutboxRepository(database_url), failed.batch_id)
    assert isinstance(resumed, Committed) and resumed.published, resumed
    assert warehouse.copies == 0
    assert len(calls) == 2
    assert publishing_ctx.repo.get(failed.batch_id).status == BatchStatus.SUCCEEDED
    assert slice_rows(database_url, "fleet_trips", "acme", folder) == [(failed.batch_id, 60)]


def test_a_ui_retry_supersedes_the_failed_publication_it_replaces(
    publishing_ctx: ImportContext, s3, landing_bucket: str, database_url: str
) -> None:
    """Retry in the UI keeps the delivery key: after a failed publication it makes a new
    batch, whose success retires the failed one for good."""
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=30))
    failing_notify(publishing_ctx, failures=1)
    failed = import_folder(publishing_ctx, ACME, folder, "run-1")
    assert isinstance(failed, Failed) and failed.kind == FailureKind.FAILED_PUBLICATION
    failure = publishing_ctx.repo.get(failed.batch_id).details["failure"]
    retried = import_folder(publishing_ctx, ACME, folder, "run-1")
    assert isinstance(retried, Committed) and retried.published
    assert retried.batch_id != failed.batch_id

    old = publishing_ctx.repo.get(failed.batch_id)
    assert old.status == BatchStatus.FAILED
    assert old.details["superseded_by"] == str(retried.batch_id)
    assert old.details["failure"] == failure
    outbox = OutboxRepository(database_url)
    open_steps = [s.step for s in outbox.steps(failed.batch_id) if s.status != StepStatus.DONE]
    assert open_steps and all(
        s.status == StepStatus.RETIRED
        for s in outbox.steps(failed.batch_id)
        if s.step in open_steps
    )
    outcome = resume_batch(publishing_ctx, outbox, failed.batch_id)
    assert isinstance(outcome, NotResumable) and "superseded" in outcome.reason
    assert publishing_ctx.repo.get(failed.batch_id) == old  # not a field of the row changed
    assert slice_rows(database_url, "fleet_trips", "acme", folder) == [(retried.batch_id, 30)]


def test_a_refused_resume_leaves_the_failed_batch_as_it_was(
    publishing_ctx: ImportContext, s3, landing_bucket: str, database_url: str
) -> None:
    """A newer batch owns the slice but has not retired the older one yet (its publication
    failed too): the stamp refuses the resume before the older row changes."""
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=30))
    failing_notify(publishing_ctx, failures=2)
    older = import_folder(publishing_ctx, ACME, folder, "d1")
    newer = import_folder(publishing_ctx, ACME, folder, "d2")
    assert isinstance(older, Failed) and isinstance(newer, Failed)
    before = publishing_ctx.repo.get(older.batch_id)
    assert "notification service is down" in before.details["failure"]["error"]

    outbox = OutboxRepository(database_url)
    for _ in range(2):
        outcome = resume_batch(publishing_ctx, outbox, older.batch_id)
        assert isinstance(outcome, NotResumable), outcome
        assert "expired" in outcome.reason and str(newer.batch_id) in outcome.reason
        assert publishing_ctx.repo.get(older.batch_id) == before
    assert "resumes" not in before.details and not before.details["publication_expired"]

    # The newer one resumes, publishes, and then supersedes the older one.
    resumed = resume_batch(publishing_ctx, outbox, newer.batch_id)
    assert isinstance(resumed, Committed) and resumed.published, resumed
    after = publishing_ctx.repo.get(older.batch_id)
    assert after.details["superseded_by"] == str(newer.batch_id)
    assert after.details["failure"] == before.details["failure"]
    assert after.status == BatchStatus.FAILED


def test_resume_finishes_a_batch_that_died_after_the_warehouse_commit(
    publishing_ctx: ImportContext,
    s3,
    landing_bucket: str,
    database_url: str,
    moto_endpoint: str,
    staging_bucket: str,
    tmp_path,
) -> None:
    from tests.helpers import CHILD_TTL
    from tests.import_child import KILLED, run_import_child

    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=25))
    child = run_import_child(
        database_url,
        moto_endpoint,
        staging_bucket,
        folder,
        "d1",
        workdir=tmp_path / "child",
        ttl=CHILD_TTL,
        env={"FLEET_FAILPOINTS": "after_warehouse_commit"},
    )
    assert child.returncode == KILLED, child.stderr
    (batch,) = publishing_ctx.repo.list()
    time.sleep(CHILD_TTL + 0.2)
    warehouse = counting_warehouse(publishing_ctx, database_url)
    outcome = resume_batch(publishing_ctx, OutboxRepository(database_url), batch.id)
    assert isinstance(outcome, Committed) and outcome.recovered and outcome.published
    assert warehouse.copies == 0
    assert publishing_ctx.repo.get(batch.id).status == BatchStatus.SUCCEEDED
