"""End-to-end load throughput: our `import_folder` against a plain pyarrow + COPY loader.

Generates a deterministic trips delivery (CSV and Parquet variants of the same rows) into a
moto S3 server, then measures in one run, each part in a child process of its own:

(a) ours: `import_folder` end to end (reserve, lease, list, normalise to typed Parquet,
    stage it in S3, duplicate check, one slice transaction of DELETE + COPY BINARY, record);
(b) baseline: the same objects streamed from S3 into a plain unindexed table on one
    connection: CSV bytes straight into `COPY (FORMAT CSV, HEADER)`; Parquet read with
    pyarrow and re-encoded by pyarrow's CSV writer into `COPY (FORMAT CSV)`.

Prints rows/s and peak RSS of each, ours/baseline per variant, and last:
`ratio parquet=X.XX csv=Y.YY`.

    .venv/bin/python benchmarks/load_throughput.py [--rows 1000000] [--files 8]
        [--repeat 1] [--database-url postgresql://postgres@127.0.0.1:5432/postgres]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import psycopg
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from _harness import (
    REPO,
    Measurement,
    Window,
    checkpoint,
    fresh_database,
    moto_s3,
    prefetch,
    progress,
    run_child,
)
from psycopg import sql

from fleet_import.batches import BatchRepository
from fleet_import.config import libpq_url
from fleet_import.contracts import TRIPS, ContractSet
from fleet_import.pipeline import Committed, ImportContext, import_folder
from fleet_import.sample_data import csv_bytes, parquet_bytes, trips_table
from fleet_import.scope import Tenant, source_scope, split_folder
from fleet_import.sources import s3_client
from fleet_import.staging import StagingArea
from fleet_import.warehouse import PostgresWarehouse
from fleet_import.warehouse.postgres.ddl import PG_TYPES, table_identifier

VARIANTS = ("parquet", "csv")
TARGETS = {"parquet": 0.7, "csv": 0.6}
TENANT = "bench"
LEASE_TTL_SECONDS = 120.0
CHILD_TIMEOUT_SECONDS = 600.0
# Baseline tuning: Arrow batches of the size our loader uses, S3 reads in 1 MiB chunks,
# and a few encoded chunks in flight between the reader thread and the COPY.
_BASELINE_BATCH_ROWS = 65_536
_BASELINE_CHUNK_BYTES = 1 << 20
_BASELINE_PREFETCH_DEPTH = 4
# (name, from mark, to mark): a mark is the first or last progress message of a kind.
_PHASES = (
    ("reserve + lease", "start", "first listing"),
    ("list, open the slice, normalise the first file", "first listing", "first normalised"),
    ("COPY of every file (normalising the rest overlaps)", "first normalised", "last loaded"),
    ("duplicate check + COMMIT + record commit + succeed", "last loaded", "end"),
)


# -- the delivery ----------------------------------------------------------------------------


def object_name(index: int, variant: str) -> str:
    return f"trips-{index:03d}.{variant}"


def upload_delivery(
    s3: Any, folders: dict[tuple[str, int], str], rows: int, files: int
) -> dict[tuple[str, int], list[str]]:
    """The same rows as CSV (text timestamps, as producers send them) and as typed Parquet,
    in one folder per variant and repetition; the keys per folder."""
    per_file = -(-rows // files)
    keys: dict[tuple[str, int], list[str]] = {place: [] for place in folders}
    sizes = dict.fromkeys(VARIANTS, 0)
    for index in range(files):
        start = index * per_file
        count = min(per_file, rows - start)
        if count <= 0:
            break
        table = trips_table(count, start=start)
        bodies = {"csv": csv_bytes(table), "parquet": parquet_bytes(table, TRIPS)}
        for variant, body in bodies.items():
            sizes[variant] += len(body)
        for (variant, repeat), folder in folders.items():
            bucket, prefix = split_folder(folder)
            key = prefix + object_name(index, variant)
            s3.put_object(Bucket=bucket, Key=key, Body=bodies[variant])
            keys[(variant, repeat)].append(key)
    written = len(next(iter(keys.values())))
    for variant, size in sizes.items():
        progress(f"{variant}: {written} objects, {size / 2**20:.1f} MiB per folder")
    return keys


# -- (a) ours --------------------------------------------------------------------------------


class TimedStaging(StagingArea):
    """The staging area, adding up the seconds spent uploading (summed over workers)."""

    def __init__(self, uri: str, s3: Any) -> None:
        super().__init__(uri, s3)
        self._lock = threading.Lock()
        self.put_seconds = 0.0
        self.put_bytes = 0

    def put_file(self, local: Path, name: str) -> str:
        started = time.perf_counter()
        try:
            return super().put_file(local, name)
        finally:
            with self._lock:
                self.put_seconds += time.perf_counter() - started
                self.put_bytes += local.stat().st_size


def measure_ours(spec: dict[str, Any]) -> Measurement:
    s3 = s3_client(spec["endpoint"])
    staging = TimedStaging(spec["staging_uri"], s3)
    marks: dict[str, float] = {}
    variant = spec["variant"]

    def on_progress(message: str, fraction: float | None) -> None:
        now = time.perf_counter()
        kind = message.split(" ", 1)[0]
        marks.setdefault(f"first {kind}", now)
        marks[f"last {kind}"] = now
        if kind != "loaded":
            progress(f"ours {variant}: {message}")

    ctx = ImportContext(
        repo=BatchRepository(spec["database_url"]),
        warehouse=PostgresWarehouse(spec["database_url"]),
        s3=s3,
        staging=staging,
        contracts=ContractSet([TRIPS]),
        lease_ttl=LEASE_TTL_SECONDS,
        workdir=Path(spec["workdir"]),
        progress=on_progress,
    )
    with Window() as window:
        marks["start"] = time.perf_counter()
        outcome = import_folder(ctx, Tenant.named(TENANT), spec["folder"], spec["delivery_key"])
        marks["end"] = time.perf_counter()
    if not isinstance(outcome, Committed) or not outcome.published:
        raise RuntimeError(f"import did not succeed: {outcome}")
    files = outcome.summary["files"]
    if any(entry["cache_hit"] for entry in files):
        raise RuntimeError("a normalised file came from the cache: measure the cold path")
    phases = {
        name: round(marks[end] - marks[begin], 3)
        for name, begin, end in _PHASES
        if begin in marks and end in marks
    }
    return window.measurement(
        "ours",
        outcome.row_counts[TRIPS.name],
        phases=phases,
        normalise_seconds_per_file=[entry["seconds"] for entry in files],
        stage_upload_seconds_summed=round(staging.put_seconds, 3),
        staged_mib=round(staging.put_bytes / 2**20, 1),
    )


# -- (b) the baseline ------------------------------------------------------------------------


def baseline_table_sql(table: str) -> sql.Composed:
    """A plain table with the trips columns and types: no stamps, no index, no constraint."""
    columns = [
        sql.SQL("{} {}").format(sql.Identifier(c.name), sql.SQL(PG_TYPES[c.type]))
        for c in TRIPS.columns
    ]
    return sql.SQL("CREATE TABLE {} ({})").format(
        sql.Identifier(table), sql.SQL(", ").join(columns)
    )


def csv_chunks(s3: Any, bucket: str, keys: list[str]) -> Iterator[tuple[int, bytes]]:
    """Each object's bytes as S3 sends them: no parsing in Python."""
    for index, key in enumerate(keys):
        body = s3.get_object(Bucket=bucket, Key=key)["Body"]
        for chunk in body.iter_chunks(_BASELINE_CHUNK_BYTES):
            yield index, chunk


