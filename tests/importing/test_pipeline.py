"""import_folder end to end: moto's S3 server, a real PostgreSQL for both databases."""

from __future__ import annotations

import datetime as dt
import uuid

import psycopg
import pytest

from fleet_import.importing.context import (
    Committed,
    Failed,
    ImportContext,
    NotClaimed,
    NothingToDo,
    Skipped,
)
from fleet_import.importing.driver import import_folder
from fleet_import.retry import Backoff
from fleet_import.sample_data import csv_bytes, fleet_delivery, today_folder, trips_table
from fleet_import.scope import Tenant, source_scope, split_folder
from fleet_import.store.details import FailureKind
from fleet_import.store.models import BatchStatus
from tests.helpers import curated, slice_rows, upload
from tests.s3fixtures import put_objects

ACME = Tenant.named("acme")
GLOBEX = Tenant.named("globex")


def test_folder_with_three_datasets_loads(
    import_ctx: ImportContext, s3, landing_bucket: str, database_url: str
) -> None:
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=300, fuel=120, vehicles=25))
    copies = import_ctx.warehouse.copies
    outcome = import_folder(import_ctx, ACME, folder, "delivery-1")
    assert isinstance(outcome, Committed), outcome
    assert outcome.row_counts == {"vehicles": 25, "trips": 300, "fuel_transactions": 120}
    assert import_ctx.warehouse.copies - copies == 3  # one per dataset, two trips files
    batch = import_ctx.repo.get(outcome.batch_id)
    assert batch.status == BatchStatus.SUCCEEDED
    assert batch.details["warehouse_committed"] is True
    assert batch.details["manifest"]["folder"] == folder
    for table, count in (
        ("fleet_vehicles", 25),
        ("fleet_trips", 300),
        ("fleet_fuel_transactions", 120),
    ):
        assert slice_rows(database_url, table, "acme", folder) == [(outcome.batch_id, count)]
    assert import_ctx.warehouse.slice_owner("acme", source_scope(folder)) == outcome.batch_id
    # Types arrive typed: timestamps with zone, doubles, NULL drivers.
    row = curated(
        database_url,
        "SELECT started_at, distance_km, driver_id FROM curated.fleet_trips WHERE trip_id = 'T0'",
    )[0]
    assert isinstance(row[0], dt.datetime) and row[0].utcoffset() is not None
    assert isinstance(row[1], float) and row[2] is None
    names = [name for name, _ in import_ctx.recorded_events]
    assert names == ["fleet.batch.reserved", "fleet.batch.committed"]


def test_reload_replaces_only_its_own_slice_and_reuses_the_cache(
    import_ctx: ImportContext, s3, landing_bucket: str, database_url: str
) -> None:
    folder = today_folder(landing_bucket, "acme")
    other_day = today_folder(landing_bucket, "acme", dt.date(2026, 7, 23))
    globex_folder = today_folder(landing_bucket, "globex")
    for target in (folder, other_day, globex_folder):
        upload(s3, target, fleet_delivery(trips=100, fuel=10, vehicles=5))
    first = import_folder(import_ctx, ACME, folder, "d1")
    day2 = import_folder(import_ctx, ACME, other_day, "d1")
    globex = import_folder(import_ctx, GLOBEX, globex_folder, "d1")
    assert first.summary["cache_hits"] == 0

    again = import_folder(import_ctx, ACME, folder, "d2", force=True)  # same content
    assert isinstance(again, Committed) and again.batch_id != first.batch_id
    assert again.summary["cache_hits"] == len(again.summary["files"]) == 4
    assert slice_rows(database_url, "fleet_trips", "acme", folder) == [(again.batch_id, 100)]
    assert slice_rows(database_url, "fleet_trips", "acme", other_day) == [(day2.batch_id, 100)]
    assert slice_rows(database_url, "fleet_trips", "globex", globex_folder) == [
        (globex.batch_id, 100)
    ]

    # A changed file is parsed again; unchanged ones still come from the cache.
    bucket, prefix = split_folder(folder)
    changed = csv_bytes(trips_table(60, start=1000, vehicles=5))
    put_objects(s3, bucket, {prefix + "trips-1.csv": changed})
    third = import_folder(import_ctx, ACME, folder, "d3")
    assert isinstance(third, Committed), third
    assert third.row_counts["trips"] == 110
    hits = {f["key"].rsplit("/", 1)[1]: f["cache_hit"] for f in third.summary["files"]}
    assert hits == {
        "vehicles.csv": True,
        "trips-1.csv": False,
        "trips-2.csv.gz": True,
        "fuel_transactions.parquet": True,
    }


