"""Drift policies (issue #25, part 1) through import_folder: a trips export that gained a
column (`co2_grams`) under each `on_new_columns` policy, and a column a file may lack
(`optional`). Real PostgreSQL warehouse, moto's S3 server."""

from __future__ import annotations

import dataclasses
import datetime as dt
import gzip

import psycopg
import pytest

from fleet_import.checks.services import _curated_tables
from fleet_import.contracts.fleet import FLEET_DATASETS, TRIPS
from fleet_import.contracts.model import ContractSet
from fleet_import.importing.context import AlreadyLoaded, Committed, Failed, ImportContext
from fleet_import.importing.drift import effective_contracts
from fleet_import.importing.driver import import_folder
from fleet_import.importing.review import approve_held
from fleet_import.sample_data import csv_bytes, fleet_delivery, today_folder, trips_table
from fleet_import.scope import Tenant
from fleet_import.store.details import FailureKind
from fleet_import.store.review_repository import ReviewRepository
from fleet_import.warehouse.migration import migration_for, plan_tables
from tests.helpers import curated, layout_admission, upload

ACME = Tenant.named("acme")
TRIPS_ROWS = 20  # 10 in trips-1.csv (which gained co2_grams), 10 in trips-2.csv.gz


def trips_under(ctx: ImportContext, **update) -> ImportContext:
    trips = TRIPS.model_copy(update=update)
    others = [c for c in FLEET_DATASETS.values() if c.name != "trips"]
    return dataclasses.replace(ctx, contracts=ContractSet([*others, trips]))


def with_co2(table_csv: bytes) -> bytes:
    """The CSV with a co2_grams column at the end: 100, 101, ... for its rows."""
    header, *rows = table_csv.decode().strip().split("\n")
    lines = [f"{header},co2_grams"] + [f"{row},{100 + n}" for n, row in enumerate(rows)]
    return ("\n".join(lines) + "\n").encode()


def drifted_delivery() -> dict[str, bytes]:
    files = fleet_delivery(trips=TRIPS_ROWS)
    files["trips-1.csv"] = with_co2(files["trips-1.csv"])
    return files


def trips_columns(database_url: str) -> dict[str, str]:
    rows = curated(
        database_url,
        "SELECT column_name, data_type FROM information_schema.columns"
        " WHERE table_schema = 'curated' AND table_name = 'fleet_trips'",
    )
    return dict(rows)


def co2_values(database_url: str) -> list:
    return [
        row[0]
        for row in curated(
            database_url, "SELECT co2_grams FROM curated.fleet_trips ORDER BY trip_id"
        )
    ]


def drift_events(ctx: ImportContext) -> list[dict]:
    return [p for name, p in ctx.recorded_events if name == "fleet.schema.drift"]  # type: ignore[attr-defined]


def test_reject_refuses_the_file_naming_the_new_column(
    import_ctx: ImportContext, s3, landing_bucket: str
) -> None:
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, drifted_delivery())
    outcome = import_folder(trips_under(import_ctx), ACME, folder, "d1")
    assert isinstance(outcome, Failed) and outcome.kind == FailureKind.FAILED_PRE_COMMIT, outcome
    assert "trips-1.csv" in outcome.error and "unexpected columns: co2_grams" in outcome.error
    assert drift_events(import_ctx) == []


def test_ignore_loads_the_contract_columns_and_reports_the_new_one_once(
    import_ctx: ImportContext, s3, landing_bucket: str, database_url: str
) -> None:
    ctx = trips_under(import_ctx, on_new_columns="ignore")
    folder = today_folder(landing_bucket, "acme")
    files = drifted_delivery()
    trips_2 = with_co2(csv_bytes(trips_table(10, start=10, vehicles=20)))
    files["trips-2.csv.gz"] = gzip.compress(trips_2)
    upload(s3, folder, files)  # both trips files hold co2_grams: still one report
    outcome = import_folder(ctx, ACME, folder, "d1")
    assert isinstance(outcome, Committed), outcome
    assert outcome.row_counts["trips"] == TRIPS_ROWS
    assert "co2_grams" not in trips_columns(database_url)
    drift = ctx.repo.get(outcome.batch_id).details["drift"]
    assert drift["trips"]["policy"] == "ignore"
    assert drift["trips"]["columns"] == {"co2_grams": "string"}
    assert sorted(f.rsplit("/", 1)[1] for f in drift["trips"]["files"]) == [
        "trips-1.csv",
        "trips-2.csv.gz",
    ]
    (event,) = drift_events(import_ctx)
    assert event["batch_id"] == str(outcome.batch_id)
    assert event["datasets"]["trips"]["columns"] == {"co2_grams": "string"}
    files_summary = outcome.summary["files"]
    assert [f.get("extra_columns") for f in files_summary if f["dataset"] == "trips"] == [
        {"co2_grams": "string"},
        {"co2_grams": "string"},
    ]


