"""Decimals through both warehouses, exactly: CSV, JSON lines and Parquet normalized, then
loaded by PostgreSQL's COPY BINARY (numeric wire format) and by the Redshift path (staged
Parquet, COPY into DECIMAL on the emulator); the extremes of decimal(38,9) survive."""

from __future__ import annotations

import io
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fleet_import.contracts.fleet import FUEL_TRANSACTIONS
from fleet_import.contracts.model import Column, DatasetContract
from fleet_import.errors import WarehouseError
from fleet_import.normalize.file import normalize_file
from fleet_import.warehouse.base import DatasetLoad, LoadFile, Warehouse
from fleet_import.warehouse.postgres.binary_copy import SIGNATURE, TRAILER, CopyEncoder
from fleet_import.warehouse.postgres.warehouse import PostgresWarehouse
from fleet_import.warehouse.redshift import ddl as redshift_ddl
from fleet_import.warehouse.redshift.warehouse import RedshiftWarehouse
from tests.redshift_emulator import RedshiftEmulator
from tests.redshift_grants import create_loader
from tests.warehouse_helpers import commit

LARGEST = Decimal("9" * 29 + "." + "9" * 9)
SMALLEST = Decimal("-" + "9" * 29 + "." + "9" * 9)
VALUES = [
    LARGEST,
    SMALLEST,
    Decimal("0.000000001"),
    Decimal("-0.000000001"),
    Decimal("0E-9"),
    Decimal("12345678901234567890.123456789"),
    Decimal("-10000.000000000"),
    None,
]
LEDGER = DatasetContract(
    name="ledger",
    file_glob="ledger*",
    target_table="curated.ledger",
    natural_key=("id",),
    columns=(
        Column("id", "string", nullable=False),
        Column("amount", "decimal(38,9)"),
        Column("fee", "decimal(5,5)"),  # all fraction: weight below zero
        Column("units", "decimal(4,0)", nullable=False),
    ),
)
FEES = [Decimal("0.12345"), Decimal("-0.00001"), Decimal("0.99999"), Decimal("0.00000")]
UNITS = [Decimal(9999), Decimal(-9999), Decimal(0), Decimal(1)]


def _row(index: int) -> dict[str, Any]:
    return {
        "id": f"L{index}",
        "amount": VALUES[index % len(VALUES)],
        "fee": FEES[index % len(FEES)],
        "units": UNITS[index % len(UNITS)],
    }


ROWS = [_row(index) for index in range(3 * len(VALUES))]


def _sources() -> dict[str, bytes]:
    """The same rows as CSV, JSON lines and Parquet."""
    csv_text = "id,amount,fee,units\n" + "".join(
        ",".join("" if value is None else str(value) for value in row.values()) + "\n"
        for row in ROWS[: len(VALUES)]
    )
    jsonl = "".join(  # bare JSON numbers, as written: no float in between
        f'{{"id": "{row["id"]}", "amount": {"null" if row["amount"] is None else row["amount"]}'
        f', "fee": {row["fee"]}, "units": {row["units"]}}}\n'
        for row in ROWS[len(VALUES) : 2 * len(VALUES)]
    )
    parquet = io.BytesIO()
    pq.write_table(
        pa.Table.from_pylist(ROWS[2 * len(VALUES) :], schema=LEDGER.arrow_schema), parquet
    )
    return {
        "ledger-1.csv": csv_text.encode(),
        "ledger-2.jsonl": jsonl.encode(),
        "ledger-3.parquet": parquet.getvalue(),
    }


def _normalized(tmp_path: Path) -> DatasetLoad:
    files = []
    for name, body in _sources().items():
        source = tmp_path / name
        source.write_bytes(body)
        result = normalize_file(
            source,
            source_key=name,
            fmt=name.rsplit(".", 1)[1],  # type: ignore[arg-type]
            contract=LEDGER,
            out_path=tmp_path / f"{name}.normalized.parquet",
        )
        assert result.rejects == [], result.rejects
        files.append(LoadFile(result.parquet_path))
    return DatasetLoad(LEDGER, tuple(files))


