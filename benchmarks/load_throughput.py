"""End-to-end load throughput: our `import_folder` against its anchors, in the same run.

Generates a deterministic trips delivery (Parquet, and with `--csv` CSV, of the same rows)
into a moto S3 server, then measures in one run, each part in a child process of its own,
on the same objects:

- ours: `import_folder` end to end (reserve, lease, list, normalize to typed Parquet, stage
  it in S3, duplicate check, one slice transaction of DELETE + COPY BINARY, record);
- the anchors (_baselines.py): a vectorised Arrow -> COPY BINARY loader into a table of the
  curated shape (stamps, NOT NULL, the batch-id index: the limit for our guarantees) and
  into a plain table; dlt's fastest append, and dlt's `merge`/`delete-insert` on a
  `merge_key` of tenant and scope replacing one slice, when the `bench` extra is installed;
- on the Parquet folder, after the first load: the rerun of the unchanged folder (it must
  end AlreadyLoaded), its forced rerun (every file a cache hit: the slice replaced by the
  same rows), then the replacement of the slice by different content;
- a run at `--large-rows` (5M) for rows/s and peak RSS at scale; with `--prefect-server`,
  `fleet-import run` against a `prefect server start` of its own.

The last line is exactly
`ratio curated=X plain=Y dlt_append=Z dlt_slice=W gate=G replace=R rss_5m_over_1m=M`: ours
over each anchor (rows/s; dlt_slice against our replacement of the slice), gate = our cold
first load's time over the same load's without the content gate, replace = the forced
rerun's time over the cold first load's, rss = the 5M peak over the 1M peak. With
`--repeat`, each is the median of the per-round ratios.

    .venv/bin/python benchmarks/load_throughput.py [--rows 1000000] [--files 8]
        [--repeat 1] [--large-rows 5000000] [--csv] [--prefect-server] [--database-url URL]
"""

from __future__ import annotations

# Before pyarrow: importing fleet_import chooses the allocator of Arrow's C++ readers and
# writers, which Arrow reads when pyarrow is imported (fleet_import/__init__.py). Imported
# after pyarrow, the children measured ours on mimalloc, which no fleet-import process uses.
import fleet_import  # noqa: F401

# isort: split

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import boto3
import psycopg
import pyarrow as pa
from _baselines import (
    baseline_table_sql,
    curated_table_sql,
    dlt_missing,
    measure_baseline,
    measure_dlt,
)
from _delivery import TENANT, replaced_only, replacement_bodies, same_rows, upload_delivery
from _harness import (
    REPO,
    Measurement,
    checkpoint,
    fresh_database,
    moto_s3,
    prefect_server,
    progress,
    run_child,
)
from _ours import measure_ours
from _report import report
from psycopg import sql

from fleet_import.config import libpq_url
from fleet_import.contracts.fleet import TRIPS
from fleet_import.sample_data import fleet_delivery
from fleet_import.scope import source_scope, split_folder
from fleet_import.warehouse.postgres.ddl import table_identifier
from fleet_import.warehouse.postgres.warehouse import PostgresWarehouse

LEASE_TTL_SECONDS = 120.0
CHILD_TIMEOUT_SECONDS = 600.0


# -- the run ---------------------------------------------------------------------------------


def empty_tables(url: str) -> None:
    """Each load writes into empty tables: slices already in the curated table change the
    cost of the next load, so one variant must not pay for the other's rows."""
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "TRUNCATE {}, curated.ingestion_slices, baseline_parquet, baseline_csv,"
                " baseline_curated"
            ).format(table_identifier(TRIPS.target_table))
        )


def server_version(url: str) -> str:
    with psycopg.connect(libpq_url(url)) as conn:
        return str(conn.execute("SHOW server_version").fetchone()[0]).split()[0]  # type: ignore[index]


def server_counters(url: str) -> dict[str, float]:
    """WAL written (MB) and checkpoints started, server-wide: around a child they include
    its start-up and, on a shared server, other sessions' work."""
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        row = conn.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0') / 1048576.0,"
            " checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter"
        ).fetchone()
    assert row is not None
    return {"wal_mb": float(row[0]), "checkpoints": float(row[1])}