def test_evolve_adds_the_column_and_loads_its_values(
    import_ctx: ImportContext, s3, landing_bucket: str, database_url: str
) -> None:
    ctx = trips_under(import_ctx, on_new_columns="evolve", new_column_type="int64")
    declared = ctx.contracts["trips"].contract_version
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, drifted_delivery())
    outcome = import_folder(ctx, ACME, folder, "d1")
    assert isinstance(outcome, Committed), outcome
    assert outcome.row_counts["trips"] == TRIPS_ROWS
    assert trips_columns(database_url)["co2_grams"] == "bigint"
    # trips-1.csv's rows carry their values; trips-2.csv.gz lacks the column: NULL.
    values = co2_values(database_url)
    assert sorted(v for v in values if v is not None) == list(range(100, 110))
    assert values.count(None) == 10
    details = ctx.repo.get(outcome.batch_id).details
    assert details["drift"]["trips"]["policy"] == "evolve"
    assert details["drift"]["trips"]["columns"] == {"co2_grams": "int64"}
    evolved = details["contract_versions"]["trips"]
    assert evolved != declared  # a new effective contract version
    # The doctor takes the evolved table as the declared contract's: its extra column is
    # nullable, after the stamps.
    with psycopg.connect(database_url) as conn:
        checks = {c.name: c for c in _curated_tables(conn, import_ctx.contracts.values())}
    assert checks["curated tables match the contracts"].ok, checks
    (event,) = drift_events(import_ctx)
    assert event["datasets"]["trips"]["policy"] == "evolve"

    # The same content again: already loaded (its versions are the evolved ones).
    again = import_folder(ctx, ACME, folder, "d2")
    assert isinstance(again, AlreadyLoaded), again
    # Another day without the column loads under the evolved contract, NULL there.
    other = today_folder(landing_bucket, "acme", dt.date(2026, 7, 23))
    upload(s3, other, fleet_delivery(trips=TRIPS_ROWS))
    later = import_folder(ctx, ACME, other, "d3")
    assert isinstance(later, Committed), later
    later_details = ctx.repo.get(later.batch_id).details
    assert later_details["contract_versions"]["trips"] == evolved
    assert "drift" not in later_details
    assert len(drift_events(import_ctx)) == 1


def test_review_holds_the_batch_and_approval_adds_the_column_from_staged_files(
    import_ctx: ImportContext, s3, landing_bucket: str, database_url: str
) -> None:
    ctx = trips_under(import_ctx, on_new_columns="review", new_column_type="int64")
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, drifted_delivery())
    held = import_folder(ctx, ACME, folder, "d1")
    assert isinstance(held, Failed) and held.kind == FailureKind.HELD, held
    assert "co2_grams int64" in held.error and "batches approve" in held.error
    assert "co2_grams" not in trips_columns(database_url)
    assert curated(database_url, "SELECT count(*) FROM curated.fleet_trips") == [(0,)]
    facts = ctx.repo.get(held.batch_id).details["failure"]["held"]
    assert facts["drift"] == {"trips": {"co2_grams": "int64"}}
    told = [p for n, p in import_ctx.recorded_events if n == "fleet.batch.held"]  # type: ignore[attr-defined]
    assert [p["drift"] for p in told] == [{"trips": {"co2_grams": "int64"}}]  # what to review

    approved = approve_held(ctx, held.batch_id, admission=layout_admission())
    assert isinstance(approved, Committed) and approved.published, approved
    assert trips_columns(database_url)["co2_grams"] == "bigint"
    assert sorted(v for v in co2_values(database_url) if v is not None) == list(range(100, 110))
    # No file read again: each came from what the held batch normalized and staged.
    assert approved.summary["cache_hits"] == len(approved.summary["files"]) == 4
    assert ctx.repo.get(held.batch_id).details["review"]["decision"] == "approved"
    approval = ctx.repo.get(approved.batch_id).details["drift"]["trips"]
    assert approval == {
        "policy": "review",
        "columns": {"co2_grams": "int64"},
        "approved": str(held.batch_id),
    }
    (event,) = drift_events(import_ctx)
    assert event["batch_id"] == str(approved.batch_id)


def test_an_optional_column_a_file_lacks_loads_null_any_other_rejects_the_file(
    import_ctx: ImportContext, s3, landing_bucket: str, database_url: str
) -> None:
    columns = tuple(
        c.model_copy(update={"optional": True}) if c.name == "driver_id" else c
        for c in TRIPS.columns
    )
    ctx = trips_under(import_ctx, columns=columns)
    folder = today_folder(landing_bucket, "acme")
    files = fleet_delivery(trips=TRIPS_ROWS)
    table = trips_table(10, vehicles=20).drop_columns(["driver_id"])
    files["trips-1.csv"] = csv_bytes(table)
    upload(s3, folder, files)
    outcome = import_folder(ctx, ACME, folder, "d1")
    assert isinstance(outcome, Committed), outcome
    nulls = curated(
        database_url, "SELECT count(*) FROM curated.fleet_trips WHERE driver_id IS NULL"
    )
    assert nulls[0][0] >= 10

    other = today_folder(landing_bucket, "acme", dt.date(2026, 7, 23))
    files["trips-1.csv"] = csv_bytes(trips_table(10, vehicles=20).drop_columns(["vehicle_id"]))
    upload(s3, other, files)
    failed = import_folder(ctx, ACME, other, "d2")
    assert isinstance(failed, Failed), failed
    assert "missing columns: vehicle_id" in failed.error


