"""Micro-benchmark: trips-shaped rows from local Parquet into PostgreSQL.

(a) our path: PostgresWarehouse.commit_slice (vectorised COPY BINARY encoder + reader thread)
(b) baseline: pyarrow's CSV writer -> COPY (FORMAT CSV), with the same reader thread and the
    NOTES.md tip applied (tz-aware timestamps cast to naive UTC first).

Both load the same stamped rows into the same curated table, in one transaction each, and
the table is truncated before every run. Prints rows/s per path and the ratio ours/baseline.

    .venv/bin/python benchmarks/copy_encoder.py [--rows 1000000] [--files 8] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from fleet_import.config import libpq_url
from fleet_import.contracts import TRIPS
from fleet_import.warehouse import DatasetLoad, LoadFile, PostgresWarehouse
from fleet_import.warehouse.postgres.binary_copy import (
    CopyEncoder,
    ParquetSource,
    stream_parquet,
    text_field,
    uuid_field,
)
from fleet_import.warehouse.postgres.ddl import table_identifier

DEFAULT_SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"
TENANT = "acme"
SCOPE = "fleet_s3:s3://fleet-landing/acme/fleet/2026-07-22/"
_EPOCH_2023_US = 1_672_531_200_000_000


def trips_table(rows: int, first: int, rng: np.random.Generator) -> pa.Table:
    """Plausible trips: ids, 10% null drivers, 5% open trips, three floats, a status."""
    numbers = pa.array(np.arange(first, first + rows)).cast(pa.string())
    started = _EPOCH_2023_US + rng.integers(0, 365 * 86_400 * 10**6, rows)
    ended = started + rng.integers(60 * 10**6, 4 * 3_600 * 10**6, rows)
    open_trip = rng.random(rows) < 0.05
    start_km = rng.uniform(0, 400_000, rows)
    distance = rng.uniform(0.5, 600, rows)
    status = pa.DictionaryArray.from_arrays(
        pa.array(np.where(open_trip, 2, rng.integers(0, 2, rows)).astype(np.int32)),
        pa.array(["completed", "cancelled", "in_progress"]),
    ).cast(pa.string())
    driver = pc.binary_join_element_wise(
        "drv-", pa.array(rng.integers(0, 5_000, rows)).cast(pa.string()), ""
    )
    columns = {
        "trip_id": pc.binary_join_element_wise("trip-", numbers, ""),
        "vehicle_id": pc.binary_join_element_wise(
            "veh-", pa.array(rng.integers(0, 2_000, rows)).cast(pa.string()), ""
        ),
        "driver_id": pc.if_else(pa.array(rng.random(rows) < 0.1), None, driver),
        "started_at": pa.array(started, pa.timestamp("us", tz="UTC")),
        "ended_at": pa.array(ended, pa.timestamp("us", tz="UTC"), mask=open_trip),
        "distance_km": pa.array(distance),
        "start_odometer_km": pa.array(start_km),
        "end_odometer_km": pa.array(start_km + distance),
        "status": status,
        "_source_line": pa.array(np.arange(2, rows + 2, dtype=np.int64)),
    }
    return pa.table(columns)


def write_files(folder: Path, rows: int, files: int) -> list[Path]:
    rng = np.random.default_rng(7)
    paths, per_file = [], -(-rows // files)
    for index in range(files):
        count = min(per_file, rows - index * per_file)
        path = folder / f"trips_{index}.parquet"
        pq.write_table(trips_table(count, index * per_file, rng), path, row_group_size=128_000)
        paths.append(path)
    return paths


class CsvEncoder:
    """Baseline: pyarrow's CSV writer, stamps appended as constant columns."""

    header = b""
    trailer = b""

    def __init__(self, schema: pa.Schema, batch_id: uuid.UUID) -> None:
        self.schema = schema
        self._batch_id = str(batch_id)
        self._options = pacsv.WriteOptions(include_header=False)

    def encode(self, batch: pa.RecordBatch) -> pa.Buffer:
        rows = batch.num_rows
        columns = [
            column.cast(pa.timestamp("us")) if pa.types.is_timestamp(column.type) else column
            for column in batch.columns
        ]
        for value in (TENANT, SCOPE, self._batch_id):
            columns.append(pa.repeat(pa.scalar(value), rows))
        names = [*batch.schema.names, "tenant_id", "source_scope", "ingestion_batch_id"]
        sink = pa.BufferOutputStream()
        pacsv.write_csv(pa.RecordBatch.from_arrays(columns, names=names), sink, self._options)
        return sink.getvalue()


