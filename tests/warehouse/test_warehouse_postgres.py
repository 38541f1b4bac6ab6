"""PostgresWarehouse against a real PostgreSQL: slices replaced whole, stamped, isolated,
atomic for concurrent readers, and schema setup safe from several processes at once."""

from __future__ import annotations

import datetime as dt
import logging
import multiprocessing
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleet_import.config import libpq_url
from fleet_import.contracts.fleet import FLEET_DATASETS, FUEL_TRANSACTIONS, TRIPS, VEHICLES
from fleet_import.contracts.model import Column, DatasetContract
from fleet_import.errors import WarehouseError
from fleet_import.warehouse.base import DatasetLoad, LoadFile, SliceCommit, Warehouse
from fleet_import.warehouse.postgres import writer as postgres_writer
from fleet_import.warehouse.postgres.ddl import create_index_sql, create_table_sql, index_name
from fleet_import.warehouse.postgres.slice_sql import copy_sql
from fleet_import.warehouse.postgres.warehouse import PostgresWarehouse
from tests.pgtools import with_user
from tests.processes import results_of
from tests.warehouse_helpers import (
    ACME,
    COUNTS,
    SCOPE,
    commit,
    fleet_loads,
    registry,
    stamps,
    write_normalized,
)

GLOBEX = "globex"
OTHER_SCOPE = "fleet_s3:s3://fleet-landing/acme/fleet/2026-07-23/"

# forkserver: children start clean, not as copies of this threaded test process. No preload
# of our own: the setting is global and test_batches_concurrency sets it for its 32 starts.
_FORK = multiprocessing.get_context("forkserver")


# -- helpers -----------------------------------------------------------------------------


@pytest.fixture
def warehouse(database_url: str) -> PostgresWarehouse:
    wh = PostgresWarehouse(database_url)
    wh.ensure_tables(FLEET_DATASETS.values())
    return wh


# -- tables ------------------------------------------------------------------------------


def test_ensure_tables_creates_typed_tables_index_and_registry(
    warehouse: PostgresWarehouse, db: psycopg.Connection[Any]
) -> None:
    assert isinstance(warehouse, Warehouse)
    warehouse.ensure_tables(FLEET_DATASETS.values())  # idempotent
    columns = db.execute(
        "SELECT column_name, data_type, is_nullable FROM information_schema.columns"
        " WHERE table_schema = 'curated' AND table_name = 'fleet_trips' ORDER BY ordinal_position"
    ).fetchall()
    assert columns == [
        ("trip_id", "text", "NO"),
        ("vehicle_id", "text", "NO"),
        ("driver_id", "text", "YES"),
        ("started_at", "timestamp with time zone", "NO"),
        ("ended_at", "timestamp with time zone", "YES"),
        ("distance_km", "double precision", "YES"),
        ("start_odometer_km", "double precision", "YES"),
        ("end_odometer_km", "double precision", "YES"),
        ("status", "text", "NO"),
        ("tenant_id", "text", "NO"),
        ("source_scope", "text", "NO"),
        ("ingestion_batch_id", "uuid", "NO"),
    ]
    vehicle_types = dict(
        db.execute(
            "SELECT column_name, data_type FROM information_schema.columns"
            " WHERE table_schema = 'curated' AND table_name = 'fleet_vehicles'"
        ).fetchall()
    )
    assert vehicle_types["model_year"] == "bigint"
    indexes = db.execute(
        "SELECT tablename, indexdef FROM pg_indexes WHERE schemaname = 'curated' ORDER BY 1"
    ).fetchall()
    slice_indexes = {t: d for t, d in indexes if "(ingestion_batch_id)" in d}
    assert set(slice_indexes) == {"fleet_trips", "fleet_vehicles", "fleet_fuel_transactions"}
    assert db.execute("SELECT to_regclass('curated.ingestion_slices')").fetchone() == (
        "curated.ingestion_slices",
    )


def test_ensure_tables_refuses_a_table_that_no_longer_matches(
    warehouse: PostgresWarehouse, db: psycopg.Connection[Any]
) -> None:
    db.execute("ALTER TABLE curated.fleet_trips DROP COLUMN status")
    with pytest.raises(WarehouseError, match="does not match dataset 'trips'") as caught:
        PostgresWarehouse(warehouse._conninfo).ensure_tables([TRIPS])
    assert caught.value.transient is False