def _loaded(db: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return db.execute("SELECT id, amount, fee, units FROM curated.ledger ORDER BY id").fetchall()


def _check(wh: Warehouse, db: psycopg.Connection[Any], tmp_path: Path) -> None:
    wh.ensure_tables([LEDGER])
    load = _normalized(tmp_path)
    outcome = commit(wh, [load])
    assert outcome.row_counts == {"ledger": len(ROWS)}
    loaded = {row[0]: row for row in _loaded(db)}
    assert sorted(loaded) == sorted(row["id"] for row in ROWS)
    for row in ROWS:
        assert loaded[row["id"]][1:] == tuple(row.values())[1:], row["id"]
    assert loaded["L0"][1] == LARGEST and loaded["L1"][1] == SMALLEST


def test_postgres_loads_decimals_exactly_through_copy_binary(
    database_url: str, db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    _check(PostgresWarehouse(database_url), db, tmp_path)
    types = dict(
        db.execute(
            "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a"
            " WHERE a.attrelid = 'curated.ledger'::regclass AND a.attnum > 0"
        ).fetchall()
    )
    assert types["amount"] == "numeric(38,9)" and types["fee"] == "numeric(5,5)"


@pytest.fixture
def emulator(database_url: str, s3: Any) -> Iterator[RedshiftEmulator]:
    """One setup (decimals do not depend on it), as the least-privilege user."""
    with RedshiftEmulator(database_url, s3, user=create_loader(database_url)) as emu:
        yield emu
    assert not emu.refusals, emu.refusals


def test_redshift_stages_decimals_in_parquet_and_copies_them_exactly(
    emulator: RedshiftEmulator,
    s3: Any,
    staging_bucket: str,
    db: psycopg.Connection[Any],
    tmp_path: Path,
) -> None:
    redshift = RedshiftWarehouse(
        emulator.connect_kwargs(password="pw"),
        s3=s3,
        staging_uri=f"s3://{staging_bucket}/redshift/",
        iam_role="arn:aws:iam::123456789012:role/fleet-redshift-copy",
        retry_delays=(0.0, 0.0, 0.0),
    )
    _check(redshift, db, tmp_path)
    # The table found again matches: information_schema's numeric spelled with its digits.
    RedshiftWarehouse(
        emulator.connect_kwargs(password="pw"),
        s3=s3,
        staging_uri=f"s3://{staging_bucket}/redshift/",
        iam_role="arn:aws:iam::123456789012:role/fleet-redshift-copy",
    ).ensure_tables([LEDGER])
    columns = db.execute(
        "SELECT column_name, data_type, numeric_precision, numeric_scale"
        " FROM information_schema.columns WHERE table_schema = 'curated'"
        " AND table_name = 'ledger' AND data_type = 'numeric' ORDER BY ordinal_position"
    ).fetchall()
    assert columns == [
        ("amount", "numeric", 38, 9),
        ("fee", "numeric", 5, 5),
        ("units", "numeric", 4, 0),
    ]


def test_copy_binary_encodes_sliced_and_null_decimals(
    db: psycopg.Connection[Any],
) -> None:
    """Arrow slices (an offset into the buffer) and nulls among values, straight to COPY."""
    values = pa.array([Decimal("-1.5"), None, *VALUES], pa.decimal128(38, 9)).slice(1)
    db.execute("CREATE TABLE sliced (v numeric(38,9))")
    encoder = CopyEncoder(pa.schema([("v", values.type)]))
    batch = pa.RecordBatch.from_arrays([values], names=["v"])
    with db.cursor().copy("COPY sliced FROM STDIN (FORMAT BINARY)") as copy:
        copy.write(SIGNATURE + encoder.encode(batch).tobytes() + TRAILER)
    assert [row[0] for row in db.execute("SELECT v FROM sliced").fetchall()] == [None, *VALUES]


def test_fleet_money_columns_are_decimals_in_a_new_contract_version() -> None:
    types = {column.name: column.type for column in FUEL_TRANSACTIONS.columns}
    assert types["total_amount"] == "decimal(12,2)"
    assert types["price_per_litre"] == "decimal(10,4)"
    assert FUEL_TRANSACTIONS.contract_version.startswith("2-")
    assert types["litres"] == "float64"  # a quantity, not money


def test_a_float_money_table_stops_the_load_naming_both_shapes(
    database_url: str, db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    """A curated table made by the float64 contract is not silently reused: migrate it."""
    float_money = FUEL_TRANSACTIONS.model_copy(
        update={
            "columns": tuple(
                column.model_copy(update={"type": "float64"})
                if column.name in ("total_amount", "price_per_litre")
                else column
                for column in FUEL_TRANSACTIONS.columns
            )
        }
    )
    PostgresWarehouse(database_url).ensure_tables([float_money])
    with pytest.raises(WarehouseError) as refused:
        PostgresWarehouse(database_url).ensure_tables([FUEL_TRANSACTIONS])
    message = str(refused.value)
    assert "does not match dataset 'fuel_transactions'" in message
    assert "('total_amount', 'double precision', True)" in message
    assert "('total_amount', 'numeric(12,2)', True)" in message


def test_redshift_ddl_types_decimals_and_refuses_a_float_money_table() -> None:
    create = redshift_ddl.create_table_sql(FUEL_TRANSACTIONS)
    assert '"total_amount" DECIMAL(12,2) NOT NULL' in create
    assert '"price_per_litre" DECIMAL(10,4)' in create
    expected = redshift_ddl.expected_columns(FUEL_TRANSACTIONS)
    assert ("total_amount", "numeric(12,2)", None) in expected
    assert redshift_ddl.widen_sql(FUEL_TRANSACTIONS, expected) == []
    floats = [
        (name, "double precision", None) if kind.startswith("numeric") else (name, kind, width)
        for name, kind, width in expected
    ]
    with pytest.raises(WarehouseError, match="total_amount double precision"):
        redshift_ddl.widen_sql(FUEL_TRANSACTIONS, floats)
    narrower = [
        (name, "numeric(10,2)", None) if name == "total_amount" else (name, kind, width)
        for name, kind, width in expected
    ]
    with pytest.raises(WarehouseError, match=r"total_amount numeric\(10,2\)"):
        redshift_ddl.widen_sql(FUEL_TRANSACTIONS, narrower)
