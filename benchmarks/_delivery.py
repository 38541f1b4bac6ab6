"""The benchmark's delivery (deterministic trips as CSV and typed Parquet in moto S3) and the
checks that a loader loaded exactly its values."""

from __future__ import annotations

from typing import Any

import psycopg
from _harness import progress
from psycopg import sql

from fleet_import.config import libpq_url
from fleet_import.contracts.fleet import TRIPS
from fleet_import.sample_data import csv_bytes, parquet_bytes, trips_table
from fleet_import.scope import split_folder
from fleet_import.warehouse.postgres.ddl import table_identifier

TENANT = "bench"
# Replacement content starts its trip ids past every delivered one: a different slice.
_REPLACEMENT_START = 10**9


def object_name(index: int, variant: str) -> str:
    return f"trips-{index:03d}.{variant}"


def file_tables(rows: int, files: int, start: int = 0) -> list[tuple[int, int, int]]:
    """(index, first trip, rows) of each file of a delivery of `rows` in `files` objects."""
    per_file = -(-rows // files)
    return [
        (index, start + index * per_file, min(per_file, rows - index * per_file))
        for index in range(files)
        if rows - index * per_file > 0
    ]


def upload_delivery(
    s3: Any, folders: dict[tuple[str, int], str], rows: int, files: int, start: int = 0
) -> dict[tuple[str, int], list[str]]:
    """The same rows as CSV (text timestamps, as producers send them) and as typed Parquet,
    in each folder of its variant; the keys per folder."""
    keys: dict[tuple[str, int], list[str]] = {place: [] for place in folders}
    sizes: dict[str, int] = {}
    for index, first, count in file_tables(rows, files, start):
        table = trips_table(count, start=first)
        variants = {variant for variant, _ in folders}
        bodies = {}
        if "csv" in variants:
            bodies["csv"] = csv_bytes(table)
        if "parquet" in variants:
            bodies["parquet"] = parquet_bytes(table, TRIPS)
        for variant, body in bodies.items():
            sizes[variant] = sizes.get(variant, 0) + len(body)
        for (variant, repeat), folder in folders.items():
            bucket, prefix = split_folder(folder)
            key = prefix + object_name(index, variant)
            s3.put_object(Bucket=bucket, Key=key, Body=bodies[variant])
            keys[(variant, repeat)].append(key)
    for variant, size in sizes.items():
        progress(f"{variant}: {len(file_tables(rows, files))} objects, {size / 2**20:.1f} MiB")
    return keys


def replacement_bodies(rows: int, files: int) -> list[bytes]:
    """Parquet objects of other trips (other ids, other values) under the same names."""
    return [
        parquet_bytes(trips_table(count, start=_REPLACEMENT_START + first), TRIPS)
        for _, first, count in file_tables(rows, files)
    ]


def same_rows(url: str, ours: tuple[sql.Composable, str | None], theirs: sql.Composable) -> None:
    """Two loaders must have loaded the same values, not merely the same number of rows."""
    aggregates = sql.SQL(
        "SELECT count(*), count(driver_id), count(ended_at), round(sum(distance_km)::numeric, 3),"
        " round(sum(end_odometer_km)::numeric, 1), min(started_at), max(ended_at),"
        " count(DISTINCT trip_id), count(DISTINCT status) FROM {}"
    )
    table, scope = ours
    where = sql.SQL(" WHERE tenant_id = %s AND source_scope = %s" if scope else "")
    with psycopg.connect(libpq_url(url)) as conn:
        mine = conn.execute(aggregates.format(table) + where, (TENANT, scope) if scope else ())
        other = conn.execute(aggregates.format(theirs)).fetchone()
        if (found := mine.fetchone()) != other:
            raise RuntimeError(f"loaded rows differ: {found} against {other}")


def replaced_only(url: str, scope: str, rows: int) -> None:
    """After the replacement the slice holds the new trips (ids of 11 characters) only."""
    query = sql.SQL(
        "SELECT count(*), count(*) FILTER (WHERE length(trip_id) = 11) FROM {}"
        " WHERE tenant_id = %s AND source_scope = %s"
    ).format(table_identifier(TRIPS.target_table))
    with psycopg.connect(libpq_url(url)) as conn:
        found = conn.execute(query, (TENANT, scope)).fetchone()
    if found != (rows, rows):
        raise RuntimeError(f"the replaced slice holds {found} (rows, new rows), not {rows}")
