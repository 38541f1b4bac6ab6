"""The Warehouse protocol's promises, asserted against the PostgreSQL warehouse and the
in-memory fake alike: a committed slice is visible with its registry row, replaced
atomically, and its stamp reads back; nothing of an uncommitted slice is ever seen."""

from __future__ import annotations

import uuid
from pathlib import Path

import pyarrow as pa
import pytest

from fleet_import.contracts.fleet import FLEET_DATASETS
from fleet_import.errors import WarehouseError
from fleet_import.warehouse.base import WarehouseSession
from fleet_import.warehouse.shape import TableMigrationNeeded
from tests.warehouse_helpers import ACME, FLOAT_FUEL, SCOPE, fleet_loads, write_normalized

OTHER_SCOPE = "fleet_s3:s3://fleet-landing/acme/fleet/2026-07-23/"
SMALL = {"vehicles": 4, "trips": 10}


def _commit(warehouse, loads, batch_id=None, scope=SCOPE):
    return warehouse.commit_slice(
        tenant_id=ACME, source_scope=scope, batch_id=batch_id or uuid.uuid4(), datasets=loads
    )


def test_committed_slice_is_stamped_and_counted(any_warehouse, tmp_path: Path) -> None:
    assert any_warehouse.slice_owner(ACME, SCOPE) is None
    assert any_warehouse.slice_counts(ACME, SCOPE) == {}
    assert any_warehouse.registered_counts(ACME, SCOPE) == {}
    batch_id = uuid.uuid4()
    committed = _commit(any_warehouse, fleet_loads(tmp_path, SMALL), batch_id)
    assert committed.batch_id == batch_id and committed.row_counts == SMALL
    assert any_warehouse.slice_owner(ACME, SCOPE) == batch_id
    assert any_warehouse.slice_counts(ACME, SCOPE) == SMALL
    assert any_warehouse.registered_counts(ACME, SCOPE) == SMALL  # what the slice guards read
    assert any_warehouse.slice_owner(ACME, OTHER_SCOPE) is None


def test_replacement_is_whole_and_atomic(any_warehouse, tmp_path: Path) -> None:
    first = uuid.uuid4()
    _commit(any_warehouse, fleet_loads(tmp_path / "a", SMALL), first)
    second = uuid.uuid4()
    with any_warehouse.open_slice(
        tenant_id=ACME,
        source_scope=SCOPE,
        batch_id=second,
        contracts=[FLEET_DATASETS["trips"]],
    ) as writer:
        (load,) = fleet_loads(tmp_path / "b", {"trips": 6})
        assert writer.load_files(load.contract, iter(load.files)) == 6
        # Loaded, not committed: readers still see the first slice, whole.
        assert any_warehouse.slice_owner(ACME, SCOPE) == first
        assert any_warehouse.slice_counts(ACME, SCOPE) == SMALL
        commit = writer.commit()
    assert commit.row_counts == {"trips": 6}
    assert any_warehouse.slice_owner(ACME, SCOPE) == second
    # The slice is replaced as a whole: the vehicles that left it went with the old one.
    assert any_warehouse.slice_counts(ACME, SCOPE) == {"trips": 6}


def test_slice_closed_without_commit_leaves_the_old_one(any_warehouse, tmp_path: Path) -> None:
    first = uuid.uuid4()
    _commit(any_warehouse, fleet_loads(tmp_path / "a", SMALL), first)
    loads = fleet_loads(tmp_path / "b", {"trips": 8})
    with (
        pytest.raises(RuntimeError, match="failed mid-slice"),
        any_warehouse.open_slice(
            tenant_id=ACME, source_scope=SCOPE, batch_id=uuid.uuid4(), contracts=[loads[0].contract]
        ) as writer,
    ):
        writer.load_files(loads[0].contract, loads[0].files)
        raise RuntimeError("failed mid-slice")
    assert any_warehouse.slice_owner(ACME, SCOPE) == first
    assert any_warehouse.slice_counts(ACME, SCOPE) == SMALL


def test_excluded_lines_and_discarded_keys_are_not_loaded(any_warehouse, tmp_path: Path) -> None:
    trips = FLEET_DATASETS["trips"]
    file = write_normalized(tmp_path / "t.parquet", trips, 10)
    excluded = type(file)(file.path, frozenset({2, 3}))  # the first two rows
    with any_warehouse.open_slice(
        tenant_id=ACME, source_scope=SCOPE, batch_id=uuid.uuid4(), contracts=[trips]
    ) as writer:
        assert writer.load_files(trips, [excluded]) == 8
        key = trips.natural_key[0]
        keys = pa.table({key: pa.array(["trip_id-5", "trip_id-6", "absent"])})
        assert writer.discard_keys(trips, keys) == 2
        assert writer.row_counts == {"trips": 6}
        assert writer.commit().row_counts == {"trips": 6}
    assert any_warehouse.slice_counts(ACME, SCOPE) == {"trips": 6}


def test_undeclared_dataset_and_reserved_names_are_refused(any_warehouse, tmp_path: Path) -> None:
    (trips, vehicles) = (FLEET_DATASETS["trips"], FLEET_DATASETS["vehicles"])
    with any_warehouse.open_slice(
        tenant_id=ACME, source_scope=SCOPE, batch_id=uuid.uuid4(), contracts=[trips]
    ) as writer:
        (load,) = fleet_loads(tmp_path, {"vehicles": 2})
        with pytest.raises(WarehouseError):
            writer.load_files(vehicles, load.files)
    with pytest.raises(WarehouseError):
        _commit(any_warehouse, [])


def test_the_session_a_slice_reports_can_be_ended(any_warehouse, tmp_path: Path) -> None:
    sessions: list[WarehouseSession] = []
    first = uuid.uuid4()
    _commit(any_warehouse, fleet_loads(tmp_path / "a", {"trips": 4}), first)
    (load,) = fleet_loads(tmp_path / "b", {"trips": 6})
    writer = any_warehouse.open_slice(
        tenant_id=ACME,
        source_scope=SCOPE,
        batch_id=uuid.uuid4(),
        contracts=[load.contract],
        on_session=sessions.append,
    )
    with writer:
        (session,) = sessions
        assert WarehouseSession.from_json(session.to_json()) == session
        writer.load_files(load.contract, load.files)
        assert any_warehouse.end_session(session) is True
        with pytest.raises(WarehouseError):
            writer.commit()
    assert any_warehouse.end_session(session) is False  # gone already
    assert any_warehouse.slice_owner(ACME, SCOPE) == first


def test_a_table_of_another_shape_needs_a_migration(any_warehouse) -> None:
    """What claim() stops a delivery on before reserving (importing.claim): the table's shape
    against its contract, with the command that migrates it for the tenant."""
    any_warehouse.ensure_tables(FLEET_DATASETS.values())
    any_warehouse.check_tables(ACME, FLEET_DATASETS.values())  # the shapes match
    with pytest.raises(TableMigrationNeeded) as needed:
        any_warehouse.check_tables(ACME, [FLOAT_FUEL])  # money as float64: contract version 1
    message = str(needed.value)
    assert "does not match dataset 'fuel_transactions'" in message
    assert "fleet-import tables migrate --tenant acme --apply" in message
