"""Slice guards (issue #24): a redelivery that would empty or shrink a slice is held for
review before its commit; moto's S3 server, a real PostgreSQL for both databases. The rule
itself (each count, ratio, override and approval) also on the fakes, in milliseconds."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest

from fleet_import.contracts.files import contract_from_dict
from fleet_import.contracts.fleet import TRIPS
from fleet_import.contracts.model import ContractError, ContractSet
from fleet_import.errors import InvalidInput
from fleet_import.importing.context import Claimed, Committed, Failed, ImportContext
from fleet_import.importing.driver import import_folder
from fleet_import.importing.guards import (
    HELD_EVENT,
    ApprovedContentChanged,
    GuardOverride,
    SliceHeld,
    approve_command,
    check_slice_guards,
    content_of,
    held_error,
    record_override,
)
from fleet_import.importing.leased_batch import LeasedBatch
from fleet_import.s3.sources import discover
from fleet_import.sample_data import (
    csv_bytes,
    fleet_delivery,
    today_folder,
    trips_table,
    vehicles_table,
)
from fleet_import.scope import Tenant, source_scope, split_folder
from fleet_import.store.details import Failure, FailureKind
from fleet_import.store.models import BatchStatus
from tests.fakes.warehouse import RegistryRow
from tests.fakes.world import memory_world
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


# -- the rule itself, on the fakes (no server): what each count and override decides ---------


def _judged(
    tmp_path,
    current: dict[str, int],
    new: dict[str, int],
    override: GuardOverride | None = None,
    allow_empty: frozenset[str] = frozenset(),
    ratios: dict[str, float] | None = None,
) -> list[dict] | str:
    """The breaches check_slice_guards finds for a slice of `current` rows per dataset and
    a new one of `new` (none: it passes), or ApprovedContentChanged's message; `ratios`:
    contracts' own min_rows_ratio."""
    world = memory_world(tmp_path)
    tuned = ratios or {}
    world.ctx.contracts = ContractSet(
        c.model_copy(
            update={
                "allow_empty": c.name in allow_empty,
                "min_rows_ratio": tuned.get(c.name, c.min_rows_ratio),
            }
        )
        for c in world.ctx.contracts.values()
    )
    folder = world.deliver()
    scope = source_scope(folder)
    reserved = world.repo.reserve(ACME, scope, "d1")
    batch_id = reserved.batch.id
    world.repo.acquire_lease(batch_id, "w1", 30.0)
    claimed = Claimed(batch_id, scope, "w1")
    record_override(world.ctx, claimed, override)
    earlier = uuid.uuid4()
    world.warehouse.registry[("acme", scope)] = {
        dataset: RegistryRow(dataset, f"fleet_{dataset}", earlier, rows, dt.datetime.now(dt.UTC))
        for dataset, rows in current.items()
    }
    listing = discover(world.s3, folder, world.ctx.contracts)
    leased = LeasedBatch(world.ctx, ACME, batch_id, scope, "w1")
    try:
        check_slice_guards(leased, listing, {"rows_to_load": new, "files": []})
    except SliceHeld as held:
        return [breach.to_json() for breach in held.breaches]
    except ApprovedContentChanged as changed:
        return str(changed)
    return []


def _breach(dataset: str, current: int, new: int, rule: str) -> dict:
    return {"dataset": dataset, "current_rows": current, "new_rows": new, "rule": rule}


@pytest.mark.parametrize(
    ("current", "new", "allow_empty", "rule"),
    [
        (400, 200, False, None),  # down to exactly min_rows_ratio x current: loads
        (400, 199, False, "min_rows_ratio 0.5"),
        (401, 200, False, "min_rows_ratio 0.5"),  # 200.5 needed
        (400, 0, False, "allow_empty false"),  # emptied: named as such, not as a ratio
        (400, 0, True, None),
        (400, 1, True, "min_rows_ratio 0.5"),  # allowed empty, not allowed to shrink
        (0, 0, False, None),  # nothing to lose
        (1, 1, False, None),
        (1, 0, False, "allow_empty false"),
        (400, 5000, False, None),
    ],
)
def test_a_slice_may_shrink_to_its_ratio_and_empty_only_if_allowed(
    tmp_path, current: int, new: int, allow_empty: bool, rule: str | None
) -> None:
    allowed = frozenset({"trips"}) if allow_empty else frozenset()
    judged = _judged(tmp_path, {"trips": current}, {"trips": new}, allow_empty=allowed)
    assert judged == ([_breach("trips", current, new, rule)] if rule else [])


