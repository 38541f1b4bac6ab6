"""Warehouse test data: normalized files as normalize.py writes them, loads built from them,
slice commits, and readers of the stamps and the slice registry a commit leaves.

Shared by the PostgreSQL and the Redshift warehouse tests, so it lives outside both."""

from __future__ import annotations

import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from fleet_import.contracts.fleet import FLEET_DATASETS
from fleet_import.contracts.model import Column, DatasetContract
from fleet_import.warehouse.base import DatasetLoad, LoadFile, SliceCommit, Warehouse

WAREHOUSE_BACKENDS = ("postgres", pytest.param("redshift", marks=pytest.mark.slow))
"""`@pytest.mark.parametrize("warehouse", WAREHOUSE_BACKENDS, indirect=True)`: the test on
PostgreSQL and on Redshift through the emulator (tests/conftest.py's `warehouse`; the
import_ctx built on it follows). Through the emulator a test takes several seconds."""
REDSHIFT_IN_E2E = ("postgres", pytest.param("redshift", marks=[pytest.mark.slow, pytest.mark.e2e]))
"""WAREHOUSE_BACKENDS for a whole-flow scenario (several flow runs, 15-25 s on Redshift):
make test runs it on PostgreSQL, make test-e2e on Redshift through the emulator too. What
differs on Redshift below the flows has its own tests in make test (tests/warehouse/)."""


ACME = "acme"
SCOPE = "fleet_s3:s3://fleet-landing/acme/fleet/2026-07-22/"
_BASE_US = 1_767_225_600_000_000  # 2026-01-01T00:00:00Z
_BASE_DAY = 20_454  # 2026-01-01


def column_values(column: Column, rows: int, first: int, tag: str) -> pa.Array:
    """Deterministic values of the column's type; nullable columns get a NULL every 7th row."""
    numbers = np.arange(first, first + rows, dtype=np.int64)
    match column.type:
        case _ if column.decimal is not None:  # n hundredths, exact in every decimal(p,s>=2)
            values = pa.array(
                [Decimal(int(n)).scaleb(-min(2, column.decimal[1])) for n in numbers],
                column.arrow_type,
            )
        case "string" if column.allowed:  # a contract's allowed value: it fits the column
            values = pa.array([column.allowed[n % len(column.allowed)] for n in numbers])
        case "string":
            values: pa.Array = pc.binary_join_element_wise(
                f"{tag}{column.name}-", pa.array(numbers).cast(pa.string()), ""
            )
            if column.max_length is not None:  # what a normalized file may hold
                values = pc.utf8_slice_codeunits(values, 0, column.max_length)
        case "int64":
            values = pa.array(numbers)
        case "float64":
            values = pa.array(numbers * 0.5)
        case "bool":
            values = pa.array(numbers % 2 == 0)
        case "timestamptz":
            values = pa.array(_BASE_US + numbers * 1_000_001, pa.timestamp("us", tz="UTC"))
        case "date":
            values = pa.array((_BASE_DAY + numbers % 1_000).astype(np.int32), pa.date32())
    if column.nullable:
        values = pc.if_else(pa.array(numbers % 7 == 3), pa.nulls(rows, values.type), values)
    return values


def write_normalized(
    path: Path, contract: DatasetContract, rows: int, *, first: int = 0, tag: str = ""
) -> LoadFile:
    """A file as normalize.py writes it: the contract's columns, then `_source_line` (the
    row's line in its own source file: 2 for the first row after the header)."""
    arrays = [column_values(c, rows, first, tag) for c in contract.columns]
    lines = pa.array(np.arange(2, rows + 2, dtype=np.int64))
    schema = contract.arrow_schema.append(pa.field("_source_line", pa.int64(), nullable=False))
    pq.write_table(pa.Table.from_arrays([*arrays, lines], schema=schema), path)
    return LoadFile(path)


def fleet_loads(folder: Path, counts: dict[str, int], tag: str = "") -> list[DatasetLoad]:
    """One load per dataset in `counts`, split over two files each."""
    folder.mkdir(parents=True, exist_ok=True)
    loads = []
    for name, total in counts.items():
        contract = FLEET_DATASETS[name]
        half = total // 2
        files = (
            write_normalized(folder / f"{name}_1.parquet", contract, half, tag=tag),
            write_normalized(
                folder / f"{name}_2.parquet", contract, total - half, first=half, tag=tag
            ),
        )
        loads.append(DatasetLoad(contract, files))
    return loads


FLOAT_FUEL = FLEET_DATASETS["fuel_transactions"].model_copy(
    update={
        "version": "1",
        "columns": tuple(
            column.model_copy(update={"type": "float64"})
            if column.name in ("total_amount", "price_per_litre")
            else column
            for column in FLEET_DATASETS["fuel_transactions"].columns
        ),
    }
)
"""fuel_transactions as contract version 1 had it: money as float64 (tables migrate tests)."""

COUNTS = {"vehicles": 40, "trips": 1_000, "fuel_transactions": 300}


def stamps(db: psycopg.Connection[Any], table: str) -> dict[tuple[Any, ...], int]:
    rows = db.execute(
        f"SELECT tenant_id, source_scope, ingestion_batch_id, count(*) FROM {table}"
        " GROUP BY 1, 2, 3"
    ).fetchall()
    return {(t, s, b): n for t, s, b, n in rows}


def registry(db: psycopg.Connection[Any], tenant: str, scope: str) -> dict[str, tuple[Any, int]]:
    rows = db.execute(
        "SELECT dataset, batch_id, row_count FROM curated.ingestion_slices"
        " WHERE tenant_id = %s AND source_scope = %s",
        (tenant, scope),
    ).fetchall()
    return {dataset: (batch, count) for dataset, batch, count in rows}


def commit(
    wh: Warehouse, loads: list[DatasetLoad], *, tenant: str = ACME, scope: str = SCOPE
) -> SliceCommit:
    return wh.commit_slice(
        tenant_id=tenant, source_scope=scope, batch_id=uuid.uuid4(), datasets=loads
    )
