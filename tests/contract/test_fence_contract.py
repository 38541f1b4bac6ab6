"""The lease's fence at the warehouse (issue #26): a slice asks its `fence` before each
warehouse step (each COPY, each discard of duplicate keys) and just before its COMMIT; when the
fence refuses (the importer's lease may have expired), the slice is rolled back and nothing of
it is ever visible. A contract: on PostgreSQL, on Redshift through the emulator (where the
COMMIT follows the LOCKs, which may wait long) and on the in-memory fake the fast tests run."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from fleet_import.errors import LeaseUnconfirmed
from fleet_import.warehouse.base import WarehouseSession
from tests.fakes.warehouse import MemoryWarehouse
from tests.warehouse_helpers import ACME, SCOPE, fleet_loads

# The override below names no server fixture: the real warehouses are marked `server`.
WAREHOUSES = [
    pytest.param("postgres", marks=pytest.mark.server),
    pytest.param("redshift", marks=[pytest.mark.server, pytest.mark.slow]),
    "memory",
]
pytestmark = pytest.mark.parametrize("warehouse", WAREHOUSES, indirect=True)


@pytest.fixture
def warehouse(request: pytest.FixtureRequest) -> Any:
    """tests/conftest.py's warehouse (PostgreSQL, Redshift), or the fake."""
    if request.param == "memory":
        return MemoryWarehouse()
    return request.getfixturevalue("warehouse")


class Fence:
    """Lets `allowed` calls through, then refuses as the heartbeat's fence does."""

    def __init__(self, allowed: int) -> None:
        self.allowed, self.calls = allowed, 0

    def __call__(self) -> None:
        self.calls += 1
        if self.calls > self.allowed:
            raise LeaseUnconfirmed("the operational database has not confirmed the lease")


def _first_slice(warehouse: Any, tmp_path: Path) -> uuid.UUID:
    first = uuid.uuid4()
    warehouse.commit_slice(
        tenant_id=ACME,
        source_scope=SCOPE,
        batch_id=first,
        datasets=fleet_loads(tmp_path / "first", {"trips": 4}),
    )
    return first


def test_a_fence_refusing_the_commit_rolls_the_slice_back(warehouse: Any, tmp_path: Path) -> None:
    first = _first_slice(warehouse, tmp_path)
    (trips,) = fleet_loads(tmp_path / "second", {"trips": 10})
    sessions: list[WarehouseSession] = []
    fence = Fence(allowed=1)  # the COPY passes; the COMMIT is refused
    with (
        pytest.raises(LeaseUnconfirmed),
        warehouse.open_slice(
            tenant_id=ACME,
            source_scope=SCOPE,
            batch_id=uuid.uuid4(),
            contracts=[trips.contract],
            on_session=sessions.append,
            fence=fence,
        ) as writer,
    ):
        assert writer.load_files(trips.contract, trips.files) == 10
        writer.commit()
    assert fence.calls == 2  # asked before the COPY, then before the COMMIT
    assert warehouse.slice_owner(ACME, SCOPE) == first
    assert warehouse.slice_counts(ACME, SCOPE) == {"trips": 4}
    # Rolled back and let go: no session of the slice is left holding anything.
    assert [warehouse.end_session(session) for session in sessions] == [False] * len(sessions)


def test_a_fence_refusing_a_copy_stops_before_it(warehouse: Any, tmp_path: Path) -> None:
    first = _first_slice(warehouse, tmp_path)
    copies = warehouse.copies
    (trips,) = fleet_loads(tmp_path / "second", {"trips": 10})
    with (
        pytest.raises(LeaseUnconfirmed),
        warehouse.open_slice(
            tenant_id=ACME,
            source_scope=SCOPE,
            batch_id=uuid.uuid4(),
            contracts=[trips.contract],
            fence=Fence(allowed=0),
        ) as writer,
    ):
        writer.load_files(trips.contract, trips.files)
    assert warehouse.copies == copies  # no COPY was sent
    assert warehouse.slice_owner(ACME, SCOPE) == first
    assert warehouse.slice_counts(ACME, SCOPE) == {"trips": 4}


def test_a_fence_refusing_a_discard_stops_before_it(warehouse: Any, tmp_path: Path) -> None:
    first = _first_slice(warehouse, tmp_path)
    (trips,) = fleet_loads(tmp_path / "second", {"trips": 10})
    keys = pq.read_table(trips.files[0].path).select(list(trips.contract.natural_key))
    fence = Fence(allowed=1)  # the COPY passes; the discard of duplicate keys is refused
    with (
        pytest.raises(LeaseUnconfirmed),
        warehouse.open_slice(
            tenant_id=ACME,
            source_scope=SCOPE,
            batch_id=uuid.uuid4(),
            contracts=[trips.contract],
            fence=fence,
        ) as writer,
    ):
        assert writer.load_files(trips.contract, trips.files) == 10
        writer.discard_keys(trips.contract, keys.slice(0, 2))
    assert fence.calls == 2
    assert warehouse.slice_owner(ACME, SCOPE) == first
    assert warehouse.slice_counts(ACME, SCOPE) == {"trips": 4}