class Bench:
    """One run's shared state: the database, the S3 server, the buckets, the results."""

    def __init__(self, args: argparse.Namespace, url: str, endpoint: str, workdir: str) -> None:
        self.args, self.url, self.endpoint, self.workdir = args, url, endpoint, workdir
        self.run_id = uuid.uuid4().hex[:8]
        self.s3 = boto3.client("s3", endpoint_url=endpoint)
        self.landing, self.stage = f"fleet-bench-{self.run_id}", f"fleet-bench-stage-{self.run_id}"
        for bucket in (self.landing, self.stage):
            self.s3.create_bucket(Bucket=bucket)
        self.results: dict[str, list[Measurement]] = {}
        self.extra: dict[str, Any] = {}

    def folder(self, name: str) -> str:
        return f"s3://{self.landing}/{TENANT}/fleet/{self.run_id}-{name}/"

    def measure(self, part: str, role: str, spec: dict[str, Any], rows: int) -> Measurement:
        checkpoint(self.url)
        progress(f"measuring {part}")
        spec = {"database_url": self.url, "endpoint": self.endpoint, "label": part, **spec}
        argv = [str(Path(__file__).resolve()), "--child", role, "--spec", json.dumps(spec)]
        before = server_counters(self.url)
        measured = run_child(argv, CHILD_TIMEOUT_SECONDS)
        after = server_counters(self.url)
        measured.details["server"] = {k: after[k] - before[k] for k in after}
        progress(f"{part}: {measured.rows:,} rows in {measured.seconds:.2f} s")
        if measured.rows != rows:
            raise RuntimeError(f"{part} loaded {measured.rows} rows, expected {rows}")
        self.results.setdefault(part, []).append(measured)
        return measured

    def ours(self, part: str, folder: str, rows: int, **spec: Any) -> Measurement:
        name = f"{part}-{uuid.uuid4().hex[:6]}"
        # One staging area per folder, as a deployment has one: a forced rerun finds the
        # normalized files its first load staged (the cache's hits).
        area = folder.rstrip("/").rsplit("/", 1)[-1]
        return self.measure(
            part,
            "ours",
            {
                "folder": folder,
                "staging_uri": f"s3://{self.stage}/{area}/",
                "delivery_key": f"bench-{name}",
                "workdir": str(Path(self.workdir) / name),
                **spec,
            },
            rows,
        )

    def baseline(
        self, part: str, variant: str, keys: list[str], rows: int, **spec: Any
    ) -> Measurement:
        spec = {"variant": variant, "bucket": self.landing, "keys": keys, **spec}
        return self.measure(part, "baseline", {**spec, "table": f"baseline_{variant}"}, rows)

    def dlt(self, part: str, keys: list[str], dataset: str, rows: int, **spec: Any) -> None:
        spec = {"bucket": self.landing, "keys": keys, "dataset": dataset, **spec}
        self.measure(part, "dlt", spec, rows)
        same_rows(self.url, (sql.Identifier(dataset, "trips"), None), PLAIN)


