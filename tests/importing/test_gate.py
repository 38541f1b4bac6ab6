"""The content gate (issue 49) through the import algorithm on PostgreSQL and moto: each check
type and each drift rule holds a delivery that breaks it, and lets it through once switched
off; a warning publishes and is told; `--no-gate` skips it; the baseline is the replaced
slice's profile."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from fleet_import.contracts.extension import extend, extensions_from
from fleet_import.contracts.fleet import FLEET_DATASETS, FUEL_TRANSACTIONS
from fleet_import.importing.context import Committed, Failed, ImportContext
from fleet_import.importing.driver import import_folder
from fleet_import.importing.gate import WARNED_EVENT
from fleet_import.importing.guards import GuardOverride
from fleet_import.sample_data import (
    csv_bytes,
    fleet_delivery,
    fuel_table,
    parquet_bytes,
    today_folder,
    trips_table,
    vehicles_table,
)
from fleet_import.scope import Tenant
from fleet_import.store.details import FailureKind
from fleet_import.store.gates import GateRepository
from tests.helpers import slice_rows, upload
from tests.importing.guard_helpers import redeliver

ACME = Tenant.named("acme")
TRIPS = 60
VEHICLES = 20


def with_trips(ctx: ImportContext, extension: dict) -> ImportContext:
    """`ctx` whose contracts extend trips as a contract file's `extend:` would."""
    ctx.contracts = extend(FLEET_DATASETS, extensions_from(extension, "t.yaml"), "t.yaml")
    return ctx


def trips_with(**columns) -> dict[str, bytes]:
    """The delivery's trips (one file) with some columns replaced."""
    table = trips_table(TRIPS, vehicles=VEHICLES)
    for name, values in columns.items():
        index = table.column_names.index(name)
        table = table.set_column(index, name, pa.array(values, table.schema.field(name).type))
    return {"trips-1.csv": csv_bytes(table)}


def delivered(s3, landing_bucket: str, trips: dict[str, bytes] | None = None) -> str:
    folder = today_folder(landing_bucket, "acme")
    files = fleet_delivery(trips=TRIPS, vehicles=VEHICLES)
    if trips is not None:
        del files["trips-2.csv.gz"]
        files.update(trips)
    upload(s3, folder, files)
    return folder


CHECKS = {
    "not_null": (
        {"type": "not_null", "columns": ["driver_id"]},
        {"driver_id": [None] * 5 + [f"D{i}" for i in range(TRIPS - 5)]},
        "not_null(driver_id): 5 rows",
    ),
    "unique": (
        {"type": "unique", "columns": ["vehicle_id", "started_at"]},
        {"started_at": ["2026-07-02T09:00:00Z"] * TRIPS},
        "unique(vehicle_id,started_at): 60 rows",
    ),
    "accepted_values": (
        {"type": "accepted_values", "columns": ["status"], "values": ["completed"]},
        {},
        "accepted_values(status): 40 rows",
    ),
    "relationships": (
        {"type": "relationships", "columns": ["vehicle_id"], "to": "vehicles.vehicle_id"},
        {"vehicle_id": [f"V{i}" for i in range(TRIPS)]},
        "relationships(vehicle_id): 40 rows",
    ),
    "expression": (
        {"type": "expression", "expression": "distance_km > 1 and distance_km < 240"},
        {},
        "expression(distance_km > 1 and distance_km < 240):",
    ),
    "row_count": (
        {"type": "row_count", "error_if": "< 100"},
        {},
        "row_count: 60 rows (error_if < 100)",
    ),
}


@pytest.mark.parametrize("check_type", list(CHECKS))
def test_each_check_type_holds_a_delivery_that_breaks_it_and_not_once_switched_off(
    import_ctx: ImportContext, s3, landing_bucket: str, database_url: str, check_type: str
) -> None:
    check, columns, named = CHECKS[check_type]
    folder = delivered(s3, landing_bucket, trips_with(**columns))
    held = import_folder(with_trips(import_ctx, {"trips": {"checks": [check]}}), ACME, folder, "d1")
    assert isinstance(held, Failed) and held.kind == FailureKind.HELD, held
    assert named in held.error, held.error
    assert f"batches approve {held.batch_id}" in held.error
    assert slice_rows(database_url, "fleet_trips", "acme", folder) == []
    gates = GateRepository(database_url).gate_of(held.batch_id)
    (trips,) = [gate for gate in gates if gate.dataset == "trips"]
    assert trips.outcome == "error"
    assert trips.profile["rows"] == TRIPS
    # Switched off (not declared): the same delivery loads.
    import_ctx.contracts = FLEET_DATASETS
    loaded = import_folder(import_ctx, ACME, folder, "d2")
    assert isinstance(loaded, Committed), loaded