def test_every_breach_is_named_in_dataset_order_and_missing_ones_count_as_emptied(
    tmp_path,
) -> None:
    current = {"vehicles": 20, "trips": 400, "fuel_transactions": 80}
    assert _judged(tmp_path, current, {"trips": 10, "fuel_transactions": 80}) == [
        _breach("trips", 400, 10, "min_rows_ratio 0.5"),
        _breach("vehicles", 20, 0, "allow_empty false"),
    ]
    # A dataset the old slice did not have is not judged: nothing to lose.
    assert _judged(tmp_path, {"trips": 400}, {"trips": 400, "vehicles": 0}) == []


def test_an_override_sets_the_ratio_or_waives_the_guards(tmp_path) -> None:
    ratio = GuardOverride(min_rows_ratio=0.25, reason="t")
    assert _judged(tmp_path, {"trips": 400}, {"trips": 100}, ratio) == []
    assert _judged(tmp_path, {"trips": 400}, {"trips": 99}, ratio) == [
        _breach("trips", 400, 99, "min_rows_ratio 0.25")
    ]
    assert _judged(tmp_path, {"trips": 400}, {"trips": 0}, ratio) == [
        _breach("trips", 400, 0, "allow_empty false")
    ]
    waived = GuardOverride(waived=True, reason="t")
    assert _judged(tmp_path, {"trips": 400}, {"trips": 0}, waived) == []


def test_an_approval_waives_the_guards_for_its_content_only(tmp_path) -> None:
    probe = memory_world(tmp_path / "probe")
    listing = discover(probe.s3, probe.deliver(), probe.ctx.contracts)
    content = content_of(probe.ctx, listing)  # what the same delivery is, in any world
    approval = GuardOverride(waived=True, content=content, reason="approval of held batch h")
    assert _judged(tmp_path / "a", {"trips": 400}, {"trips": 0}, approval) == []
    other = {**content, "fingerprint": "0" * 64}
    refused = _judged(tmp_path / "b", {"trips": 400}, {"trips": 0}, approval_for(other))
    assert refused == (
        "approval of held batch h was given for other content: the folder changed since "
        f"(fingerprint {content['fingerprint']}, approved {'0' * 64}); nothing was loaded"
    )
    versions = {**content, "contract_versions": {"trips": "other"}}
    changed = _judged(tmp_path / "c", {"trips": 4}, {"trips": 4}, approval_for(versions))
    assert isinstance(changed, str) and "was given for other content" in changed


def approval_for(content: dict) -> GuardOverride:
    return GuardOverride(waived=True, content=content, reason="approval of held batch h")


def test_a_held_batch_once_reviewed_no_longer_says_how_to_approve_it() -> None:
    told = "held for review: trips would go from 400 rows to 10 (min_rows_ratio 0.5)"
    error = f"{told}; to load it anyway: {approve_command('b1')}"
    held = Failure(kind="held", error=error)
    assert held_error(held, reviewed=False) == error
    assert held_error(held, reviewed=True) == told
    failed = Failure(kind="failed_pre_commit", error=f"x; to load it anyway: {told}")
    assert held_error(failed, reviewed=True) == failed.error
    assert held_error(failed, reviewed=False) == failed.error


