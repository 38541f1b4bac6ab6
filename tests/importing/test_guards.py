"""Slice guards (issue #24): a redelivery that would empty or shrink a slice is held for
review before its commit; moto's S3 server, a real PostgreSQL for both databases."""

from __future__ import annotations

import pytest

from fleet_import.contracts.files import contract_from_dict
from fleet_import.contracts.fleet import TRIPS
from fleet_import.contracts.model import ContractError, ContractSet
from fleet_import.errors import InvalidInput
from fleet_import.importing.context import Committed, Failed, ImportContext
from fleet_import.importing.driver import import_folder
from fleet_import.importing.guards import HELD_EVENT, GuardOverride
from fleet_import.sample_data import csv_bytes, fleet_delivery, today_folder, trips_table
from fleet_import.scope import Tenant, split_folder
from fleet_import.store.models import BatchStatus, FailureKind
from tests.helpers import slice_rows, upload
from tests.importing.guard_helpers import redeliver, slice_snapshot
from tests.warehouse_helpers import WAREHOUSE_BACKENDS

ACME = Tenant.named("acme")
TRIPS_HEADER = b'"trip_id","vehicle_id","driver_id","started_at","ended_at","distance_km",'


def truncated_trips() -> dict[str, bytes]:
    return {"trips-1.csv": csv_bytes(trips_table(10))}


def header_only_trips() -> dict[str, bytes]:
    header = csv_bytes(trips_table(1)).split(b"\n", 1)[0] + b"\n"
    assert header.startswith(TRIPS_HEADER)
    return {"trips-1.csv": header}


@pytest.mark.parametrize("warehouse", WAREHOUSE_BACKENDS, indirect=True)
@pytest.mark.parametrize(
    ("trips_files", "new_rows", "rule"),
    [(truncated_trips, 10, "min_rows_ratio 0.5"), (header_only_trips, 0, "allow_empty false")],
    ids=["truncated", "header_only"],
)
def test_a_shrinking_redelivery_is_held_and_the_old_slice_stays(
    import_ctx: ImportContext,
    s3,
    landing_bucket: str,
    database_url: str,
    trips_files,
    new_rows: int,
    rule: str,
) -> None:
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=400))
    good = import_folder(import_ctx, ACME, folder, "d1")
    assert isinstance(good, Committed), good
    before = slice_snapshot(database_url, folder)

    redeliver(s3, folder, trips_files())
    held = import_folder(import_ctx, ACME, folder, "d2")
    assert isinstance(held, Failed), held
    assert held.kind == FailureKind.HELD and not held.resumable
    for named in ("trips", "400", f"to {new_rows:,}", rule, f"batches approve {held.batch_id}"):
        assert named in held.error
    # Nothing committed: the old slice row for row, its owner unchanged, no batch running.
    assert slice_snapshot(database_url, folder) == before
    assert slice_rows(database_url, "fleet_trips", "acme", folder) == [(good.batch_id, 400)]
    assert import_ctx.repo.list(status="running") == []
    batch = import_ctx.repo.get(held.batch_id)
    assert batch.status == BatchStatus.FAILED
    assert batch.details["failure"]["kind"] == "held"
    assert batch.details["warehouse_committed"] is False
    breach = batch.details["failure"]["held"]["breaches"][0]
    assert breach == {"dataset": "trips", "current_rows": 400, "new_rows": new_rows, "rule": rule}
    # Its normalized files stay staged, for an approval to load without parsing them again.
    bucket, prefix = split_folder(folder)
    for obj in batch.details["manifest"]["objects"]:
        version = batch.details["contract_versions"][obj["dataset"]]
        cached = import_ctx.repo.cached_file(f"s3://{bucket}/{obj['key']}", obj["etag"], version)
        assert cached is not None, obj["key"]
        staged_bucket, staged_key = cached.output_uri.removeprefix("s3://").split("/", 1)
        s3.head_object(Bucket=staged_bucket, Key=staged_key)  # raises if it was deleted
    (event,) = [p for name, p in import_ctx.recorded_events if name == HELD_EVENT]
    assert event["batch_id"] == str(held.batch_id) and event["breaches"] == [breach]


@pytest.mark.parametrize("warehouse", WAREHOUSE_BACKENDS, indirect=True)
def test_the_first_load_of_a_scope_is_not_guarded(
    import_ctx: ImportContext, s3, landing_bucket: str
) -> None:
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, {**fleet_delivery(trips=400), **header_only_trips()})
    redeliver(s3, folder, header_only_trips())
    first = import_folder(import_ctx, ACME, folder, "d1")
    assert isinstance(first, Committed), first
    assert first.row_counts["trips"] == 0