def load_csv(url: str, paths: list[Path]) -> int:
    columns = ", ".join([*TRIPS.column_names, "tenant_id", "source_scope", "ingestion_batch_id"])
    table = table_identifier(TRIPS.target_table)
    with psycopg.connect(url) as conn, conn.cursor() as cursor:
        cursor.execute(
            psycopg.sql.SQL("DELETE FROM {} WHERE tenant_id = %s AND source_scope = %s").format(
                table
            ),
            (TENANT, SCOPE),
        )
        statement = psycopg.sql.SQL("COPY {} (" + columns + ") FROM STDIN (FORMAT CSV)").format(
            table
        )
        with cursor.copy(statement) as copy:
            stream_parquet(
                [ParquetSource(p) for p in paths],
                CsvEncoder(TRIPS.arrow_schema, uuid.uuid4()),
                copy.write,
            )
        return cursor.rowcount


def load_ours(url: str, paths: list[Path]) -> int:
    commit = PostgresWarehouse(url).commit_slice(
        tenant_id=TENANT,
        source_scope=SCOPE,
        batch_id=uuid.uuid4(),
        datasets=[DatasetLoad(TRIPS, tuple(LoadFile(p) for p in paths))],
    )
    return commit.row_counts[TRIPS.name]


def client_only(paths: list[Path]) -> dict[str, float]:
    """Rows/s of reading + encoding alone (bytes thrown away): the client's share of a load."""
    stamps = (text_field(TENANT), text_field(SCOPE), uuid_field(uuid.uuid4()))
    encoders = {
        "ours (COPY BINARY)": CopyEncoder(TRIPS.arrow_schema, stamps),
        "baseline (CSV)": CsvEncoder(TRIPS.arrow_schema, uuid.uuid4()),
    }
    rates = {}
    for label, encoder in encoders.items():
        started = time.perf_counter()
        rows = stream_parquet([ParquetSource(p) for p in paths], encoder, lambda _: None)
        rates[label] = rows / (time.perf_counter() - started)
    return rates


def truncate(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("TRUNCATE {}").format(table_identifier(TRIPS.target_table)))
        conn.execute("TRUNCATE curated.ingestion_slices")
        conn.execute("CHECKPOINT")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--server", default=DEFAULT_SERVER, help="admin URL of a PostgreSQL")
    args = parser.parse_args()

    admin = libpq_url(args.server)
    name = f"fleet_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = urlunsplit(urlsplit(admin)._replace(path="/" + name))
    try:
        PostgresWarehouse(url).ensure_tables([TRIPS])
        with tempfile.TemporaryDirectory() as folder:
            paths = write_files(Path(folder), args.rows, args.files)
            for label, rate in client_only(paths).items():
                print(f"{label:20s} {rate / 1e6:6.2f}M rows/s read + encode only, no database")
            timings: dict[str, list[float]] = {"ours (COPY BINARY)": [], "baseline (CSV)": []}
            for _ in range(args.repeat):  # alternate, so drift hits both paths alike
                for label, load in zip(timings, (load_ours, load_csv), strict=True):
                    truncate(url)
                    started = time.perf_counter()
                    loaded = load(url, paths)
                    timings[label].append(time.perf_counter() - started)
                    assert loaded == args.rows, (label, loaded)
        rates = {label: args.rows / statistics.median(t) for label, t in timings.items()}
        for label, rate in rates.items():
            runs = ", ".join(f"{args.rows / t / 1e6:.2f}" for t in timings[label])
            print(f"{label:20s} {rate / 1e6:6.2f}M rows/s into PostgreSQL (median; runs {runs})")
        ours, baseline = rates.values()
        print(f"ratio ours/baseline: {ours / baseline:.2f}")
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