def parquet_chunks(s3: Any, bucket: str, keys: list[str]) -> Iterator[tuple[int, pa.Buffer]]:
    """Each object read by pyarrow a batch at a time and written back as CSV by pyarrow.

    Timestamps are cast to naive UTC first (the session's time zone is UTC): pyarrow's CSV
    writer formats tz-aware timestamps about eight times slower (NOTES.md)."""
    options = pacsv.WriteOptions(include_header=False)
    for index, key in enumerate(keys):
        data = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        parquet = pq.ParquetFile(pa.BufferReader(data))
        for batch in parquet.iter_batches(batch_size=_BASELINE_BATCH_ROWS):
            columns = [
                column.cast(pa.timestamp(column.type.unit))
                if pa.types.is_timestamp(column.type)
                else column
                for column in batch.columns
            ]
            sink = pa.BufferOutputStream()
            pacsv.write_csv(
                pa.RecordBatch.from_arrays(columns, names=batch.schema.names), sink, options
            )
            yield index, sink.getvalue()


def measure_baseline(spec: dict[str, Any]) -> Measurement:
    s3 = boto3.client("s3", endpoint_url=spec["endpoint"])
    bucket, keys, variant = spec["bucket"], spec["keys"], spec["variant"]
    table = sql.Identifier(spec["table"])
    columns = sql.SQL(", ").join(map(sql.Identifier, TRIPS.column_names))
    if variant == "csv":
        statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT CSV, HEADER)").format(table, columns)
        chunks = csv_chunks
    else:
        statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT CSV)").format(table, columns)
        chunks = parquet_chunks  # type: ignore[assignment]
    rows = 0
    with (
        Window() as window,
        psycopg.connect(libpq_url(spec["database_url"])) as conn,
        conn.cursor() as cursor,
    ):
        cursor.execute("SET TIME ZONE 'UTC'")
        produced = prefetch(lambda: chunks(s3, bucket, keys), _BASELINE_PREFETCH_DEPTH)
        # One COPY per object (each CSV object has its own header line).
        for index, items in itertools.groupby(produced, key=lambda item: item[0]):
            with cursor.copy(statement) as copy:
                for _, data in items:
                    copy.write(memoryview(data))
            rows += cursor.rowcount
            progress(f"baseline {variant}: copied {keys[index].rsplit('/', 1)[-1]}")
    return window.measurement("baseline", rows)


