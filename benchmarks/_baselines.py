"""The loaders `load_throughput.py` measures ours against, each run in a child process on the
same S3 objects: the strongest plain loaders (no stamps, no index, no validation), and dlt's
fastest configuration when the `bench` extra is installed.

- Parquet baseline: each object downloaded and read with pyarrow a batch at a time, encoded
  by the vectorised Arrow -> COPY BINARY encoder on a reader thread, into one
  `COPY (FORMAT BINARY)` on one connection, in one transaction, into a plain table.
- CSV baseline: each object's bytes as S3 sends them straight into `COPY (FORMAT CSV, HEADER)`
  (the server parses; no Python touches a row).
- Curated-shape baseline: the Parquet baseline into a table of the curated table's shape
  (the three stamp columns, NOT NULL as ours are, stamped in the COPY stream; the btree on
  the batch id): the limit for a loader that keeps our slice's guarantees.
- dlt: an Arrow source reading the same objects as `read_parquet(use_pyarrow=True)` does,
  `loader_file_format="parquet"`, loaded through ADBC into a dataset of its own: its fastest
  append, or (`slice`) `merge` with the `delete-insert` strategy on a `merge_key` of tenant
  and scope replacing the slice a first, untimed run loaded (the job a dlt user replacing
  one tenant's slice configures).
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import boto3
import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
from _harness import Measurement, Window, prefetch, progress
from psycopg import sql

from fleet_import.config import libpq_url
from fleet_import.contracts.fleet import TRIPS
from fleet_import.warehouse.base import STAMP_COLUMNS
from fleet_import.warehouse.postgres.binary_copy import (
    SIGNATURE,
    TRAILER,
    CopyEncoder,
    text_field,
    uuid_field,
)
from fleet_import.warehouse.postgres.ddl import pg_type, table_identifier

# Arrow batches of 64k rows, S3 reads in 1 MiB chunks, a few encoded chunks in flight
# between the reader thread and the COPY.
BATCH_ROWS = 65_536
_CHUNK_BYTES = 1 << 20
_PREFETCH_DEPTH = 4
# dlt's read_parquet yields Arrow tables of `chunksize` rows; larger than its default
# (10,000) is faster here.
_DLT_CHUNK_ROWS = 65_536


def baseline_table_sql(table: str) -> sql.Composed:
    """A plain table with the trips columns and types: no stamps, no index, no constraint."""
    columns = [
        sql.SQL("{} {}").format(sql.Identifier(c.name), sql.SQL(pg_type(c)))
        for c in TRIPS.columns
    ]
    return sql.SQL("CREATE TABLE {} ({})").format(
        sql.Identifier(table), sql.SQL(", ").join(columns)
    )


def curated_table_sql(table: str) -> sql.Composed:
    """A table of the curated trips table's shape: its columns, NOT NULLs and index."""
    return sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING ALL)").format(
        sql.Identifier(table), table_identifier(TRIPS.target_table)
    )


def csv_chunks(s3: Any, bucket: str, keys: list[str]) -> Iterator[tuple[int, bytes]]:
    """Each object's bytes as S3 sends them: no parsing in Python."""
    for index, key in enumerate(keys):
        body = s3.get_object(Bucket=bucket, Key=key)["Body"]
        for chunk in body.iter_chunks(_CHUNK_BYTES):
            yield index, chunk


def arrow_batches(s3: Any, bucket: str, keys: list[str]) -> Iterator[pa.RecordBatch]:
    for key in keys:
        data = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        yield from pq.ParquetFile(pa.BufferReader(data)).iter_batches(batch_size=BATCH_ROWS)


def binary_chunks(
    s3: Any, bucket: str, keys: list[str], stamps: tuple[bytes, ...] = ()
) -> Iterator[Any]:
    """Each object's batches as COPY BINARY tuples, encoded whole-column (no per-row Python),
    each row ending in the constant `stamps` fields."""
    encoder = CopyEncoder(TRIPS.arrow_schema, stamps)
    for batch in arrow_batches(s3, bucket, keys):
        yield encoder.encode(batch)