@pytest.mark.parametrize("warehouse", WAREHOUSE_BACKENDS, indirect=True)
def test_a_run_may_override_the_guards(
    import_ctx: ImportContext, s3, landing_bucket: str, database_url: str
) -> None:
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=400))
    assert isinstance(import_folder(import_ctx, ACME, folder, "d1"), Committed)

    redeliver(s3, folder, {"trips-1.csv": csv_bytes(trips_table(150))})
    held = import_folder(import_ctx, ACME, folder, "d2")
    assert isinstance(held, Failed) and held.kind == FailureKind.HELD, held
    lower = import_folder(
        import_ctx, ACME, folder, "d3", guard=GuardOverride(min_rows_ratio=0.25, reason="t")
    )
    assert isinstance(lower, Committed), lower
    assert slice_rows(database_url, "fleet_trips", "acme", folder) == [(lower.batch_id, 150)]

    redeliver(s3, folder, header_only_trips())
    waived = import_folder(import_ctx, ACME, folder, "d4", guard=GuardOverride.for_run(True, None))
    assert isinstance(waived, Committed), waived
    assert waived.row_counts["trips"] == 0
    recorded = import_ctx.repo.get(waived.batch_id).details["guard"]
    assert recorded["waived"] is True and recorded["reason"] == "no_guard"


def test_a_contract_that_allows_empty_slices_lets_one_through(
    import_ctx: ImportContext, s3, landing_bucket: str
) -> None:
    import_ctx.contracts = ContractSet(
        c.model_copy(update={"allow_empty": True}) if c.name == "trips" else c
        for c in import_ctx.contracts.values()
    )
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=400))
    assert isinstance(import_folder(import_ctx, ACME, folder, "d1"), Committed)
    redeliver(s3, folder, header_only_trips())
    emptied = import_folder(import_ctx, ACME, folder, "d2")
    assert isinstance(emptied, Committed), emptied


def test_a_dataset_missing_from_a_redelivery_counts_as_emptied(
    import_ctx: ImportContext, s3, landing_bucket: str, database_url: str
) -> None:
    """An optional dataset may be absent, but its absence replaces the slice's rows of it
    with none: the guard judges it as a dataset that went to 0 rows, not as unchanged."""
    import_ctx.contracts = ContractSet(
        c.model_copy(update={"required": False}) if c.name == "vehicles" else c
        for c in import_ctx.contracts.values()
    )
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=40, vehicles=20))
    good = import_folder(import_ctx, ACME, folder, "d1")
    assert isinstance(good, Committed), good
    before = slice_snapshot(database_url, folder)
    assert len(before["fleet_vehicles"]) == 20

    bucket, prefix = split_folder(folder)
    s3.delete_object(Bucket=bucket, Key=prefix + "vehicles.csv")  # trips and fuel stay
    held = import_folder(import_ctx, ACME, folder, "d2")
    assert isinstance(held, Failed) and held.kind == FailureKind.HELD, held
    assert "vehicles would go from 20 rows to 0 (allow_empty false)" in held.error
    breaches = import_ctx.repo.get(held.batch_id).details["failure"]["held"]["breaches"]
    assert breaches == [
        {"dataset": "vehicles", "current_rows": 20, "new_rows": 0, "rule": "allow_empty false"}
    ]
    assert slice_snapshot(database_url, folder) == before  # the vehicles are still there


def test_guard_settings_are_validated_and_leave_the_contract_version_alone() -> None:
    raw = TRIPS.model_dump()
    tuned = contract_from_dict({**raw, "min_rows_ratio": 0.9, "allow_empty": True})
    assert (tuned.min_rows_ratio, tuned.allow_empty) == (0.9, True)
    assert (TRIPS.min_rows_ratio, TRIPS.allow_empty) == (0.5, False)
    # A guard is judged against the slice, not part of the normalized output: the cache
    # key stays.
    assert tuned.contract_version == TRIPS.contract_version
    with pytest.raises(ContractError, match="min_rows_ratio"):
        contract_from_dict({**raw, "min_rows_ratio": 1.5})
    with pytest.raises(ContractError, match="allow_empty"):
        contract_from_dict({**raw, "allow_empty": "sometimes"})
    with pytest.raises(InvalidInput, match="min_rows_ratio"):
        GuardOverride(min_rows_ratio=-0.1)
