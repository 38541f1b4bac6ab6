"""What the slice's physical layout costs PostgreSQL: one backend's CPU for a 1M-row trips
slice sent as COPY BINARY (pre-encoded, so the client costs nothing), first into an empty
table and then replacing it, for the layouts issue 14's remaining targets depend on:

- `plain`: the baseline's table (trips columns only, no stamps, no index): the limit;
- `shared`: today's curated table (three stamp columns, the btree on the batch id), a
  replace deleting the old slice's rows in the same transaction;
- `no_scope`: the same without the per-row `source_scope` (the lighter stamp: the scope
  through the registry only);
- `partition`: a partition per slice (LIST on the batch id): the slice COPYed into a table
  of its own, its index built after the COPY, attached in the same transaction; a replace
  drops the old slice's partition instead of deleting rows.

Then what the partition layout costs readers: a reader with an open transaction on the
curated table makes the partition replace wait (DROP and ATTACH lock the parent), where the
shared table's replace goes on.

    .venv/bin/python benchmarks/slice_layouts.py [--rows 1000000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from _harness import checkpoint, fresh_database, process_cpu_seconds, progress
from psycopg import sql

from fleet_import.config import libpq_url
from fleet_import.contracts.fleet import TRIPS
from fleet_import.sample_data import trips_table
from fleet_import.warehouse.base import STAMP_COLUMNS
from fleet_import.warehouse.postgres.binary_copy import (
    BATCH_ROWS,
    CopyEncoder,
    text_field,
    uuid_field,
)
from fleet_import.warehouse.postgres.warehouse import PostgresWarehouse

TENANT = "bench"
SCOPE = "fleet_s3:s3://fleet-landing/bench/fleet/2026-07-22/"
_READER_LOCK_TIMEOUT = "2s"
Work = Callable[[psycopg.Cursor[Any]], None]


def _stamp_fields(stamps: list[str], batch: uuid.UUID) -> list[bytes]:
    """The COPY fields of `stamps` (the batch id last) for a slice of `batch`."""
    values = {"tenant_id": TENANT, "source_scope": SCOPE}
    return [text_field(values[s]) for s in stamps[:-1]] + [uuid_field(batch)]


class Layouts:
    def __init__(self, url: str, rows: int) -> None:
        self.url = url
        self.table = trips_table(rows).cast(TRIPS.arrow_schema)
        self.columns = list(TRIPS.column_names)
        with psycopg.connect(libpq_url(url)) as conn:
            conn.execute("CREATE SCHEMA layouts")
            conn.execute("CREATE TABLE layouts.plain (LIKE curated.fleet_trips)")
            conn.execute(
                "ALTER TABLE layouts.plain DROP COLUMN tenant_id, DROP COLUMN source_scope,"
                " DROP COLUMN ingestion_batch_id"
            )
            conn.execute("CREATE TABLE layouts.no_scope (LIKE curated.fleet_trips)")
            conn.execute("ALTER TABLE layouts.no_scope DROP COLUMN source_scope")
            conn.execute("CREATE INDEX ON layouts.no_scope (ingestion_batch_id)")
            conn.execute(
                "CREATE TABLE layouts.partitioned (LIKE curated.fleet_trips)"
                " PARTITION BY LIST (ingestion_batch_id)"
            )
            conn.execute("CREATE INDEX ON layouts.partitioned (ingestion_batch_id)")

    def encoded(self, *stamps: bytes) -> list[bytes]:
        encoder = CopyEncoder(TRIPS.arrow_schema, stamps)
        body = [bytes(encoder.encode(b)) for b in self.table.to_batches(BATCH_ROWS)]
        return [encoder.header, *body, encoder.trailer]

    def copy(
        self,
        cursor: psycopg.Cursor[Any],
        target: sql.Composable,
        stamps: list[str],
        data: list[bytes],
    ) -> None:
        columns = sql.SQL(", ").join(map(sql.Identifier, [*self.columns, *stamps]))
        statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(target, columns)
        with cursor.copy(statement) as copy:
            for part in data:
                copy.write(part)

    def timed(self, work: Work) -> float:
        """Backend CPU seconds of `work` in one transaction, after a CHECKPOINT."""
        checkpoint(self.url)
        with psycopg.connect(libpq_url(self.url)) as conn, conn.cursor() as cursor:
            before = process_cpu_seconds(conn.info.backend_pid)
            work(cursor)
            conn.commit()
            return process_cpu_seconds(conn.info.backend_pid) - before

    def empty(self) -> None:
        with psycopg.connect(libpq_url(self.url)) as conn:
            conn.execute("TRUNCATE layouts.plain, layouts.no_scope, curated.fleet_trips")
            for (name,) in conn.execute(
                "SELECT relname FROM pg_class WHERE relkind = 'r'"
                " AND relnamespace = 'layouts'::regnamespace AND relname LIKE 'slice\\_%'"
            ).fetchall():
                conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier("layouts", name)))

    # -- the layouts: each returns (first load, replace) work for batch ids old -> new --

    def plain(self, old: uuid.UUID, new: uuid.UUID) -> tuple[Work, Work]:
        data = self.encoded()

        def load(cursor: psycopg.Cursor[Any]) -> None:
            self.copy(cursor, sql.SQL("layouts.plain"), [], data)

        def replace(cursor: psycopg.Cursor[Any]) -> None:
            cursor.execute("TRUNCATE layouts.plain")  # no stamps: the whole table is the slice
            load(cursor)

        return load, replace

    def stamped(
        self, table: str, stamps: list[str], old: uuid.UUID, new: uuid.UUID
    ) -> tuple[Work, Work]:
        target = sql.SQL(table)
        first = self.encoded(*_stamp_fields(stamps, old))
        second = self.encoded(*_stamp_fields(stamps, new))

        def load(cursor: psycopg.Cursor[Any]) -> None:
            self.copy(cursor, target, stamps, first)

        def replace(cursor: psycopg.Cursor[Any]) -> None:
            delete = sql.SQL("DELETE FROM {} WHERE ingestion_batch_id = %s").format(target)
            cursor.execute(delete, [old])
            self.copy(cursor, target, stamps, second)

        return load, replace

    def partition(self, old: uuid.UUID, new: uuid.UUID) -> tuple[Work, Work]:
        stamps = list(STAMP_COLUMNS)
        data = {b: self.encoded(*_stamp_fields(stamps, b)) for b in (old, new)}

        def attach(cursor: psycopg.Cursor[Any], batch: uuid.UUID) -> None:
            name = sql.Identifier("layouts", f"slice_{batch.hex}")
            cursor.execute(sql.SQL("CREATE TABLE {} (LIKE layouts.partitioned)").format(name))
            # The CHECK lets ATTACH skip its validation scan.
            cursor.execute(
                sql.SQL("ALTER TABLE {} ADD CHECK (ingestion_batch_id = {})").format(
                    name, sql.Literal(str(batch))
                )
            )
            self.copy(cursor, name, stamps, data[batch])
            cursor.execute(sql.SQL("CREATE INDEX ON {} (ingestion_batch_id)").format(name))
            cursor.execute(
                sql.SQL(
                    "ALTER TABLE layouts.partitioned ATTACH PARTITION {} FOR VALUES IN ({})"
                ).format(name, sql.Literal(str(batch)))
            )

        def replace(cursor: psycopg.Cursor[Any]) -> None:
            cursor.execute(
                sql.SQL("DROP TABLE {}").format(sql.Identifier("layouts", f"slice_{old.hex}"))
            )
            attach(cursor, new)

        return (lambda cursor: attach(cursor, old)), replace

    def rounds(self, repeat: int) -> dict[str, list[float]]:
        seconds: dict[str, list[float]] = {}
        for round_number in range(1, repeat + 1):
            self.empty()
            old, new = uuid.uuid4(), uuid.uuid4()
            layouts = {
                "plain": self.plain(old, new),
                "shared": self.stamped("curated.fleet_trips", list(STAMP_COLUMNS), old, new),
                "no_scope": self.stamped(
                    "layouts.no_scope", ["tenant_id", "ingestion_batch_id"], old, new
                ),
                "partition": self.partition(old, new),
            }
            for name, (load, replace) in layouts.items():
                seconds.setdefault(f"{name} first", []).append(self.timed(load))
                seconds.setdefault(f"{name} replace", []).append(self.timed(replace))
            progress(
                f"round {round_number}: "
                + ", ".join(f"{k} {v[-1]:.2f}" for k, v in seconds.items())
            )
        return seconds

    def reader_waits(self) -> dict[str, str]:
        """Each layout's replace beside a reader holding a transaction open on its table."""
        outcome = {}
        for name, table in (
            ("shared", "curated.fleet_trips"),
            ("partition", "layouts.partitioned"),
        ):
            old = self.current_batch(table)
            new = uuid.uuid4()
            _, replace = (
                self.partition(old, new)
                if name == "partition"
                else self.stamped(table, list(STAMP_COLUMNS), old, new)
            )
            with psycopg.connect(libpq_url(self.url)) as reader:
                reader.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.SQL(table)))
                started = time.perf_counter()
                try:
                    with psycopg.connect(libpq_url(self.url)) as conn, conn.cursor() as cur:
                        cur.execute(f"SET lock_timeout = '{_READER_LOCK_TIMEOUT}'")
                        replace(cur)
                        conn.commit()
                    outcome[name] = f"committed in {time.perf_counter() - started:.2f} s"
                except psycopg.errors.LockNotAvailable:
                    outcome[name] = f"waited for the reader: lock_timeout {_READER_LOCK_TIMEOUT}"
                reader.rollback()
        return outcome

    def current_batch(self, table: str) -> uuid.UUID:
        with psycopg.connect(libpq_url(self.url)) as conn:
            row = conn.execute(
                sql.SQL("SELECT ingestion_batch_id FROM {} LIMIT 1").format(sql.SQL(table))
            ).fetchone()
        assert row is not None
        return row[0]

    def plans(self) -> list[str]:
        batch = self.current_batch("layouts.partitioned")
        lines = []
        with psycopg.connect(libpq_url(self.url)) as conn:
            conn.execute("ANALYZE layouts.partitioned")
            for query, argument in (
                ("SELECT count(*) FROM layouts.partitioned WHERE ingestion_batch_id = %s", batch),
                (
                    "SELECT count(*) FROM layouts.partitioned"
                    " WHERE tenant_id = 'bench' AND source_scope = %s",
                    SCOPE,
                ),
            ):
                lines.append(query)
                plan = conn.execute("EXPLAIN (COSTS OFF) " + query, [argument]).fetchall()
                lines += [f"  {row[0]}" for row in plan]
        return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args()
    with fresh_database(args.database_url, prefix="fleet_layouts") as url:
        PostgresWarehouse(url).ensure_tables([TRIPS])
        layouts = Layouts(url, args.rows)
        medians = {k: statistics.median(v) for k, v in layouts.rounds(args.repeat).items()}
        waits = layouts.reader_waits()
        plans = layouts.plans()
    print(
        f"\nbackend CPU seconds for {args.rows:,} rows, median of {args.repeat} "
        "(and / plain first):"
    )
    for name, value in medians.items():
        print(f"  {name:<20} {value:6.2f}  {value / medians['plain first']:5.2f}")
    print("a replace beside a reader with an open transaction on the table:")
    for name, text in waits.items():
        print(f"  {name:<20} {text}")
    print("the partition layout's reads:")
    print("\n".join(f"  {line}" for line in plans))
    plain = medians["plain first"]
    print(
        "slice layouts: "
        + " ".join(
            f"{name.replace(' ', '_')}={value / plain:.2f}" for name, value in medians.items()
        )
    )


if __name__ == "__main__":
    main()