def test_bad_rows_become_rejects_with_file_line_and_column(
    import_ctx: ImportContext, s3, landing_bucket: str
) -> None:
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=400, bad_rows=True))
    outcome = import_folder(import_ctx, ACME, folder, "d1")
    assert isinstance(outcome, Committed), outcome
    assert outcome.row_counts["trips"] == 400
    rejects = import_ctx.repo.get(outcome.batch_id).details["rejects"]
    assert rejects["count"] == 3
    sample = {(r["line"], r["column"]) for r in rejects["sample"]}
    # trips-1.csv holds a header and 200 good rows; the bad ones follow.
    assert sample == {(202, "started_at"), (203, "distance_km"), (204, "status")}
    assert all(r["file"].endswith("/trips-1.csv") for r in rejects["sample"])
    assert rejects["uri"].startswith("s3://")


def test_duplicate_keys_across_files_are_rejected_not_deduplicated(
    import_ctx: ImportContext, s3, landing_bucket: str
) -> None:
    folder = today_folder(landing_bucket, "acme")
    files = fleet_delivery(trips=400)
    header, first_row = files["trips-1.csv"].split(b"\n")[:2]
    files["trips-3.csv"] = header + b"\n" + first_row + b"\n"
    upload(s3, folder, files)
    outcome = import_folder(import_ctx, ACME, folder, "d1")
    assert isinstance(outcome, Committed), outcome
    assert outcome.row_counts["trips"] == 399  # both copies of T0 are out
    rejects = import_ctx.repo.get(outcome.batch_id).details["rejects"]
    assert rejects["count"] == 2
    assert all("duplicate" in r["reason"] for r in rejects["sample"])


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        ("empty", "empty"),
        ("no_vehicles", "vehicles"),
        ("bad_header", "missing"),
        ("zero_bytes", "trips-1.csv"),
        ("too_many_rejects", "reject"),
        ("not_parquet", "fuel_transactions.parquet"),
    ],
)
def test_bad_deliveries_fail_before_commit_and_keep_the_old_slice(
    import_ctx: ImportContext,
    s3,
    landing_bucket: str,
    database_url: str,
    breakage: str,
    message: str,
) -> None:
    folder = today_folder(landing_bucket, "acme")
    good = None
    if breakage != "empty":
        upload(s3, folder, fleet_delivery(trips=100))
        good = import_folder(import_ctx, ACME, folder, "d0-loaded")
        assert isinstance(good, Committed)
    files = fleet_delivery(trips=100)
    bucket, prefix = split_folder(folder)
    if breakage == "empty":
        files = {}
    elif breakage == "no_vehicles":
        s3.delete_object(Bucket=bucket, Key=prefix + "vehicles.csv")
        files.pop("vehicles.csv")
    elif breakage == "bad_header":
        files["trips-1.csv"] = files["trips-1.csv"].replace(
            b'"distance_km"', b'"distance_miles"', 1
        )
    elif breakage == "zero_bytes":
        files["trips-1.csv"] = b""
    elif breakage == "too_many_rejects":
        files["trips-1.csv"] = files["trips-1.csv"].replace(b"completed", b"exploded")
    elif breakage == "not_parquet":
        files["fuel_transactions.parquet"] = b"this is not parquet at all"
    upload(s3, folder, files)
    outcome = import_folder(import_ctx, ACME, folder, "d1")
    assert isinstance(outcome, Failed), outcome
    assert outcome.kind == FailureKind.FAILED_PRE_COMMIT
    assert message in outcome.error
    batch = import_ctx.repo.get(outcome.batch_id)
    assert batch.status == BatchStatus.FAILED
    assert batch.details["failure"]["kind"] == "failed_pre_commit"
    assert message in batch.details["failure"]["error"]
    if good is not None:
        assert slice_rows(database_url, "fleet_trips", "acme", folder) == [(good.batch_id, 100)]
    # The scope is free again.
    assert import_ctx.repo.list(status="running") == []