def test_a_warning_publishes_and_is_told(
    import_ctx: ImportContext, s3, landing_bucket: str, database_url: str
) -> None:
    check = {"type": "not_null", "columns": ["driver_id"], "warn_if": "> 0", "error_if": "> 50%"}
    folder = delivered(s3, landing_bucket)
    ctx = with_trips(import_ctx, {"trips": {"checks": [check]}})
    loaded = import_folder(ctx, ACME, folder, "d1")
    assert isinstance(loaded, Committed), loaded
    assert "content gate warned: trips not_null(driver_id)" in loaded.summary["gate_warned"]
    assert "warn_if > 0, error_if > 50%" in loaded.summary["gate_warned"]
    (event,) = [p for name, p in import_ctx.recorded_events if name == WARNED_EVENT]
    assert event["batch_id"] == str(loaded.batch_id)
    (warning,) = event["warnings"]
    assert warning["outcome"] == "warn" and warning["failing_uri"].endswith(".csv")
    bucket, key = warning["failing_uri"].removeprefix("s3://").split("/", 1)
    assert f"/rejects/{loaded.batch_id}/gate/" in key
    failing = s3.get_object(Bucket=bucket, Key=key)["Body"].read().decode()
    assert failing.splitlines()[0].startswith('"_source_file","trip_id"')
    assert len(failing.splitlines()) == 1 + 6  # ids divisible by 11 below 60 have no driver
    batch = import_ctx.repo.get(loaded.batch_id)
    assert batch.details["gate"] == {"outcome": "warn", "errors": 0, "warnings": 1}


def cents(s3, folder: str) -> None:
    """The fuel costs redelivered in cents instead of euros."""
    table = fuel_table(80, vehicles=VEHICLES).cast(FUEL_TRANSACTIONS.arrow_schema)
    index = table.column_names.index("total_amount")
    amounts = pc.multiply(table["total_amount"], pa.scalar(100, pa.decimal128(3, 0)))
    table = table.set_column(index, "total_amount", amounts.cast(pa.decimal128(12, 2)))
    upload(s3, folder, {"fuel_transactions.parquet": parquet_bytes(table, FUEL_TRANSACTIONS)})


def empty_drivers(s3, folder: str) -> None:
    """90% of the trips' drivers empty."""
    drivers = [f"D{i}" if i % 10 == 0 else None for i in range(TRIPS)]
    redeliver(s3, folder, trips_with(driver_id=drivers))


def new_make(s3, folder: str) -> None:
    table = vehicles_table(VEHICLES)
    makes = ["Renault", *table["make"].to_pylist()[1:]]
    table = table.set_column(table.column_names.index("make"), "make", pa.array(makes))
    upload(s3, folder, {"vehicles.csv": csv_bytes(table)})


def all_completed(s3, folder: str) -> None:
    redeliver(s3, folder, trips_with(status=["completed"] * TRIPS))


RULES = ("null_rate_up", "sum_moved", "mean_moved", "new_value", "went_constant")
DRIFTS = {
    "null_rate_up": (empty_drivers, "null_rate_up(driver_id): null 10% -> 90%"),
    "sum_moved": (cents, "sum_moved(total_amount): sum "),
    "mean_moved": (cents, "mean_moved(total_amount): mean "),
    "new_value": (new_make, "new_value(make): Renault (any)"),
    "went_constant": (all_completed, "went_constant(status): distinct 3 -> 1 (1 value)"),
}


def only(rule: str | None) -> dict:
    """Drift rules with every rule off but `rule`, which errors."""
    drift = {name: {"severity": "error" if name == rule else "off"} for name in RULES}
    return {name: {"profile_drift": drift} for name in ("trips", "vehicles", "fuel_transactions")}


@pytest.mark.parametrize("rule", list(DRIFTS))
def test_each_drift_rule_holds_a_redelivery_that_breaks_it_and_not_once_switched_off(
    import_ctx: ImportContext, s3, landing_bucket: str, database_url: str, rule: str
) -> None:
    change, named = DRIFTS[rule]
    folder = delivered(s3, landing_bucket)
    first = import_folder(with_trips(import_ctx, only(rule)), ACME, folder, "d1")
    assert isinstance(first, Committed), first
    change(s3, folder)
    held = import_folder(import_ctx, ACME, folder, "d2")
    assert isinstance(held, Failed) and held.kind == FailureKind.HELD, held
    assert named in held.error, held.error
    gates = GateRepository(database_url).gate_of(held.batch_id)
    assert {g.baseline_batch_id for g in gates} == {first.batch_id}
    # Switched off: the same redelivery loads.
    loaded = import_folder(with_trips(import_ctx, only(None)), ACME, folder, "d3")
    assert isinstance(loaded, Committed), loaded


def test_the_first_load_has_no_baseline_and_says_so(
    import_ctx: ImportContext, s3, landing_bucket: str, database_url: str
) -> None:
    folder = delivered(s3, landing_bucket)
    first = import_folder(import_ctx, ACME, folder, "d1")
    assert isinstance(first, Committed), first
    gates = GateRepository(database_url).gate_of(first.batch_id)
    assert [g.dataset for g in gates] == ["fuel_transactions", "trips", "vehicles"]
    for gate in gates:
        assert gate.baseline_batch_id is None and gate.outcome == "pass"
        assert [r["detail"] for r in gate.results] == ["no previous profile: first load"]
    trips = next(g for g in gates if g.dataset == "trips").profile
    assert trips["rows"] == TRIPS and trips["distinct_method"].startswith("exact")
    assert trips["columns"]["trip_id"]["distinct"] == TRIPS  # the key: its rows
    assert trips["columns"]["driver_id"]["distinct"] == 54  # D0..D96 by id % 97, minus % 11
    statuses = {"completed": 20, "cancelled": 20, "in_progress": 20}
    assert trips["columns"]["status"]["top"] == statuses
    fuel = next(g for g in gates if g.dataset == "fuel_transactions").profile
    total = fuel["columns"]["total_amount"]
    assert isinstance(total["sum"], str) and "." in total["sum"]  # exact decimal, as text