# -- the run ---------------------------------------------------------------------------------


def same_rows(url: str, scope: str, table: str) -> None:
    """Both loaders must have loaded the same values, not merely the same number of rows."""
    aggregates = sql.SQL(
        "SELECT count(*), count(driver_id), count(ended_at), round(sum(distance_km)::numeric, 3),"
        " round(sum(end_odometer_km)::numeric, 1), min(started_at), max(ended_at),"
        " count(DISTINCT trip_id), count(DISTINCT status) FROM {}"
    )
    with psycopg.connect(libpq_url(url)) as conn:
        ours = conn.execute(
            aggregates.format(table_identifier(TRIPS.target_table))
            + sql.SQL(" WHERE tenant_id = %s AND source_scope = %s"),
            (TENANT, scope),
        ).fetchone()
        theirs = conn.execute(aggregates.format(sql.Identifier(table))).fetchone()
    if ours != theirs:
        raise RuntimeError(f"loaded rows differ: ours {ours}, baseline {theirs}")


def empty_tables(url: str, baseline_table: str) -> None:
    """Each loader writes into an empty table. Slices already in the curated table change
    the cost of the next load (its slice index grows; a scope that sorts before theirs
    splits index pages in the middle): the CSV run must not pay for the Parquet run's rows."""
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        conn.execute(
            sql.SQL("TRUNCATE {}, curated.ingestion_slices, {}").format(
                table_identifier(TRIPS.target_table), sql.Identifier(baseline_table)
            )
        )


def server_version(url: str) -> str:
    with psycopg.connect(libpq_url(url)) as conn:
        return str(conn.execute("SHOW server_version").fetchone()[0]).split()[0]  # type: ignore[index]


def child_argv(role: str, spec: dict[str, Any]) -> list[str]:
    return [str(Path(__file__).resolve()), "--child", role, "--spec", json.dumps(spec)]


Results = dict[str, dict[str, list[Measurement]]]


def run(args: argparse.Namespace) -> Results:
    run_id = uuid.uuid4().hex[:8]
    with (
        fresh_database(args.database_url) as url,
        moto_s3() as endpoint,
        tempfile.TemporaryDirectory(prefix="fleet-bench-") as workdir,
    ):
        progress(
            f"PostgreSQL {server_version(url)}, {os.cpu_count()} CPUs, Python "
            f"{platform.python_version()}, pyarrow {pa.__version__}, psycopg {psycopg.__version__}"
        )
        s3 = boto3.client("s3", endpoint_url=endpoint)
        landing, stage = f"fleet-bench-{run_id}", f"fleet-bench-stage-{run_id}"
        for bucket in (landing, stage):
            s3.create_bucket(Bucket=bucket)
        # A folder per variant and repetition: the first import of a folder is the cold path
        # (the normalised-file cache is keyed by object), and each folder is imported once.
        folders = {
            (variant, repeat): f"s3://{landing}/{TENANT}/fleet/{run_id}-{variant}-{repeat}/"
            for repeat in range(args.repeat)
            for variant in VARIANTS
        }
        progress(f"generating {args.rows:,} trips in {args.files} files per folder")
        keys = upload_delivery(s3, folders, args.rows, args.files)
        PostgresWarehouse(url).ensure_tables([TRIPS])  # not timed, for either side
        with psycopg.connect(libpq_url(url), autocommit=True) as conn:
            for variant in VARIANTS:
                conn.execute(baseline_table_sql(f"baseline_{variant}"))
        results: Results = {variant: {"ours": [], "baseline": []} for variant in VARIANTS}
        for (variant, repeat), folder in folders.items():
            baseline_table = f"baseline_{variant}"
            specs = {
                "ours": {
                    "variant": variant,
                    "database_url": url,
                    "endpoint": endpoint,
                    "folder": folder,
                    "staging_uri": f"s3://{stage}/{variant}-{repeat}/",
                    "delivery_key": f"bench-{run_id}-{variant}-{repeat}",
                    "workdir": str(Path(workdir) / f"{variant}-{repeat}"),
                },
                "baseline": {
                    "variant": variant,
                    "database_url": url,
                    "endpoint": endpoint,
                    "bucket": landing,
                    "keys": keys[(variant, repeat)],
                    "table": baseline_table,
                },
            }
            empty_tables(url, baseline_table)
            for role, spec in specs.items():
                checkpoint(url)
                progress(f"measuring {role} on {variant} (run {repeat + 1} of {args.repeat})")
                measured = run_child(child_argv(role, spec), CHILD_TIMEOUT_SECONDS)
                progress(
                    f"{role} {variant}: {measured.rows:,} rows in {measured.seconds:.2f} s "
                    f"({measured.rows_per_second:,.0f} rows/s)"
                )
                if measured.rows != args.rows:
                    raise RuntimeError(f"{role} {variant} loaded {measured.rows} rows")
                results[variant][role].append(measured)
            same_rows(url, source_scope(folder), baseline_table)
        progress("both loaders loaded the same values in every run")
    return results