def test_identifiers_are_quoted(
    database_url: str, db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    awkward = DatasetContract(
        name="orders",
        file_glob="orders*",
        target_table="select.order",
        natural_key=("from",),
        columns=(Column("from", "string", nullable=False), Column("user", "int64")),
    )
    wh = PostgresWarehouse(database_url)
    load = DatasetLoad(awkward, (write_normalized(tmp_path / "o.parquet", awkward, 5),))
    assert commit(wh, [load]).row_counts == {"orders": 5}
    assert db.execute('SELECT count(*) FROM "select"."order"').fetchone() == (5,)


def test_sql_builders_quote_and_order_columns() -> None:
    assert copy_sql(TRIPS).as_string() == (
        'COPY "curated"."fleet_trips" ("trip_id", "vehicle_id", "driver_id", "started_at",'
        ' "ended_at", "distance_km", "start_odometer_km", "end_odometer_km", "status",'
        ' "tenant_id", "source_scope", "ingestion_batch_id") FROM STDIN (FORMAT BINARY)'
    )
    assert create_index_sql(TRIPS).as_string() == (
        'CREATE INDEX IF NOT EXISTS "fleet_trips_slice_ix" ON "curated"."fleet_trips"'
        ' ("ingestion_batch_id")'
    )
    assert (
        create_table_sql(VEHICLES)
        .as_string()
        .startswith(
            'CREATE TABLE IF NOT EXISTS "curated"."fleet_vehicles" ("vehicle_id" text NOT NULL,'
        )
    )
    long_name = DatasetContract(
        name="long",
        file_glob="l*",
        target_table="curated." + "t" * 63,
        natural_key=("k",),
        columns=(Column("k", "string"),),
    )
    assert len(index_name(long_name)) <= 63
    assert index_name(long_name) != index_name(TRIPS)


def test_contract_columns_may_not_shadow_the_stamps(database_url: str) -> None:
    clash = DatasetContract(
        name="clash",
        file_glob="c*",
        target_table="curated.clash",
        natural_key=("tenant_id",),
        columns=(Column("tenant_id", "string"),),
    )
    with pytest.raises(WarehouseError, match="reserved column names"):
        PostgresWarehouse(database_url).ensure_tables([clash])


def _ensure_in_process(url: str, barrier: Any, out: Any) -> None:
    wh = PostgresWarehouse(url)
    barrier.wait()
    try:
        wh.ensure_tables(FLEET_DATASETS.values())
        out.put("ok")
    except WarehouseError as exc:
        out.put(f"failed: {exc}")


@pytest.mark.slow
def test_ensure_tables_from_two_processes_at_once(
    database_url: str, db: psycopg.Connection[Any]
) -> None:
    for _ in range(3):
        db.execute("DROP SCHEMA IF EXISTS curated CASCADE")
        barrier, out = _FORK.Barrier(2), _FORK.Queue()
        processes = [
            _FORK.Process(target=_ensure_in_process, args=(database_url, barrier, out))
            for _ in range(2)
        ]
        results = results_of(processes, out)
        assert results == ["ok", "ok"]
        tables = db.execute(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'curated'"
        ).fetchone()
        assert tables == (4,)


# -- commits -----------------------------------------------------------------------------


def test_commit_loads_three_datasets_typed_and_stamped(
    warehouse: PostgresWarehouse, db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    batch_id = uuid.uuid4()
    seen: list[tuple[str, int]] = []
    copies_before = warehouse.copies
    assert warehouse.slice_owner(ACME, SCOPE) is None
    result = warehouse.commit_slice(
        tenant_id=ACME,
        source_scope=SCOPE,
        batch_id=batch_id,
        datasets=fleet_loads(tmp_path, COUNTS),
        progress=lambda dataset, rows: seen.append((dataset, rows)),
    )
    assert result == SliceCommit(batch_id, COUNTS)
    assert warehouse.copies - copies_before == 3
    assert warehouse.slice_owner(ACME, SCOPE) == batch_id
    assert warehouse.slice_counts(ACME, SCOPE) == COUNTS
    for name, count in COUNTS.items():
        assert stamps(db, FLEET_DATASETS[name].target_table) == {(ACME, SCOPE, batch_id): count}
        assert max(rows for dataset, rows in seen if dataset == name) == count
    assert {k: v for k, v in registry(db, ACME, SCOPE).items()} == {
        name: (batch_id, count) for name, count in COUNTS.items()
    }
    # Values and types come back as written.
    trip = db.execute("SELECT * FROM curated.fleet_trips WHERE trip_id = 'trip_id-3'").fetchone()
    started = dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=3 * 1_000_001)
    assert trip[:9] == (
        "trip_id-3",
        "vehicle_id-3",
        None,
        started,
        None,
        None,
        None,
        None,
        "completed",  # allowed values cycle: row 3 has the first
    )
    vehicle = db.execute(
        "SELECT model_year, odometer_km, updated_at FROM curated.fleet_vehicles"
        " WHERE vehicle_id = 'vehicle_id-30'"
    ).fetchone()
    assert vehicle[:2] == (30, 15.0)
    committed_at = db.execute(
        "SELECT DISTINCT committed_at IS NOT NULL FROM curated.ingestion_slices"
    ).fetchall()
    assert committed_at == [(True,)]


def test_replacing_a_slice_swaps_every_row_and_the_registry(
    warehouse: PostgresWarehouse, db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    first = commit(warehouse, fleet_loads(tmp_path / "1", COUNTS, tag="old-"))
    second_counts = {"vehicles": 41, "trips": 700, "fuel_transactions": 1}
    second = commit(warehouse, fleet_loads(tmp_path / "2", second_counts, tag="new-"))
    assert second.row_counts == second_counts
    assert warehouse.slice_owner(ACME, SCOPE) == second.batch_id != first.batch_id
    assert warehouse.slice_counts(ACME, SCOPE) == second_counts
    for name, count in second_counts.items():
        table = FLEET_DATASETS[name].target_table
        assert stamps(db, table) == {(ACME, SCOPE, second.batch_id): count}
        key = FLEET_DATASETS[name].natural_key[0]
        old = db.execute(f"SELECT count(*) FROM {table} WHERE {key} LIKE 'old-%%'").fetchone()
        assert old == (0,)
    assert registry(db, ACME, SCOPE) == {n: (second.batch_id, c) for n, c in second_counts.items()}


def test_other_tenants_and_scopes_are_untouched(
    warehouse: PostgresWarehouse, db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    loads = fleet_loads(tmp_path, COUNTS)
    globex = commit(warehouse, loads, tenant=GLOBEX)
    other_scope = commit(warehouse, loads, scope=OTHER_SCOPE)
    commit(warehouse, loads)
    replaced = commit(warehouse, fleet_loads(tmp_path / "small", {"trips": 5}))
    trips = stamps(db, TRIPS.target_table)
    assert trips == {
        (GLOBEX, SCOPE, globex.batch_id): 1_000,
        (ACME, OTHER_SCOPE, other_scope.batch_id): 1_000,
        (ACME, SCOPE, replaced.batch_id): 5,
    }
    assert warehouse.slice_counts(GLOBEX, SCOPE) == COUNTS
    assert warehouse.slice_counts(ACME, OTHER_SCOPE) == COUNTS
    assert warehouse.slice_owner(GLOBEX, SCOPE) == globex.batch_id


def test_datasets_missing_from_the_new_batch_leave_the_slice(
    warehouse: PostgresWarehouse, db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    commit(warehouse, fleet_loads(tmp_path, COUNTS))
    only_trips = commit(warehouse, fleet_loads(tmp_path / "t", {"trips": 10}))
    assert warehouse.slice_counts(ACME, SCOPE) == {"trips": 10}
    assert registry(db, ACME, SCOPE) == {"trips": (only_trips.batch_id, 10)}
    assert stamps(db, VEHICLES.target_table) == {}
    assert stamps(db, FUEL_TRANSACTIONS.target_table) == {}


def test_a_dataset_without_files_is_an_empty_slice(
    warehouse: PostgresWarehouse, tmp_path: Path
) -> None:
    commit(warehouse, fleet_loads(tmp_path, COUNTS))
    copies = warehouse.copies
    result = commit(
        warehouse, [DatasetLoad(VEHICLES, ()), *fleet_loads(tmp_path / "t", {"trips": 3})]
    )
    assert result.row_counts == {"vehicles": 0, "trips": 3}
    assert warehouse.copies - copies == 1
    assert warehouse.slice_counts(ACME, SCOPE) == {"vehicles": 0, "trips": 3}


def test_one_copy_takes_files_as_they_arrive(
    warehouse: PostgresWarehouse, db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    """load_files pulls its files lazily, on the COPY's reader thread: the COPY is running
    on the server, fed from the first file, while the second does not exist yet; both go
    through that one COPY."""
    (first, second) = fleet_loads(tmp_path, {"trips": 3_000})[0].files
    second_wanted = threading.Event()
    second_ready = threading.Event()

    def arriving() -> Any:
        yield first
        second_wanted.set()
        assert second_ready.wait(30)
        yield second

    copies = warehouse.copies
    loaded: list[int] = []
    with warehouse.open_slice(
        tenant_id=ACME, source_scope=SCOPE, batch_id=uuid.uuid4(), contracts=[TRIPS]
    ) as writer:
        backend = writer._conn.info.backend_pid
        loading = threading.Thread(
            target=lambda: loaded.append(writer.load_files(TRIPS, arriving()))
        )
        loading.start()
        try:
            assert second_wanted.wait(30)
            deadline = time.monotonic() + 30
            while copy_bytes_received(db, backend) == 0:
                assert time.monotonic() < deadline, "no COPY running with the first file"
                time.sleep(0.01)
        finally:
            second_ready.set()
            loading.join(30)
        assert loaded == [3_000]
        writer.commit()
    assert warehouse.copies - copies == 1
    assert warehouse.slice_counts(ACME, SCOPE) == {"trips": 3_000}


def copy_bytes_received(db: psycopg.Connection[Any], backend: int) -> int:
    """Bytes a backend's running COPY has read so far (pg_stat_progress_copy, PG 14+; its
    tuple count lags the bytes on PostgreSQL 16)."""
    row = db.execute(
        "SELECT bytes_processed FROM pg_stat_progress_copy WHERE pid = %s", (backend,)
    ).fetchone()
    return 0 if row is None else int(row[0])


def test_a_dataset_that_moved_to_another_table_leaves_the_old_one(
    warehouse: PostgresWarehouse, db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    commit(warehouse, fleet_loads(tmp_path, {"trips": 10}))
    moved = DatasetContract(
        name="trips",
        file_glob="trips*",
        target_table="curated.fleet_trips_v2",
        natural_key=TRIPS.natural_key,
        columns=TRIPS.columns,
    )
    file = write_normalized(tmp_path / "v2.parquet", moved, 4)
    result = commit(warehouse, [DatasetLoad(moved, (file,))])
    assert stamps(db, TRIPS.target_table) == {}
    assert stamps(db, moved.target_table) == {(ACME, SCOPE, result.batch_id): 4}
    assert warehouse.slice_counts(ACME, SCOPE) == {"trips": 4}
    # A renamed dataset that writes to the table of one that left: its rows stay.
    renamed = DatasetContract(
        name="journeys",
        file_glob="journeys*",
        target_table=moved.target_table,
        natural_key=TRIPS.natural_key,
        columns=TRIPS.columns,
    )
    again = commit(warehouse, [DatasetLoad(renamed, (file,))])
    assert stamps(db, moved.target_table) == {(ACME, SCOPE, again.batch_id): 4}
    assert warehouse.slice_counts(ACME, SCOPE) == {"journeys": 4}


def test_excluded_lines_are_dropped(
    warehouse: PostgresWarehouse, db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    first = write_normalized(tmp_path / "trips_a.parquet", TRIPS, 100)
    second = write_normalized(tmp_path / "trips_b.parquet", TRIPS, 100, first=100)
    # Lines count per file: line 2 of the second file is trip 100.
    load = DatasetLoad(
        TRIPS,
        (LoadFile(first.path, frozenset({2, 50, 999})), LoadFile(second.path, frozenset({2}))),
    )
    result = commit(warehouse, [load])
    assert result.row_counts == {"trips": 197}
    gone = db.execute(
        "SELECT n FROM generate_series(0, 199) AS n"
        " EXCEPT SELECT substr(trip_id, 9)::int FROM curated.fleet_trips ORDER BY 1"
    ).fetchall()
    assert gone == [(0,), (48,), (100,)]
    assert registry(db, ACME, SCOPE)["trips"][1] == 197


@pytest.mark.parametrize("failing_dataset", ["trips", "fuel_transactions"])
def test_a_corrupt_file_rolls_back_and_keeps_the_old_slice(
    warehouse: PostgresWarehouse, db: psycopg.Connection[Any], tmp_path: Path, failing_dataset: str
) -> None:
    old = commit(warehouse, fleet_loads(tmp_path / "old", COUNTS))
    loads = fleet_loads(tmp_path / "new", {"vehicles": 5, "trips": 50, "fuel_transactions": 50})
    broken = next(load for load in loads if load.contract.name == failing_dataset)
    broken.files[1].path.write_bytes(b"PAR1 this is not parquet PAR1")
    with pytest.raises(WarehouseError, match="cannot load a normalized file") as caught:
        commit(warehouse, loads)
    assert caught.value.transient is False
    assert str(broken.files[1].path) in str(caught.value)
    assert warehouse.slice_owner(ACME, SCOPE) == old.batch_id
    assert warehouse.slice_counts(ACME, SCOPE) == COUNTS
    assert stamps(db, TRIPS.target_table) == {(ACME, SCOPE, old.batch_id): COUNTS["trips"]}


def test_a_rejected_row_is_a_terminal_warehouse_error(
    warehouse: PostgresWarehouse, tmp_path: Path
) -> None:
    old = commit(warehouse, fleet_loads(tmp_path, COUNTS))
    path = tmp_path / "null_key.parquet"
    table = pq.read_table(tmp_path / "trips_1.parquet")
    pq.write_table(table.set_column(0, "trip_id", pa.nulls(len(table), pa.string())), path)
    with pytest.raises(WarehouseError) as caught:
        commit(warehouse, [DatasetLoad(TRIPS, (LoadFile(path),))])
    assert caught.value.transient is False
    assert "NotNullViolation" in str(caught.value)
    assert caught.value.__cause__ is None and not isinstance(caught.value, psycopg.Error)
    assert warehouse.slice_owner(ACME, SCOPE) == old.batch_id


def test_an_unreachable_warehouse_is_transient() -> None:
    down = PostgresWarehouse("postgresql://postgres@127.0.0.1:1/nowhere?connect_timeout=2")
    with pytest.raises(WarehouseError) as caught:
        down.slice_owner(ACME, SCOPE)
    assert caught.value.transient is True


def test_commit_refuses_duplicate_or_no_datasets(warehouse: PostgresWarehouse) -> None:
    with pytest.raises(WarehouseError, match="at least one dataset"):
        commit(warehouse, [])
    with pytest.raises(WarehouseError, match="distinct"):
        commit(warehouse, [DatasetLoad(TRIPS, ()), DatasetLoad(TRIPS, ())])


def test_slice_owner_and_counts_before_any_table_exists(database_url: str) -> None:
    fresh = PostgresWarehouse(database_url)
    assert fresh.slice_owner(ACME, SCOPE) is None
    assert fresh.slice_counts(ACME, SCOPE) == {}


# -- concurrency -------------------------------------------------------------------------


def test_concurrent_commits_of_one_scope_take_turns(
    warehouse: PostgresWarehouse, db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    loads = {n: fleet_loads(tmp_path / str(n), {"trips": 20_000 + n}) for n in range(3)}
    results: dict[int, SliceCommit] = {}
    threads = [
        threading.Thread(target=lambda n=n: results.__setitem__(n, commit(warehouse, loads[n])))
        for n in loads
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 3
    [(stamp, count)] = stamps(db, TRIPS.target_table).items()
    winner = next(n for n, r in results.items() if r.batch_id == stamp[2])
    assert count == 20_000 + winner
    assert warehouse.slice_owner(ACME, SCOPE) == stamp[2]


@pytest.mark.slow
def test_readers_see_the_old_slice_or_the_new_one_never_a_mix(
    warehouse: PostgresWarehouse, database_url: str, tmp_path: Path
) -> None:
    """A reader polling on its own connection while the slice is replaced, several times,
    by large loads: every observation is one whole batch, never a mix, never empty."""
    rounds = 4
    loads = {
        k: [
            DatasetLoad(
                TRIPS,
                (
                    write_normalized(tmp_path / f"trips_{k}_a.parquet", TRIPS, 100_000 + k),
                    write_normalized(
                        tmp_path / f"trips_{k}_b.parquet", TRIPS, 100_000 + k, first=100_000 + k
                    ),
                ),
            )
        ]
        for k in range(rounds)
    }
    expected: dict[uuid.UUID, int] = {}
    first = commit(warehouse, loads[0])
    expected[first.batch_id] = 200_000
    observations: list[tuple[int, int, uuid.UUID | None]] = []
    done = threading.Event()
    reader_errors: list[BaseException] = []

    def read() -> None:
        try:
            with psycopg.connect(libpq_url(database_url), autocommit=True) as conn:
                while not done.is_set():
                    observations.append(
                        conn.execute(
                            "SELECT count(*), count(DISTINCT ingestion_batch_id),"
                            " min(ingestion_batch_id::text)::uuid FROM curated.fleet_trips"
                            " WHERE tenant_id = %s AND source_scope = %s",
                            (ACME, SCOPE),
                        ).fetchone()
                    )
        except BaseException as exc:  # reported by the test thread
            reader_errors.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for k in range(1, rounds):
            time.sleep(0.05)
            result = commit(warehouse, loads[k])
            expected[result.batch_id] = 2 * (100_000 + k)
        time.sleep(0.1)
    finally:
        done.set()
        reader.join()
    assert not reader_errors
    for count, distinct, batch in observations:
        assert distinct == 1 and batch in expected and count == expected[batch], (count, distinct)
    seen = {batch for _, _, batch in observations}
    assert len(seen) >= 2, "the reader never saw a replacement happen"
    assert len(observations) >= 3 * rounds


# -- a replace's full-page images (issues 30 and 53) -------------------------------------------


def _wal_compression(writer: Any) -> str:
    """The setting in the writer's own open transaction."""
    return str(writer._conn.execute("SHOW wal_compression").fetchone()[0])


def _offered(url: str) -> list[str]:
    """The wal_compression methods this server's build offers (the machine's PostgreSQL has
    lz4 and zstd, the pgserver wheel's pglz only)."""
    with psycopg.connect(libpq_url(url)) as conn:
        query = "SELECT enumvals FROM pg_settings WHERE name = 'wal_compression'"
        return list(conn.execute(query).fetchone()[0])


def _notes(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == postgres_writer.__name__]


@pytest.fixture
def unsaid(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Nothing said yet in this process (an earlier test may have said it), and what is said
    captured."""
    monkeypatch.setattr(postgres_writer, "_said", set())
    caplog.set_level(logging.WARNING, logger=postgres_writer.__name__)


@pytest.mark.usefixtures("unsaid")
def test_a_replace_compresses_its_full_page_images_a_first_load_does_not(
    warehouse: PostgresWarehouse, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The test server's role is a superuser, as the benchmark's is: each replace (which
    deletes the old slice) sets, for its own transaction, the best method the server's build
    offers, lz4 else zstd; on a build with neither (the embedded server's) it keeps the
    server's setting and says so once. A first load, and what comes after a replace's
    transaction, keep the server's setting."""
    offered = _offered(warehouse._conninfo)
    expected = "lz4" if "lz4" in offered else "zstd" if "zstd" in offered else "off"
    loads = fleet_loads(tmp_path, {"trips": 10})
    opened = {"tenant_id": ACME, "source_scope": SCOPE, "contracts": [TRIPS]}
    with warehouse.open_slice(batch_id=uuid.uuid4(), **opened) as first:
        assert _wal_compression(first) == "off"
        first.load_files(TRIPS, loads[0].files)
        first.commit()
    for _ in range(2):
        with warehouse.open_slice(batch_id=uuid.uuid4(), **opened) as replace:
            assert _wal_compression(replace) == expected, offered
            replace.load_files(TRIPS, loads[0].files)
            replace.commit()
    assert warehouse.slice_counts(ACME, SCOPE) == {"trips": 10}
    with psycopg.connect(libpq_url(warehouse._conninfo)) as conn:
        assert conn.execute("SHOW wal_compression").fetchone() == ("off",)
    notes = _notes(caplog)
    if expected == "lz4":
        assert notes == []
    elif expected == "zstd":
        assert len(notes) == 1 and notes[0].endswith("with zstd"), notes
    else:
        assert len(notes) == 1 and "offers no lz4 or zstd for wal_compression" in notes[0], notes


@pytest.mark.usefixtures("unsaid")
def test_a_role_that_may_not_set_wal_compression_replaces_as_before(
    database_url: str,
    db: psycopg.Connection[Any],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    PostgresWarehouse(database_url).ensure_tables([TRIPS])
    role = f"fleet_loader_{uuid.uuid4().hex[:8]}"
    db.execute(f"CREATE ROLE {role} LOGIN")
    db.execute(f"GRANT USAGE ON SCHEMA curated TO {role}")
    db.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA curated TO {role}")
    try:
        warehouse = PostgresWarehouse(with_user(database_url, role))
        warehouse._ensured.add((TRIPS.target_table, TRIPS.contract_version))
        commit(warehouse, fleet_loads(tmp_path / "1", {"trips": 10}))
        opened = {"tenant_id": ACME, "source_scope": SCOPE, "contracts": [TRIPS]}
        with warehouse.open_slice(batch_id=uuid.uuid4(), **opened) as replace:
            assert replace._conn.execute("SELECT current_user").fetchone() == (role,)
            assert _wal_compression(replace) == "off"
            replace.load_files(TRIPS, fleet_loads(tmp_path / "2", {"trips": 4})[0].files)
            replaced = replace.commit()
        assert warehouse.slice_owner(ACME, SCOPE) == replaced.batch_id
        assert warehouse.slice_counts(ACME, SCOPE) == {"trips": 4}
        # Why, once: the grant where the build has a method, else the build.
        offered = _offered(database_url)
        reason = (
            "this role may not set wal_compression"
            if {"lz4", "zstd"} & set(offered)
            else "offers no lz4 or zstd"
        )
        notes = _notes(caplog)
        assert len(notes) == 1 and reason in notes[0], notes
    finally:
        db.execute(f"REVOKE ALL ON ALL TABLES IN SCHEMA curated FROM {role}")
        db.execute(f"REVOKE USAGE ON SCHEMA curated FROM {role}")
        db.execute(f"DROP ROLE {role}")


_FULL_BUILD = ["pglz", "lz4", "zstd", "on", "off"]  # Debian's and most packagers'
_PGLZ_BUILD = ["pglz", "on", "off"]  # the pgserver wheel's: pglz costs more than it saves


@pytest.mark.parametrize(
    ("setting", "offered", "may_set", "method", "note"),
    [
        ("off", _FULL_BUILD, True, "lz4", None),
        # A build with zstd only: the next best, said.
        ("off", ["pglz", "zstd", "on", "off"], True, "zstd", "full-page images with zstd"),
        ("off", _PGLZ_BUILD, True, None, "offers no lz4 or zstd for wal_compression (only pglz,"),
        # A role not granted SET ON PARAMETER wal_compression.
        ("off", _FULL_BUILD, False, None, "GRANT SET ON PARAMETER wal_compression"),
        # The server compresses already: nothing to set, nothing to say.
        ("lz4", _FULL_BUILD, True, None, None),
        ("pglz", _PGLZ_BUILD, True, None, None),
    ],
)
def test_a_replace_asks_the_servers_build_for_its_full_page_compression(
    setting: str, offered: list[str], may_set: bool, method: str | None, note: str | None
) -> None:
    chosen = postgres_writer.full_page_compression(setting, offered, may_set)
    assert chosen.method == method
    if note is None:
        assert chosen.note is None
    else:
        assert chosen.note is not None and note in chosen.note, chosen.note


@given(
    setting=st.sampled_from(["off", "on", "pglz", "lz4", "zstd"]),
    offered=st.sets(st.sampled_from(["pglz", "lz4", "zstd"])).map(lambda m: [*m, "on", "off"]),
    may_set=st.booleans(),
)
def test_a_replace_never_takes_a_method_the_build_lacks_and_says_why_it_took_less(
    setting: str, offered: list[str], may_set: bool
) -> None:
    chosen = postgres_writer.full_page_compression(setting, offered, may_set)
    best = "lz4" if "lz4" in offered else "zstd" if "zstd" in offered else None
    # Set only where the server compresses nothing and the role may: the best it offers.
    assert chosen.method == (best if setting == "off" and may_set else None)
    # Less than lz4 where the server does not compress already: always said.
    assert (chosen.note is not None) == (setting == "off" and chosen.method != "lz4")


def test_a_note_on_full_page_compression_is_said_once_per_server(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(postgres_writer, "_said", set())
    caplog.set_level(logging.WARNING, logger=postgres_writer.__name__)
    for server in ("db1:5432", "db1:5432", "db2:5432", "db1:5432"):
        postgres_writer._say_once(server, "no lz4")
    assert _notes(caplog) == [
        "PostgreSQL warehouse at db1:5432: no lz4",
        "PostgreSQL warehouse at db2:5432: no lz4",
    ]