def test_the_default_rules_hold_cents_and_empty_drivers_and_no_gate_skips_them(
    import_ctx: ImportContext, s3, landing_bucket: str, database_url: str
) -> None:
    folder = delivered(s3, landing_bucket)
    assert isinstance(import_folder(import_ctx, ACME, folder, "d1"), Committed)
    cents(s3, folder)
    empty_drivers(s3, folder)
    held = import_folder(import_ctx, ACME, folder, "d2")
    assert isinstance(held, Failed) and held.kind == FailureKind.HELD, held
    assert "mean_moved(total_amount)" in held.error and "null_rate_up(driver_id)" in held.error
    skip = GuardOverride.for_run(False, None, no_gate=True)
    loaded = import_folder(import_ctx, ACME, folder, "d3", guard=skip)
    assert isinstance(loaded, Committed), loaded
    batch = import_ctx.repo.get(loaded.batch_id)
    assert batch.details["gate"] == {"skipped": "no_gate"}
    assert batch.details["guard"]["no_gate"] is True
    assert GateRepository(database_url).gate_of(loaded.batch_id) == []


def test_a_tenants_override_tunes_a_drift_rule_for_that_tenant_only(
    import_ctx: ImportContext, s3, landing_bucket: str, tmp_path
) -> None:
    from fleet_import.config import Settings

    registry = tmp_path / "tenants.yaml"
    registry.write_text(
        "tenants:\n"
        "  acme:\n"
        "    overrides:\n"
        "      gate:\n"
        "        fuel_transactions: {mean_moved: {limit: 20000}, sum_moved: {severity: off}}\n"
    )
    folder = delivered(s3, landing_bucket)
    assert isinstance(import_folder(import_ctx, ACME, folder, "d1"), Committed)
    cents(s3, folder)
    held = import_folder(import_ctx, ACME, folder, "d2")  # the default rules hold cents
    assert isinstance(held, Failed) and "mean_moved(total_amount)" in held.error, held
    import_ctx.settings = Settings(tenants=str(registry))
    loaded = import_folder(import_ctx, ACME, folder, "d3")  # acme's own limit lets it by
    assert isinstance(loaded, Committed), loaded
    assert "gate_warned" not in loaded.summary  # sum_moved is off for acme


def test_a_wrong_tenant_override_names_the_registry_field(
    import_ctx: ImportContext, s3, landing_bucket: str, tmp_path
) -> None:
    from fleet_import.config import Settings

    registry = tmp_path / "tenants.yaml"
    registry.write_text(
        "tenants:\n  acme:\n    overrides:\n      gate:\n        trips: {mean_movd: {limit: 1}}\n"
    )
    import_ctx.settings = Settings(tenants=str(registry))
    failed = import_folder(import_ctx, ACME, delivered(s3, landing_bucket), "d1")
    assert isinstance(failed, Failed) and failed.kind == FailureKind.FAILED_PRE_COMMIT, failed
    where = "FLEET_TENANTS: tenants.acme.overrides.gate.trips: mean_movd: unknown field"
    assert f"{where} (did you mean 'mean_moved'?)" in failed.error, failed.error


def test_the_profile_counts_the_rows_the_slice_holds_duplicate_keys_left_out(
    import_ctx: ImportContext, s3, landing_bucket: str, database_url: str
) -> None:
    """Profiled as the files arrive, and again without the duplicate keys the load drops."""
    folder = delivered(s3, landing_bucket)
    clean = import_folder(import_ctx, ACME, folder, "d1")
    assert isinstance(clean, Committed), clean
    gates = GateRepository(database_url).gate_of(clean.batch_id)
    (trips,) = [g for g in gates if g.dataset == "trips"]
    assert trips.profile["rows"] == clean.row_counts["trips"] == TRIPS
    repeated = trips_table(1, vehicles=VEHICLES)  # T0 again, in a third file
    upload(s3, folder, {"trips-3.csv": csv_bytes(repeated)})
    again = import_folder(import_ctx, ACME, folder, "d2")
    assert isinstance(again, Committed), again
    assert again.row_counts["trips"] == TRIPS - 1  # both rows of the repeated key rejected
    gates = GateRepository(database_url).gate_of(again.batch_id)
    (trips,) = [g for g in gates if g.dataset == "trips"]
    assert trips.profile["rows"] == TRIPS - 1
    assert trips.profile["columns"]["trip_id"]["distinct"] == TRIPS - 1