def median(runs: list[Measurement]) -> Measurement:
    """The run of median wall time (the lower middle one of an even count)."""
    return sorted(runs, key=lambda run: run.seconds)[(len(runs) - 1) // 2]


def report(results: Results) -> None:
    ratios = {}
    for variant, measured in results.items():
        print(f"\n{variant}")
        print(
            f"  {'loader':12s} {'rows':>11s} {'seconds':>8s} {'rows/s':>10s} {'peak RSS MB':>12s}"
            f"   CPU s: {'client':>6s} {'db':>5s} {'s3':>5s}   host busy"
        )
        for role, runs in measured.items():
            for number, part in enumerate(runs, 1):
                cpu = part.details["cpu_seconds"]
                label = role if len(runs) == 1 else f"{role} #{number}"
                print(
                    f"  {label:12s} {part.rows:>11,} {part.seconds:>8.2f} "
                    f"{part.rows_per_second:>10,.0f} {part.peak_rss_mb:>12.0f}"
                    f"          {cpu['client']:>6.2f} {cpu['database']:>5.2f} {cpu['s3']:>5.2f}"
                    f"   {part.details['host_cpu_busy']:>9.0%}"
                )
        ours, baseline = median(measured["ours"]), median(measured["baseline"])
        ratios[variant] = ours.rows_per_second / baseline.rows_per_second
        of = " of the median runs" if len(measured["ours"]) > 1 else ""
        print(f"  ours/baseline{of} {ratios[variant]:.2f} (target >= {TARGETS[variant]:.2f})")
        print(f"  ours by phase{of} (wall seconds):")
        for name, seconds in ours.details["phases"].items():
            print(f"    {name:55s} {seconds:7.2f}")
        print(
            f"    (stage upload, summed over normalise workers: "
            f"{ours.details['stage_upload_seconds_summed']:.2f} s for "
            f"{ours.details['staged_mib']} MiB)"
        )
    print(f"ratio parquet={ratios['parquet']:.2f} csv={ratios['csv']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="trips per variant")
    parser.add_argument("--files", type=int, default=8, help="objects per variant")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="measure each part this many times (alternating) and compare the median runs",
    )
    parser.add_argument(
        "--database-url",
        help="admin URL of a PostgreSQL where a scratch database may be created "
        "(default: FLEET_TEST_DATABASE_URL, 127.0.0.1:5432, else the embedded pgserver)",
    )
    parser.add_argument("--child", choices=("ours", "baseline"), help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        measure = measure_ours if args.child == "ours" else measure_baseline
        measure(json.loads(args.spec)).emit()
        return
    if min(args.rows, args.files, args.repeat) < 1:
        parser.error("--rows, --files and --repeat must be positive")
    os.chdir(REPO)  # alembic.ini and tests.pgtools live at the repository root
    started = time.perf_counter()
    results = run(args)
    progress(f"whole run: {time.perf_counter() - started:.0f} s")
    report(results)


if __name__ == "__main__":
    sys.exit(main())