def test_busy_scope_is_skipped_and_a_held_lease_is_not_claimed(
    import_ctx: ImportContext, s3, landing_bucket: str
) -> None:
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=10))
    holder = import_ctx.repo.reserve(ACME, source_scope(folder), "d1").batch
    import_ctx.repo.acquire_lease(holder.id, "someone-else", 60)
    assert import_folder(import_ctx, ACME, folder, "d2") == Skipped(source_scope(folder), holder.id)
    outcome = import_folder(import_ctx, ACME, folder, "d1")
    assert isinstance(outcome, NotClaimed) and outcome.holder == "someone-else"
    assert import_ctx.repo.get(holder.id).details["phase"] == "reserved"


def test_invalid_input_writes_nothing(import_ctx: ImportContext) -> None:
    from fleet_import.errors import InvalidInput

    with pytest.raises(InvalidInput):
        import_folder(import_ctx, ACME, "s3://fleet-landing/acme/../globex/", "d1")
    assert import_ctx.repo.list() == []


def test_a_dropped_warehouse_connection_is_retried_without_losing_a_file(
    import_ctx: ImportContext, s3, landing_bucket: str, database_url: str, monkeypatch
) -> None:
    """The server really kills the slice's backend after its first file: the load starts
    again, replays the file already normalized, and the slice comes out whole."""
    from fleet_import.importing import load as loading
    from fleet_import.warehouse.postgres.warehouse import PostgresWarehouse

    monkeypatch.setattr(loading, "LOAD_BACKOFF", Backoff((0.0, 0.0, 0.0)))
    opened: list[int] = []

    class DroppingWarehouse(PostgresWarehouse):
        def open_slice(self, **kwargs):
            writer = super().open_slice(**kwargs)
            opened.append(1)
            if len(opened) == 1:
                load_files = writer.load_files

                def load_then_drop(contract, files):
                    rows = load_files(contract, files)
                    with psycopg.connect(database_url, autocommit=True) as admin:
                        pid = writer._conn.info.backend_pid
                        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
                    return rows

                writer.load_files = load_then_drop
            return writer

    import_ctx.warehouse = DroppingWarehouse(database_url)
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=300, fuel=40, vehicles=10))
    outcome = import_folder(import_ctx, ACME, folder, "d1")
    assert isinstance(outcome, Committed), outcome
    assert len(opened) == 2
    assert outcome.row_counts == {"vehicles": 10, "trips": 300, "fuel_transactions": 40}
    assert slice_rows(database_url, "fleet_trips", "acme", folder) == [(outcome.batch_id, 300)]


def test_a_file_failing_while_the_copy_fails_fails_the_batch(
    import_ctx: ImportContext, s3, landing_bucket: str, database_url: str, monkeypatch
) -> None:
    """The COPY's reader thread is waiting for trips-2 when the server kills the slice's
    backend (transient: the slice would be loaded again), and trips-2 then fails to
    normalize. The reader's error is dropped for the COPY's, but the batch must still fail
    with it, never commit a slice without trips-2 and the files after it."""
    import threading
    import time

    from fleet_import.errors import PreCommitError
    from fleet_import.importing import load as loading
    from fleet_import.importing import normalized_files as normalizing
    from fleet_import.warehouse.postgres import writer as postgres

    monkeypatch.setattr(loading, "LOAD_BACKOFF", Backoff((0.0, 0.0, 0.0)))
    monkeypatch.setattr(import_ctx, "normalize_workers", 1)
    trips_2_started = threading.Event()
    normalize_object = normalizing.normalize_object

    def failing_trips_2(ctx, batch_id, tenant_id, bucket, obj, contract, workdir):
        if obj.name.startswith("trips-2"):
            trips_2_started.set()
            time.sleep(1.0)  # long enough for the COPY to fail first
            raise PreCommitError(f"{obj.name}: cannot be normalized")
        return normalize_object(ctx, batch_id, tenant_id, bucket, obj, contract, workdir)

    monkeypatch.setattr(normalizing, "normalize_object", failing_trips_2)
    stream_parquet = postgres.stream_parquet
    killed: list[int] = []

    def killing_stream(sources, encoder, write, **options):
        def killing_write(data):
            if encoder.schema.names[0] == "trip_id" and not killed and len(data) > 1_000:
                assert trips_2_started.wait(10)
                time.sleep(0.2)  # the reader is inside next(), waiting for trips-2
                with psycopg.connect(database_url, autocommit=True) as admin:
                    for (pid,) in admin.execute("SELECT pid FROM pg_stat_progress_copy"):
                        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
                        killed.append(pid)
                for _ in range(1_000):  # the dead connection shows on a later write
                    write(data)
            return write(data)

        return stream_parquet(sources, encoder, killing_write, **options)

    monkeypatch.setattr(postgres, "stream_parquet", killing_stream)
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=300, fuel=40, vehicles=10))
    outcome = import_folder(import_ctx, ACME, folder, "d1")
    assert killed
    assert isinstance(outcome, Failed), outcome
    assert "trips-2" in outcome.error
    assert slice_rows(database_url, "fleet_trips", "acme", folder) == []