def run(args: argparse.Namespace) -> Bench:
    with (
        fresh_database(args.database_url) as url,
        moto_s3() as endpoint,
        tempfile.TemporaryDirectory(prefix="fleet-bench-") as workdir,
    ):
        progress(
            f"PostgreSQL {server_version(url)}, {os.cpu_count()} CPUs, Python "
            f"{platform.python_version()}, pyarrow {pa.__version__}, psycopg {psycopg.__version__}"
        )
        bench = Bench(args, url, endpoint, workdir)
        # A folder per variant and repetition: the first import of a folder is the cold path
        # (the normalized-file cache is keyed by object), and each folder is imported once.
        variants = ("parquet", "csv") if args.csv else ("parquet",)
        folders = {
            (variant, repeat): bench.folder(f"{variant}-{repeat}")
            for repeat in range(args.repeat)
            for variant in variants
        }
        # The same rows again, for the cold load without the content gate (issue 49).
        for repeat in range(args.repeat):
            folders[("parquet", -1 - repeat)] = bench.folder(f"no-gate-{repeat}")
        progress(f"generating {args.rows:,} trips in {args.files} files per folder")
        keys = upload_delivery(bench.s3, folders, args.rows, args.files)
        replacement = replacement_bodies(args.rows, args.files)
        PostgresWarehouse(url).ensure_tables([TRIPS])  # not timed, for anyone
        with psycopg.connect(libpq_url(url), autocommit=True) as conn:
            for variant in ("parquet", "csv"):
                conn.execute(baseline_table_sql(f"baseline_{variant}"))
            conn.execute(curated_table_sql("baseline_curated"))
        bench.extra["dlt_missing"] = dlt_missing()
        for (variant, repeat), folder in folders.items():
            if repeat < 0:  # a no-gate twin: measured beside its round's first load
                continue
            progress(f"-- {variant}, run {repeat + 1} of {args.repeat}")
            empty_tables(url)
            if variant == "csv":
                bench.baseline("baseline csv", variant, keys[(variant, repeat)], args.rows)
                bench.ours("ours csv", folder, args.rows)
                same_rows(url, (CURATED, source_scope(folder)), sql.Identifier("baseline_csv"))
            else:
                twin = folders[("parquet", -1 - repeat)]
                measure_parquet(bench, folder, keys[(variant, repeat)], replacement, repeat, twin)
        progress("ours, the baselines and dlt loaded the same values in every run")
        if args.prefect_server:
            measure_prefect(bench)
        if args.large_rows:
            measure_large(bench)
    return bench


CURATED = table_identifier(TRIPS.target_table)
PLAIN = sql.Identifier("baseline_parquet")


def measure_parquet(
    bench: Bench, folder: str, keys: list[str], replacement: list[bytes], repeat: int, twin: str
) -> None:
    """One round of the Parquet parts, on one folder, in this order: our cold first load of
    the same rows without the content gate (`twin`, its own folder), the plain and curated
    anchors, our cold first load, dlt's append, the unchanged rerun, its forced rerun (cache
    hits), dlt's slice replace, our replacement of the slice by other content."""
    rows, scope = bench.args.rows, source_scope(folder)
    bench.ours("ours parquet no gate", twin, rows, no_gate=True)
    empty_tables(bench.url)
    bench.baseline("baseline parquet", "parquet", keys, rows)
    bench.baseline("baseline curated", "curated", keys, rows, slice=[TENANT, scope])
    same_rows(bench.url, (sql.Identifier("baseline_curated"), None), PLAIN)
    bench.ours("ours parquet", folder, rows)
    same_rows(bench.url, (CURATED, scope), PLAIN)
    if bench.extra["dlt_missing"] is None:
        bench.dlt("dlt", keys, f"dlt_{repeat}", rows)
    bench.ours("rerun unchanged", folder, 0, expect="already_loaded")
    bench.ours("replace unchanged (cache hits)", folder, rows, force=True, expect="cache_hits")
    same_rows(bench.url, (CURATED, scope), PLAIN)
    if bench.extra["dlt_missing"] is None:
        bench.dlt("dlt slice", keys, f"dlt_slice_{repeat}", rows, slice=[TENANT, scope])
    for key, body in zip(keys, replacement, strict=True):
        bench.s3.put_object(Bucket=bench.landing, Key=key, Body=body)
    bench.ours("replace slice", folder, rows)
    replaced_only(bench.url, scope, rows)