@pytest.mark.parametrize("policy", ["ignore", "evolve"])
def test_jsonl_and_parquet_new_columns(
    policy: str, import_ctx: ImportContext, s3, landing_bucket: str, database_url: str
) -> None:
    """A JSON-lines key and a Parquet column the contract does not name: reported (ignore)
    or added, typed from the Parquet schema (evolve)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    ctx = trips_under(import_ctx, on_new_columns=policy)
    folder = today_folder(landing_bucket, "acme")
    files = fleet_delivery(trips=TRIPS_ROWS)
    del files["trips-1.csv"]
    table = trips_table(10, vehicles=20).append_column("co2_grams", pa.array(range(10)))
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    files["trips-1.parquet"] = sink.getvalue().to_pybytes()
    upload(s3, folder, files)
    outcome = import_folder(ctx, ACME, folder, "d1")
    assert isinstance(outcome, Committed), outcome
    drift = ctx.repo.get(outcome.batch_id).details["drift"]["trips"]
    assert drift["columns"] == {"co2_grams": "int64"}  # the Parquet column's type
    if policy == "evolve":
        assert trips_columns(database_url)["co2_grams"] == "bigint"
        assert sorted(v for v in co2_values(database_url) if v is not None) == list(range(10))
    else:
        assert "co2_grams" not in trips_columns(database_url)


def test_the_sweep_reads_an_evolved_folder_as_its_imports_do(
    import_ctx: ImportContext, s3, landing_bucket: str, database_url: str
) -> None:
    """A folder loaded under an evolved contract is loaded, not due: the sweep asks for the
    tenant's effective contracts (asked with the declared ones, it would start it again)."""
    from functools import partial

    from fleet_import.importing.drift import effective_contracts
    from fleet_import.intake.completion import Marker
    from fleet_import.intake.sweep import find_ready_folders, plan_sweep
    from fleet_import.store.sweep_repository import SweepRepository

    ctx = trips_under(import_ctx, on_new_columns="evolve")
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, {**drifted_delivery(), "_SUCCESS": b""})
    assert isinstance(import_folder(ctx, ACME, folder, "d1"), Committed)
    repo = SweepRepository(database_url)

    def plan(**contracts_of) -> tuple[int, list[str]]:
        scan = find_ready_folders(
            s3, landing_bucket, completion=Marker(), contracts=ctx.contracts, **contracts_of
        )
        planned = plan_sweep(scan, repo)
        return len(planned.start), [skip.kind for skip in planned.skip]

    assert plan(contracts_of=partial(effective_contracts, ctx.contracts, ctx.warehouse)) == (
        0,
        ["loaded"],
    )
    assert plan() == (1, [])  # the declared contracts: another version, due again


def test_a_rollback_to_an_evolved_load_reads_with_the_evolved_contract(
    import_ctx: ImportContext, outbox, s3, landing_bucket: str, database_url: str
) -> None:
    from fleet_import.importing.rollback import rollback_slice
    from tests.importing.guard_helpers import retaining_ctx

    reviews = ReviewRepository(database_url)
    retaining_ctx(import_ctx, outbox, reviews, keep_seconds=3600)
    ctx = trips_under(import_ctx, on_new_columns="evolve", new_column_type="int64")
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, drifted_delivery())
    first = import_folder(ctx, ACME, folder, "d1")
    assert isinstance(first, Committed) and first.published, first
    upload(s3, folder, {"trips-1.csv": with_co2(csv_bytes(trips_table(10, start=50)))})
    second = import_folder(ctx, ACME, folder, "d2")
    assert isinstance(second, Committed) and second.published, second

    restored = rollback_slice(
        ctx, reviews, ACME.tenant_id, folder, first.batch_id, admission=layout_admission()
    )
    assert isinstance(restored, Committed), restored
    assert restored.summary["cache_hits"] == len(restored.summary["files"])
    assert sorted(v for v in co2_values(database_url) if v is not None) == list(range(100, 110))


def test_tables_migrate_keeps_the_columns_evolve_added(
    import_ctx: ImportContext, s3, landing_bucket: str, database_url: str
) -> None:
    """A table `evolve` grew holds the contract's shape with the added column after the
    stamps: `tables migrate` and `contracts show` plan against the effective contracts, so
    they find nothing to change; against the declared ones the table would read as another
    shape (its extra column planned away)."""
    ctx = trips_under(import_ctx, on_new_columns="evolve", new_column_type="int64")
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, drifted_delivery())
    assert isinstance(import_folder(ctx, ACME, folder, "d1"), Committed)

    migration = migration_for(ctx.warehouse)
    effective = effective_contracts(ctx.contracts, ctx.warehouse, "acme")
    assert "co2_grams" in effective["trips"].evolved_columns
    plans = {p.dataset: p for p in plan_tables(migration, effective.values())}
    assert plans["trips"].state == "matches" and plans["trips"].method is None, plans["trips"]
    declared = {p.dataset: p for p in plan_tables(migration, ctx.contracts.values())}
    assert declared["trips"].method is not None, declared["trips"]
