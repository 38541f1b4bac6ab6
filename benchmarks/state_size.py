"""The operational database's size after N deliveries, and after the trim (issue 50, item 3).

`--real` tiny deliveries (6 trips, 4 fuel rows, 3 vehicles, every Fleet dataset) are
imported through the core with the flows' runtime (publication outbox, OpenLineage events to
a file), then their rows are cloned in SQL until the store holds `--folders` batches (each
clone a batch of its own scope, with its outbox steps and lineage events, byte for byte the
real rows'). Every batch is then aged past FLEET_STATE_RETAIN_DAYS and
`StateRetention.trim` runs. Sizes are each operational table's `pg_total_relation_size`
after `VACUUM FULL` (what the rows take, not what PostgreSQL keeps for reuse).

    .venv/bin/python benchmarks/state_size.py [--folders 10000] [--real 20]

The last line is exactly
`state folders=N bytes_before=B bytes_after=A ratio=R trim_seconds=T`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _harness

DELIVERY = {"trips": 6, "fuel": 4, "vehicles": 3}
_TABLES = ("ingestion_batches", "publication_outbox", "lineage_outbox", "normalized_files")

_CLONE = """
CREATE TEMP TABLE clone_map AS
    SELECT b.id AS src, gen_random_uuid() AS dst, g AS n
    FROM ingestion_batches b, generate_series(1, %(copies)s) g;
INSERT INTO ingestion_batches
    SELECT (jsonb_populate_record(NULL::ingestion_batches, to_jsonb(b) || jsonb_build_object(
        'id', m.dst,
        'source_scope', b.source_scope || '#' || m.n,
        'delivery_key', b.delivery_key || '#' || m.n))).*
    FROM ingestion_batches b JOIN clone_map m ON m.src = b.id;
INSERT INTO publication_outbox
    SELECT (jsonb_populate_record(NULL::publication_outbox, to_jsonb(o) || jsonb_build_object(
        'id', nextval('publication_outbox_id_seq'), 'batch_id', m.dst))).*
    FROM publication_outbox o JOIN clone_map m ON m.src = o.batch_id;
INSERT INTO lineage_outbox
    SELECT (jsonb_populate_record(NULL::lineage_outbox, to_jsonb(l) || jsonb_build_object(
        'id', nextval('lineage_outbox_id_seq'), 'batch_id', m.dst,
        'run_id', gen_random_uuid()))).*
    FROM lineage_outbox l JOIN clone_map m ON m.src = l.batch_id;
"""


def _sizes(database_url: str) -> dict[str, int]:
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        sizes = {}
        for table in _TABLES:
            conn.execute(f"VACUUM FULL {table}")
            row = conn.execute("SELECT pg_total_relation_size(%s::regclass)", (table,)).fetchone()
            sizes[table] = int(row[0]) if row else 0
    return sizes


def _counts(database_url: str) -> dict[str, int]:
    import psycopg

    with psycopg.connect(database_url) as conn:
        return {
            table: int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
            for table in _TABLES
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folders", type=int, default=10_000)
    parser.add_argument("--real", type=int, default=20, help="deliveries actually imported")
    parser.add_argument("--retain-days", type=float, default=30.0)
    parser.add_argument("--database-url", default=None, help="PostgreSQL server (admin URL)")
    args = parser.parse_args(argv)

    import boto3
    import psycopg

    from fleet_import.config import Settings
    from fleet_import.contracts.fleet import FLEET_DATASETS
    from fleet_import.importing.context import Committed
    from fleet_import.importing.driver import import_folder
    from fleet_import.importing.runtime import build_runtime
    from fleet_import.sample_data import fleet_delivery, today_folder
    from fleet_import.scope import Tenant, split_folder
    from fleet_import.store.state_retention import StateRetention
    from fleet_import.warehouse.postgres.warehouse import PostgresWarehouse

    with ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="state-size-")))
        database_url = stack.enter_context(_harness.fresh_database(args.database_url))
        PostgresWarehouse(database_url).ensure_tables(FLEET_DATASETS.values())
        endpoint = stack.enter_context(_harness.moto_s3())
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        landing, staging = "state-size-landing", "state-size-staging"
        for bucket in (landing, staging):
            s3.create_bucket(Bucket=bucket)
        settings = Settings(
            database_url=database_url,
            s3_endpoint_url=endpoint,
            staging_uri=f"s3://{staging}/stage/",
            workdir=str(root / "work"),
            openlineage=f"file://{root / 'lineage.jsonl'}",
        )
        rt = build_runtime(settings)
        _harness.progress(f"importing {args.real} deliveries")
        for index in range(args.real):
            tenant = f"t{index % 10:02d}"
            folder = today_folder(landing, tenant, dt.date(2026, 7, 1 + index // 10))
            _, prefix = split_folder(folder)
            for name, body in fleet_delivery(**DELIVERY).items():
                s3.put_object(Bucket=landing, Key=prefix + name, Body=body)
            outcome = import_folder(rt.ctx, Tenant.named(tenant), folder, f"k:{folder}")
            if not isinstance(outcome, Committed) or not outcome.published:
                raise RuntimeError(f"import did not succeed: {outcome}")
        copies = max(0, args.folders // args.real - 1)
        _harness.progress(f"cloning their rows {copies} times")
        with psycopg.connect(database_url) as conn:
            conn.execute(_CLONE.replace("%(copies)s", str(int(copies))))
            conn.execute(
                "UPDATE ingestion_batches SET updated_at = now() - make_interval(days => %s)",
                (int(args.retain_days) + 1,),
            )
            conn.execute(
                "UPDATE lineage_outbox SET delivered_at = now() - make_interval(days => %s)"
                " WHERE status = 'delivered'",
                (int(args.retain_days) + 1,),
            )
        rows_before, before = _counts(database_url), _sizes(database_url)
        started = time.monotonic()
        trimmed = StateRetention(database_url).trim(args.retain_days * 24 * 3600)
        seconds = time.monotonic() - started
        rows_after, after = _counts(database_url), _sizes(database_url)
    for table in _TABLES:
        print(
            f"table={table} rows_before={rows_before[table]} rows_after={rows_after[table]} "
            f"bytes_before={before[table]} bytes_after={after[table]}"
        )
    print(f"trimmed: {trimmed}")
    total_before, total_after = sum(before.values()), sum(after.values())
    print(
        f"state folders={rows_before['ingestion_batches']} bytes_before={total_before} "
        f"bytes_after={total_after} ratio={total_after / total_before:.2f} "
        f"trim_seconds={seconds:.1f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