def measure_baseline(spec: dict[str, Any]) -> Measurement:
    s3 = boto3.client("s3", endpoint_url=spec["endpoint"])
    bucket, keys, variant = spec["bucket"], spec["keys"], spec["variant"]
    table = sql.Identifier(spec["table"])
    names = list(TRIPS.column_names)
    stamps: tuple[bytes, ...] = ()
    if variant == "curated":
        names += STAMP_COLUMNS
        tenant, scope = spec["slice"]
        stamps = (text_field(tenant), text_field(scope), uuid_field(uuid.uuid4()))
    columns = sql.SQL(", ").join(map(sql.Identifier, names))
    rows = 0
    with (
        Window() as window,
        psycopg.connect(libpq_url(spec["database_url"])) as conn,
        conn.cursor() as cursor,
    ):
        if variant == "csv":
            statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT CSV, HEADER)")
            produced = prefetch(lambda: csv_chunks(s3, bucket, keys), _PREFETCH_DEPTH)
            # One COPY per object: each CSV object has its own header line.
            for _, items in itertools.groupby(produced, key=lambda item: item[0]):
                with cursor.copy(statement.format(table, columns)) as copy:
                    for _, data in items:
                        copy.write(memoryview(data))
                rows += cursor.rowcount
        else:
            statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)")
            with cursor.copy(statement.format(table, columns)) as copy:
                copy.write(SIGNATURE)
                encoded = lambda: binary_chunks(s3, bucket, keys, stamps)  # noqa: E731
                for data in prefetch(encoded, _PREFETCH_DEPTH):
                    copy.write(memoryview(data))
                copy.write(TRAILER)
            rows = cursor.rowcount
    return window.measurement("baseline", rows)


# -- dlt ---------------------------------------------------------------------------------


def dlt_missing() -> str | None:
    """Why dlt cannot run here, or None when it can."""
    for module, package in (("dlt", "dlt"), ("adbc_driver_postgresql", "adbc-driver-postgresql")):
        if importlib.util.find_spec(module) is None:
            return f"{package} is not installed (pip install -e '.[bench]')"
    return None


def _with_password(url: str) -> str:
    """dlt insists on a password; a server that trusts the connection ignores it."""
    parts = urlsplit(url)
    if parts.password is not None or "@" not in parts.netloc:
        return url
    user, host = parts.netloc.rsplit("@", 1)
    return urlunsplit(parts._replace(netloc=f"{user}:unused@{host}"))


def measure_dlt(spec: dict[str, Any]) -> Measurement:
    """dlt's fastest path: Arrow tables in, Parquet load files, ADBC into PostgreSQL. With
    `slice` (tenant, scope), a first untimed run loads the rows as that slice, then the timed
    run replaces it: `merge`, strategy `delete-insert`, `merge_key` tenant and scope."""
    workdir = tempfile.mkdtemp(prefix="fleet-bench-dlt-")
    os.environ.setdefault("RUNTIME__DLTHUB_TELEMETRY", "false")
    os.environ.setdefault("RUNTIME__LOG_LEVEL", "WARNING")
    import dlt
    from dlt.destinations import postgres

    s3 = boto3.client("s3", endpoint_url=spec["endpoint"])
    bucket, keys = spec["bucket"], spec["keys"]
    scope = spec.get("slice")
    disposition: Any = "append"
    if scope is not None:
        disposition = {"disposition": "merge", "strategy": "delete-insert"}

    @dlt.resource(
        name="trips",
        write_disposition=disposition,
        merge_key=["tenant_id", "source_scope"] if scope else None,
    )
    def trips() -> Iterator[pa.Table]:
        # What dlt.sources.filesystem.read_parquet(use_pyarrow=True) does with each file.
        for key in keys:
            data = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
            parquet = pq.ParquetFile(pa.BufferReader(data))
            for batch in parquet.iter_batches(batch_size=_DLT_CHUNK_ROWS):
                table = pa.Table.from_batches([batch])
                if scope is not None:
                    for name, value in zip(("tenant_id", "source_scope"), scope, strict=True):
                        table = table.append_column(name, pa.array([value] * len(table)))
                yield table

    pipeline = dlt.pipeline(
        pipeline_name=f"fleet_bench_{uuid.uuid4().hex[:8]}",
        destination=postgres(credentials=_with_password(libpq_url(spec["database_url"]))),
        dataset_name=spec["dataset"],
        pipelines_dir=workdir,
    )
    try:
        if scope is not None:
            pipeline.run(trips(), loader_file_format="parquet").raise_on_failed_jobs()
        with Window() as window:
            info = pipeline.run(trips(), loader_file_format="parquet")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    info.raise_on_failed_jobs()
    formats = {
        job.job_file_info.file_format for job in info.load_packages[0].jobs["completed_jobs"]
    }
    progress(f"dlt: load files {sorted(formats)} (a parquet file is loaded through ADBC)")
    with psycopg.connect(libpq_url(spec["database_url"])) as conn:
        rows = conn.execute(
            sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(spec["dataset"], "trips"))
        ).fetchone()[0]  # type: ignore[index]
    return window.measurement("dlt", rows, dlt_version=dlt.__version__)