def test_a_reject_ratio_failure_names_file_lines_and_rejects_and_keeps_them(
    import_ctx: ImportContext, s3, landing_bucket: str, database_url: str
) -> None:
    """Rejects are recorded before the ratio is judged: the failed batch lists them (details,
    `batches show`), and its error names the file, its first rejected lines and the file of
    all rejects."""
    from typer.testing import CliRunner

    from fleet_cli.cli import app

    folder = today_folder(landing_bucket, "acme")
    files = fleet_delivery(trips=100)
    files["trips-1.csv"] = files["trips-1.csv"].replace(b"completed", b"exploded")
    upload(s3, folder, files)
    outcome = import_folder(import_ctx, ACME, folder, "d1")
    assert isinstance(outcome, Failed) and outcome.kind == FailureKind.FAILED_PRE_COMMIT
    batch = import_ctx.repo.get(outcome.batch_id)
    rejects = batch.details["rejects"]
    trips_1 = f"{folder}trips-1.csv"
    assert rejects["count"] == rejects["by_file"][trips_1] > 0
    assert rejects["uri"].endswith(f"/{batch.id}/rejects.csv")
    first_lines = [str(r["line"]) for r in rejects["sample"][:3]]
    error = batch.details["failure"]["error"]
    assert error.startswith("dataset 'trips': ") and "rejected" in error
    assert f"in {trips_1} (first lines {', '.join(first_lines)}" in error, error
    assert rejects["uri"] in error
    shown = CliRunner().invoke(
        app,
        ["batches", "show", str(batch.id), "--database-url", database_url],
        env={"COLUMNS": "300"},
    )
    assert shown.exit_code == 0, shown.output
    assert f"first rejects of {rejects['count']}" in shown.output
    assert "exploded" in shown.output


def test_a_delivery_of_the_content_the_slice_holds_is_already_loaded(
    import_ctx: ImportContext, s3, landing_bucket: str, database_url: str
) -> None:
    """Same files, same contract versions as the batch that owns the slice: no batch, no
    warehouse work, the owner named; forced, or with other content, it loads."""
    from fleet_import.importing.context import AlreadyLoaded

    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=60))
    first = import_folder(import_ctx, ACME, folder, "d1")
    assert isinstance(first, Committed) and first.published
    copies = import_ctx.warehouse.copies
    again = import_folder(import_ctx, ACME, folder, "d2")
    assert again == AlreadyLoaded(source_scope(folder), first.batch_id)
    assert import_ctx.warehouse.copies == copies
    assert [b.delivery_key for b in import_ctx.repo.list()] == ["d1"]
    assert ("fleet.delivery.already_loaded", first.batch_id) in [
        (name, uuid.UUID(payload["batch_id"])) for name, payload in import_ctx.recorded_events
    ]
    # The delivery's own key keeps its meaning: its batch finished, nothing to do.
    assert isinstance(import_folder(import_ctx, ACME, folder, "d1"), NothingToDo)

    forced = import_folder(import_ctx, ACME, folder, "d3", force=True)
    assert isinstance(forced, Committed) and forced.batch_id != first.batch_id
    upload(s3, folder, {"trips-3.csv": csv_bytes(trips_table(5, start=1000))})
    changed = import_folder(import_ctx, ACME, folder, "d4")
    assert isinstance(changed, Committed) and changed.row_counts["trips"] == 65