def test_a_runs_options_become_its_override_with_the_reason_it_records() -> None:
    assert GuardOverride.for_run(False, None) is None
    assert GuardOverride.for_run(True, None) == GuardOverride(waived=True, reason="no_guard")
    assert GuardOverride.for_run(False, 0.1) == GuardOverride(
        min_rows_ratio=0.1, reason="min_rows_ratio 0.1 for this run"
    )
    both = GuardOverride.for_run(True, 0.25)
    reason = "no_guard, min_rows_ratio 0.25 for this run"  # each option the run gave
    assert both == GuardOverride(waived=True, min_rows_ratio=0.25, reason=reason)
    assert GuardOverride.from_json(both.to_json()) == both  # as the batch keeps it
    gate = GuardOverride.for_run(False, None, no_gate=True)
    assert gate == GuardOverride(reason="no_gate", no_gate=True)
    assert GuardOverride.from_json(gate.to_json()) == gate


def test_a_hold_names_every_breach_in_its_error_log_line_record_and_event(
    tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    world = memory_world(tmp_path)
    folder = world.deliver(files=fleet_delivery(trips=400, vehicles=20))
    assert isinstance(import_folder(world.ctx, ACME, folder, "d1"), Committed)
    redeliver(world.s3, folder, {"trips-1.csv": csv_bytes(trips_table(10))})
    upload(world.s3, folder, {"vehicles.csv": csv_bytes(vehicles_table(2))})

    with caplog.at_level("WARNING", logger="fleet_import.importing.guards"):
        held = import_folder(world.ctx, ACME, folder, "d2")

    assert isinstance(held, Failed) and held.kind == FailureKind.HELD, held
    assert held.error == (
        "held for review: trips would go from 400 rows to 10 (min_rows_ratio 0.5); "
        "vehicles would go from 20 rows to 2 (min_rows_ratio 0.5); "
        f"to load it anyway: fleet-import batches approve {held.batch_id}"
    )
    assert f"batch {held.batch_id} {held.error}" in caplog.messages
    assert world.repo.get(held.batch_id).details["failure"]["error"] == held.error
    [told] = [payload for name, payload in world.events if name == HELD_EVENT]
    breaches = world.repo.get(held.batch_id).details["failure"]["held"]["breaches"]
    assert told == {
        "tenant_id": "acme",
        "source_scope": source_scope(folder),
        "batch_id": str(held.batch_id),
        "kind": "held",
        "error": held.error,
        "breaches": breaches,
        "approve": f"fleet-import batches approve {held.batch_id}",
    }
    assert [b["dataset"] for b in breaches] == ["trips", "vehicles"]


def test_a_runs_ratio_may_be_anything_from_0_to_1() -> None:
    assert GuardOverride(min_rows_ratio=0).min_rows_ratio == 0
    assert GuardOverride(min_rows_ratio=1).min_rows_ratio == 1
    for ratio in (-0.01, 1.01, 2):
        with pytest.raises(InvalidInput, match="min_rows_ratio must be within 0..1"):
            GuardOverride(min_rows_ratio=ratio)


def test_a_dataset_no_contract_defines_now_is_judged_by_the_defaults(tmp_path) -> None:
    """The old slice has rows of a dataset whose contract is gone: emptying it is a breach
    (allow_empty false), as for any dataset, not an error."""
    judged = _judged(tmp_path, {"legacy": 10, "trips": 400}, {"trips": 400})
    assert judged == [_breach("legacy", 10, 0, "allow_empty false")]
    assert _judged(tmp_path, {"legacy": 10}, {"legacy": 4}) == [
        _breach("legacy", 10, 4, "min_rows_ratio 0.5")
    ]


def test_a_contracts_own_ratio_decides_unless_the_run_sets_one(tmp_path) -> None:
    strict = {"trips": 0.9}
    assert _judged(tmp_path, {"trips": 400}, {"trips": 360}, ratios=strict) == []
    assert _judged(tmp_path, {"trips": 400}, {"trips": 359}, ratios=strict) == [
        _breach("trips", 400, 359, "min_rows_ratio 0.9")
    ]
    run = GuardOverride(min_rows_ratio=0.5, reason="t")
    assert _judged(tmp_path, {"trips": 400}, {"trips": 200}, run, ratios=strict) == []