def measure_large(bench: Bench) -> None:
    """Ours and the Parquet and curated-shape baselines at `--large-rows`, files of the
    default run's size: the curated baseline's own 5M/1M rows/s is what the server allows
    the curated shape at that size (its index and WAL grow with the table)."""
    args = bench.args
    files = max(1, round(args.files * args.large_rows / args.rows))
    folder = bench.folder("large")
    progress(f"generating {args.large_rows:,} trips in {files} files")
    keys = upload_delivery(bench.s3, {("parquet", 0): folder}, args.large_rows, files)[
        ("parquet", 0)
    ]
    empty_tables(bench.url)
    bench.baseline("baseline parquet large", "parquet", keys, args.large_rows)
    empty_tables(bench.url)
    slice_of = [TENANT, source_scope(folder)]
    bench.baseline("baseline curated large", "curated", keys, args.large_rows, slice=slice_of)
    empty_tables(bench.url)
    bench.ours("ours parquet large", folder, args.large_rows)


def measure_prefect(bench: Bench) -> None:
    """`fleet-import run` (the import-s3-folder flow) against a running Prefect server, on a
    fresh Parquet folder, timed from the command's start to its exit, beside the same load
    by `import_folder` in a child of ours."""
    args = bench.args
    folders = {("parquet", 0): bench.folder("prefect"), ("parquet", 1): bench.folder("core")}
    upload_delivery(bench.s3, folders, args.rows, args.files)
    # The flow loads every Fleet dataset, and requires vehicles and fuel transactions.
    others = fleet_delivery(trips=0)
    for folder in folders.values():
        bucket, prefix = split_folder(folder)
        for name in ("vehicles.csv", "fuel_transactions.parquet"):
            bench.s3.put_object(Bucket=bucket, Key=prefix + name, Body=others[name])
    with prefect_server(Path(bench.workdir) / "prefect") as server:
        empty_tables(bench.url)
        core = bench.ours(
            "ours, every Fleet dataset", folders[("parquet", 1)], args.rows, all_datasets=True
        )
        empty_tables(bench.url)
        checkpoint(bench.url)
        env = server.env(
            FLEET_DATABASE_URL=bench.url,
            FLEET_S3_ENDPOINT_URL=bench.endpoint,
            FLEET_STAGING_URI=f"s3://{bench.stage}/prefect/",
            FLEET_WORKDIR=str(Path(bench.workdir) / "prefect-work"),
        )
        command = [str(Path(sys.executable).with_name("fleet-import")), "run"]
        command += [folders[("parquet", 0)], "--tenant", TENANT, "--delivery-key", "bench-prefect"]
        progress("measuring fleet-import run against the Prefect server")
        started = time.perf_counter()
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(
            f"fleet-import run failed ({done.returncode}): {done.stdout[-2000:]}"
            f"{done.stderr[-2000:]}"
        )
    bench.extra["prefect"] = {"cli_seconds": seconds, "core_seconds": core.seconds}
    progress(f"fleet-import run: {seconds:.2f} s (import_folder beside it: {core.seconds:.2f} s)")


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
        "--large-rows",
        type=int,
        default=5_000_000,
        help="rows of the peak-RSS run, in files of the default run's size (0: skip it)",
    )
    parser.add_argument(
        "--csv", action="store_true", help="also load a CSV delivery against COPY CSV"
    )
    parser.add_argument(
        "--prefect-server",
        action="store_true",
        help="also time `fleet-import run` against a `prefect server start` of its own",
    )
    parser.add_argument(
        "--database-url",
        help="admin URL of a PostgreSQL where a scratch database may be created "
        "(default: FLEET_TEST_DATABASE_URL, 127.0.0.1:5432, else the embedded pgserver)",
    )
    parser.add_argument("--child", choices=("ours", "baseline", "dlt"), help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        measure = {"ours": measure_ours, "baseline": measure_baseline, "dlt": measure_dlt}
        measure[args.child](json.loads(args.spec)).emit()
        return
    if min(args.rows, args.files, args.repeat) < 1 or args.large_rows < 0:
        parser.error("--rows, --files and --repeat must be positive")
    os.chdir(REPO)  # alembic.ini and tests.pgtools live at the repository root
    started = time.perf_counter()
    bench = run(args)
    progress(f"whole run: {time.perf_counter() - started:.0f} s")
    report(bench)


if __name__ == "__main__":
    sys.exit(main())
