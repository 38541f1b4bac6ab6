"""`tables migrate` (issue 25, part 4): a curated table made by an earlier contract (money as
double precision) brought to the decimal contract, on PostgreSQL (in place, ALTER COLUMN ...
TYPE ... USING) and on the Redshift emulator (a deep copy, swapped by rename), with the slice
row-exact and stamped after; values that do not cast refused with nothing changed; a kill
between the copy and the swap leaving the old table serving readers, and a rerun finishing.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest

from fleet_import.contracts.fleet import FUEL_TRANSACTIONS
from fleet_import.contracts.model import DatasetContract
from fleet_import.failpoints import _EXIT_CODE
from fleet_import.importing.claim import claim
from fleet_import.scope import source_scope
from fleet_import.warehouse.base import DatasetLoad, Warehouse
from fleet_import.warehouse.migration import (
    BEFORE_SWAP_FAILPOINT,
    Migrated,
    apply_plan,
    migration_for,
    plan_tables,
)
from fleet_import.warehouse.postgres.warehouse import PostgresWarehouse
from fleet_import.warehouse.redshift.warehouse import RedshiftWarehouse
from fleet_import.warehouse.shape import MigrationRefused, TableMigrationNeeded
from tests.redshift_emulator import RedshiftEmulator
from tests.warehouse_helpers import (
    ACME,
    FLOAT_FUEL,
    SCOPE,
    commit,
    registry,
    stamps,
    write_normalized,
)

ROLE = "arn:aws:iam::123456789012:role/fleet-redshift-copy"
TABLE = FUEL_TRANSACTIONS.target_table
ROWS = 120
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def emulator(database_url: str, s3: Any) -> Iterator[RedshiftEmulator]:
    with RedshiftEmulator(database_url, s3) as emu:  # provisioned only: the DDL is the same
        yield emu


@pytest.fixture(params=["postgres", "redshift"])
def backend(request: pytest.FixtureRequest, database_url: str) -> str:
    return str(request.param)


def _warehouse(backend: str, request: pytest.FixtureRequest) -> Warehouse:
    database_url = request.getfixturevalue("database_url")
    if backend == "postgres":
        return PostgresWarehouse(database_url)
    emulator = request.getfixturevalue("emulator")
    staging_bucket = request.getfixturevalue("staging_bucket")
    return RedshiftWarehouse(
        emulator.connect_kwargs(password="pw"),
        s3=request.getfixturevalue("s3"),
        staging_uri=f"s3://{staging_bucket}/redshift/",
        iam_role=ROLE,
        retry_delays=(0.0, 0.0, 0.0),
    )


def _float_slice(wh: Warehouse, tmp_path: Path) -> uuid.UUID:
    """A slice loaded by the float contract; returns its batch."""
    wh.ensure_tables([FLOAT_FUEL])
    load = DatasetLoad(FLOAT_FUEL, (write_normalized(tmp_path / "fuel.parquet", FLOAT_FUEL, ROWS),))
    return commit(wh, [load]).batch_id


def _money(db: psycopg.Connection[Any]) -> dict[str, tuple[Any, Any]]:
    rows = db.execute(
        f"SELECT transaction_id, total_amount, price_per_litre FROM {TABLE}"
    ).fetchall()
    return {key: (total, price) for key, total, price in rows}


def _types(db: psycopg.Connection[Any]) -> dict[str, str]:
    rows = db.execute(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a"
        f" WHERE a.attrelid = '{TABLE}'::regclass AND a.attnum > 0 AND NOT a.attisdropped"
    ).fetchall()
    return dict(rows)


def _stamps(db: psycopg.Connection[Any]) -> dict[tuple[str, str, str], int]:
    return {(t, s, str(b)): n for (t, s, b), n in stamps(db, TABLE).items()}


def _exact(value: Any) -> Decimal | None:
    return None if value is None else Decimal(repr(value))


def test_a_float_money_column_holding_data_becomes_decimal_row_exact_and_stamped(
    backend: str, request: pytest.FixtureRequest, db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    wh = _warehouse(backend, request)
    batch = _float_slice(wh, tmp_path)
    before, stamped, registered = _money(db), _stamps(db), registry(db, ACME, SCOPE)
    assert _types(db)["total_amount"] == "double precision"
    migration = migration_for(wh)

    (plan,) = plan_tables(migration, [FUEL_TRANSACTIONS])
    how = "in place" if backend == "postgres" else "deep copy"
    assert plan.state == "differs" and plan.method == how
    assert [(c.column, c.how) for c in plan.changes] == [
        ("price_per_litre", how),
        ("total_amount", how),
    ]
    assert plan.changes[1].wants.startswith("numeric(12,2)")

    done = apply_plan(migration, FUEL_TRANSACTIONS)
    assert isinstance(done, Migrated) and done.rows == ROWS
    assert _types(db)["total_amount"] == "numeric(12,2)"
    assert _types(db)["price_per_litre"] == "numeric(10,4)"
    after = _money(db)
    assert after.keys() == before.keys() and len(after) == ROWS
    assert after == {key: tuple(map(_exact, money)) for key, money in before.items()}
    assert _stamps(db) == stamped == {(ACME, SCOPE, str(batch)): ROWS}
    assert registry(db, ACME, SCOPE) == registered
    # The table now matches: a new warehouse accepts it and loads the decimal contract.
    assert plan_tables(migration, [FUEL_TRANSACTIONS])[0].state == "matches"
    fresh = _warehouse(backend, request)
    fresh.check_tables(ACME, [FUEL_TRANSACTIONS])
    load = DatasetLoad(
        FUEL_TRANSACTIONS,
        (write_normalized(tmp_path / "fuel2.parquet", FUEL_TRANSACTIONS, ROWS, tag="b"),),
    )
    assert commit(fresh, [load]).row_counts == {"fuel_transactions": ROWS}


def test_values_that_do_not_cast_are_refused_naming_them_with_nothing_changed(
    backend: str, request: pytest.FixtureRequest, db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    wh = _warehouse(backend, request)
    batch = _float_slice(wh, tmp_path)
    keys = sorted(_money(db))[:2]
    db.execute(
        f"UPDATE {TABLE} SET total_amount = CASE transaction_id WHEN %s THEN 1e11 ELSE -2e10 END"
        " WHERE transaction_id IN (%s, %s)",
        (keys[0], *keys),
    )
    before = _money(db)

    with pytest.raises(MigrationRefused) as refused:
        apply_plan(migration_for(wh), FUEL_TRANSACTIONS)
    (problem,) = refused.value.uncastable
    assert (problem.table, problem.column, problem.count) == (TABLE, "total_amount", 2)
    assert problem.wants == "numeric(12,2)"
    assert {float(e["value"]) for e in problem.examples} == {1e11, -2e10}
    assert {
        (e["tenant_id"], e["source_scope"], e["ingestion_batch_id"]) for e in problem.examples
    } == {(ACME, SCOPE, str(batch))}
    assert "total_amount: 2 value(s) do not fit numeric(12,2)" in str(refused.value)
    assert _types(db)["total_amount"] == "double precision"
    assert _money(db) == before
    assert db.execute(
        "SELECT count(*) FROM pg_class WHERE relname LIKE '%%__migrating'"
    ).fetchone() == (0,)


def test_a_table_of_another_shape_fails_the_import_before_any_batch(
    import_ctx: Any, database_url: str, db: psycopg.Connection[Any], acme: Any
) -> None:
    db.execute(f"ALTER TABLE {TABLE} ALTER COLUMN total_amount TYPE double precision")
    ctx = dataclasses.replace(import_ctx, warehouse=PostgresWarehouse(database_url))
    scope = source_scope("s3://fleet-landing/acme/fleet/2026-07-22/")
    with pytest.raises(TableMigrationNeeded) as needed:
        claim(ctx, acme, scope, "d1", "owner-1")
    message = str(needed.value)
    assert "does not match dataset 'fuel_transactions'" in message
    assert "fleet-import tables migrate --tenant acme --apply" in message
    assert db.execute("SELECT count(*) FROM ingestion_batches").fetchone() == (0,)


def _cli_env(backend: str, request: pytest.FixtureRequest, **extra: str) -> dict[str, str]:
    database_url = request.getfixturevalue("database_url")
    env = {**os.environ, "FLEET_DATABASE_URL": database_url, "PYTHONPATH": str(REPO), **extra}
    env.pop("FLEET_WAREHOUSE_URL", None)
    if backend == "redshift":
        emulator = request.getfixturevalue("emulator")
        env.update(
            FLEET_WAREHOUSE="redshift",
            FLEET_REDSHIFT_HOST="127.0.0.1",
            FLEET_REDSHIFT_PORT=str(emulator.port),
            FLEET_REDSHIFT_DATABASE=emulator.database,
            FLEET_REDSHIFT_USER=emulator.user,
            FLEET_REDSHIFT_PASSWORD="pw",
            FLEET_REDSHIFT_SSL="false",
            FLEET_REDSHIFT_IAM_ROLE=ROLE,
            FLEET_REDSHIFT_STAGING_URI=f"s3://{request.getfixturevalue('staging_bucket')}/rs/",
            FLEET_S3_ENDPOINT_URL=request.getfixturevalue("moto_endpoint"),
        )
    return env


def _migrate_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleet_cli", "tables", "migrate", "--json", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


@pytest.mark.slow
def test_a_migrate_killed_before_the_swap_leaves_the_old_table_and_a_rerun_completes(
    backend: str, request: pytest.FixtureRequest, db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    wh = _warehouse(backend, request)
    batch = _float_slice(wh, tmp_path)
    before = _money(db)
    env = _cli_env(backend, request)

    planned = _migrate_cli(env)
    assert planned.returncode == 3, planned.stderr
    tables = {t["dataset"]: t for t in json.loads(planned.stdout)["tables"]}
    assert tables["fuel_transactions"]["state"] == "differs"
    assert tables["trips"]["state"] == "missing"

    killed = _migrate_cli({**env, "FLEET_FAILPOINTS": BEFORE_SWAP_FAILPOINT}, "--apply")
    assert killed.returncode == _EXIT_CODE, killed.stderr
    # Readers still see the old table, whole: its type, its rows, its stamps.
    assert _types(db)["total_amount"] == "double precision"
    assert _money(db) == before
    assert _stamps(db) == {(ACME, SCOPE, str(batch)): ROWS}

    rerun = _migrate_cli(env, "--apply")
    assert rerun.returncode == 0, rerun.stderr
    (fuel,) = [t for t in json.loads(rerun.stdout)["tables"] if t["dataset"] == "fuel_transactions"]
    assert fuel["applied"] is True and fuel["rows"] == ROWS
    assert _types(db)["total_amount"] == "numeric(12,2)"
    assert _money(db) == {key: tuple(map(_exact, money)) for key, money in before.items()}
    assert _stamps(db) == {(ACME, SCOPE, str(batch)): ROWS}
    again = _migrate_cli(env)
    assert again.returncode == 0, again.stderr


def test_a_contract_that_drops_a_column_is_refused_in_the_plan(
    database_url: str, db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    wh = PostgresWarehouse(database_url)
    _float_slice(wh, tmp_path)
    fewer: DatasetContract = FLOAT_FUEL.model_copy(
        update={"columns": tuple(c for c in FLOAT_FUEL.columns if c.name != "odometer_km")}
    )
    (plan,) = plan_tables(migration_for(wh), [fewer])
    assert plan.method == "refused"
    assert [(c.column, c.how) for c in plan.changes] == [("odometer_km", "refused")]
    with pytest.raises(MigrationRefused, match="its values would be lost"):
        apply_plan(migration_for(wh), fewer)


def test_migrate_waits_for_a_slice_transaction_writing_the_table_and_keeps_its_rows(
    database_url: str, db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    """The lock: a slice transaction still open on the table (PostgreSQL holds ROW EXCLUSIVE
    from its first write to its COMMIT) makes migrate wait; its rows are migrated too."""
    wh = PostgresWarehouse(database_url)
    first = _float_slice(wh, tmp_path)
    other_scope = "fleet_s3:s3://fleet-landing/acme/fleet/2026-07-23/"
    writer = wh.open_slice(
        tenant_id=ACME, source_scope=other_scope, batch_id=uuid.uuid4(), contracts=[FLOAT_FUEL]
    )
    writer.load_files(
        FLOAT_FUEL, [write_normalized(tmp_path / "other.parquet", FLOAT_FUEL, ROWS, tag="o")]
    )
    outcome: list[Any] = []
    migrating = threading.Thread(
        target=lambda: outcome.append(apply_plan(migration_for(wh), FUEL_TRANSACTIONS))
    )
    migrating.start()
    deadline = time.monotonic() + 10
    waiting = False
    while time.monotonic() < deadline and not waiting:
        waiting = db.execute(
            "SELECT count(*) FROM pg_locks WHERE NOT granted AND mode = 'AccessExclusiveLock'"
            f" AND relation = '{TABLE}'::regclass"
        ).fetchone() == (1,)
        time.sleep(0.05)
    assert waiting and migrating.is_alive()
    second = writer.commit().batch_id
    migrating.join(timeout=30)
    (done,) = outcome
    assert isinstance(done, Migrated) and done.rows == 2 * ROWS
    assert _types(db)["total_amount"] == "numeric(12,2)"
    assert _stamps(db) == {
        (ACME, SCOPE, str(first)): ROWS,
        (ACME, other_scope, str(second)): ROWS,
    }


NARROW_VEHICLE = FUEL_TRANSACTIONS.model_copy(
    update={
        "version": "0",
        "columns": tuple(
            column.model_copy(update={"max_length": 2}) if column.name == "vehicle_id" else column
            for column in FUEL_TRANSACTIONS.columns
        ),
    }
)
"""vehicle_id as VARCHAR(8) on Redshift (2 characters, 4 bytes each)."""


def _redshift(emulator: RedshiftEmulator, s3: Any, staging_bucket: str) -> RedshiftWarehouse:
    return RedshiftWarehouse(
        emulator.connect_kwargs(password="pw"),
        s3=s3,
        staging_uri=f"s3://{staging_bucket}/redshift/",
        iam_role=ROLE,
        retry_delays=(0.0, 0.0, 0.0),
    )


def _width(db: psycopg.Connection[Any]) -> int:
    return db.execute(
        "SELECT character_maximum_length FROM information_schema.columns"
        " WHERE table_name = 'fleet_fuel_transactions' AND column_name = 'vehicle_id'"
    ).fetchone()[0]


def test_redshift_widens_a_varchar_in_place_and_refuses_values_a_narrower_one_cannot_hold(
    emulator: RedshiftEmulator,
    s3: Any,
    staging_bucket: str,
    db: psycopg.Connection[Any],
    tmp_path: Path,
) -> None:
    wh = _redshift(emulator, s3, staging_bucket)
    wh.ensure_tables([NARROW_VEHICLE])
    load = DatasetLoad(
        NARROW_VEHICLE, (write_normalized(tmp_path / "n.parquet", NARROW_VEHICLE, ROWS),)
    )
    commit(wh, [load])
    migration = migration_for(wh)
    (plan,) = plan_tables(migration, [FUEL_TRANSACTIONS])
    assert plan.method == "in place"
    assert [(c.column, c.has, c.wants) for c in plan.changes] == [
        ("vehicle_id", "character varying(8)", "character varying(256)")
    ]
    done = apply_plan(migration, FUEL_TRANSACTIONS)
    assert isinstance(done, Migrated) and done.rows == ROWS and _width(db) == 256

    # Back to 8 bytes: the values written since (`vehicle_id-N`) no longer fit.
    load = DatasetLoad(
        FUEL_TRANSACTIONS, (write_normalized(tmp_path / "w.parquet", FUEL_TRANSACTIONS, ROWS),)
    )
    commit(_redshift(emulator, s3, staging_bucket), [load])
    (narrowing,) = plan_tables(migration, [NARROW_VEHICLE])
    assert narrowing.method == "deep copy"
    with pytest.raises(MigrationRefused) as refused:
        apply_plan(migration, NARROW_VEHICLE)
    (problem,) = refused.value.uncastable
    assert (problem.column, problem.count, problem.wants) == (
        "vehicle_id",
        ROWS,
        "character varying(8)",
    )
    assert _width(db) == 256
