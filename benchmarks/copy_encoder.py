"""Micro-benchmark: the warehouse COPY step alone, trips-shaped rows from local Parquet.

(a) our path: PostgresWarehouse.commit_slice (vectorised COPY BINARY encoder + reader thread)
    into the curated table: stamps, NOT NULL columns, the slice index, the registry;
(b) baseline: the same encoder and reader thread, no stamps, into a plain table (no index,
    no constraint): the limit of a binary COPY here.

Both run in one transaction each, the tables truncated before every run. Prints rows/s per
path and the ratio ours/baseline: what the slice's guarantees cost the COPY.

    .venv/bin/python benchmarks/copy_encoder.py [--rows 1000000] [--files 8] [--repeat 3]
"""

from __future__ import annotations

# Before pyarrow: importing fleet_import chooses the allocator of Arrow's C++ readers and
# writers, which Arrow reads when pyarrow is imported (fleet_import/__init__.py). Imported
# after pyarrow, the children measured ours on mimalloc, which no fleet-import process uses.
import fleet_import  # noqa: F401

# isort: split

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
import pyarrow.parquet as pq

from fleet_import.config import libpq_url
from fleet_import.contracts.fleet import TRIPS
from fleet_import.warehouse.base import DatasetLoad, LoadFile
from fleet_import.warehouse.postgres.binary_copy import CopyEncoder, ParquetSource, stream_parquet
from fleet_import.warehouse.postgres.ddl import PG_TYPES, table_identifier
from fleet_import.warehouse.postgres.warehouse import PostgresWarehouse

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


def load_plain(url: str, paths: list[Path]) -> int:
    columns = ", ".join(TRIPS.column_names)
    with psycopg.connect(url) as conn, conn.cursor() as cursor:
        with cursor.copy(f"COPY plain_trips ({columns}) FROM STDIN (FORMAT BINARY)") as copy:
            stream_parquet(
                [ParquetSource(p) for p in paths], CopyEncoder(TRIPS.arrow_schema), copy.write
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


def truncate(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("TRUNCATE {}").format(table_identifier(TRIPS.target_table)))
        conn.execute("TRUNCATE curated.ingestion_slices, plain_trips")
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
        with psycopg.connect(url, autocommit=True) as conn:
            columns = ", ".join(f"{c.name} {PG_TYPES[c.type]}" for c in TRIPS.columns)
            conn.execute(f"CREATE TABLE plain_trips ({columns})")
        with tempfile.TemporaryDirectory() as folder:
            paths = write_files(Path(folder), args.rows, args.files)
            timings: dict[str, list[float]] = {"ours (slice)": [], "baseline (plain)": []}
            for _ in range(args.repeat):  # alternate, so drift hits both paths alike
                for label, load in zip(timings, (load_ours, load_plain), strict=True):
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
