"""Shared helpers for the reliability tests: deterministic sources, child workers, and the
invariants a crash or a race must never break.

The operational store and the warehouse share one test database, so every invariant is
read in one REPEATABLE READ snapshot: a check taken while workers run sees one instant.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from fleet_import.config import libpq_url
from fleet_import.contracts.fleet import FLEET_DATASETS, FUEL_TRANSACTIONS
from fleet_import.contracts.model import DatasetContract
from fleet_import.sample_data import (
    csv_bytes,
    fuel_table,
    parquet_bytes,
    trips_table,
    vehicles_table,
)
from fleet_import.scope import source_scope, split_folder
from tests.s3fixtures import put_objects

REPO = Path(__file__).resolve().parents[2]
KILLED = 86  # failpoints._EXIT_CODE
# A side-effect table for refresh_dependants: one row per run of the step.
REFRESH_TABLE = "curated.reliability_refreshes"
REFRESH_SQL = f"INSERT INTO {REFRESH_TABLE} DEFAULT VALUES"
SLICE_PUBLISHED = "fleet.slice.published"
_CHILD_TIMEOUT_SECONDS = 120


# -- sources ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """One immutable delivery: its files and the typed rows they must load as."""

    tenant_id: str
    folder: str
    files: dict[str, bytes]
    tables: dict[str, pa.Table]  # dataset -> source rows

    @property
    def scope(self) -> str:
        return source_scope(self.folder)


def make_source(
    bucket: str, tenant_id: str, name: str, *, seed: int, trips: int, fuel: int, vehicles: int
) -> Source:
    folder = f"s3://{bucket}/{tenant_id}/fleet/{name}/"
    half = trips // 2
    tables = {
        "vehicles": vehicles_table(vehicles, seed=seed),
        "trips": pa.concat_tables(
            [
                trips_table(half, seed=seed, vehicles=vehicles),
                trips_table(trips - half, start=half, seed=seed, vehicles=vehicles),
            ]
        ),
        "fuel_transactions": fuel_table(fuel, seed=seed, vehicles=vehicles),
    }
    files = {
        "vehicles.csv": csv_bytes(tables["vehicles"]),
        "trips-1.csv": csv_bytes(tables["trips"].slice(0, half)),
        "trips-2.csv.gz": csv_bytes(tables["trips"].slice(half), gzipped=True),
        "fuel_transactions.parquet": parquet_bytes(tables["fuel_transactions"], FUEL_TRANSACTIONS),
    }
    return Source(tenant_id, folder, files, tables)


def upload_sources(s3: Any, sources: list[Source]) -> None:
    by_bucket: dict[str, dict[str, bytes]] = {}
    for source in sources:
        bucket, prefix = split_folder(source.folder)
        objects = by_bucket.setdefault(bucket, {})
        objects.update({prefix + name: data for name, data in source.files.items()})
    for bucket, objects in by_bucket.items():
        put_objects(s3, bucket, objects)


def _key_order(contract: DatasetContract) -> list[int]:
    names = contract.column_names
    return [names.index(k) for k in contract.natural_key]


def expected_rows(source: Source) -> dict[str, list[tuple]]:
    """The source's rows typed as the contract types them, sorted by natural key."""
    rows: dict[str, list[tuple]] = {}
    for dataset, table in source.tables.items():
        contract = FLEET_DATASETS[dataset]
        typed = table.select(contract.column_names).cast(contract.arrow_schema)
        keys = _key_order(contract)
        tuples = [tuple(r.values()) for r in typed.to_pylist()]
        rows[dataset] = sorted(tuples, key=lambda r, k=keys: tuple(r[i] for i in k))
    return rows


# -- reading the warehouse and the store -------------------------------------------------------


def connect(database_url: str) -> psycopg.Connection:
    return psycopg.connect(libpq_url(database_url), autocommit=False)


def slice_rows(
    conn: psycopg.Connection, tenant_id: str, scope: str
) -> dict[str, tuple[list[tuple], list[uuid.UUID]]]:
    """dataset -> (contract columns of every row, sorted by natural key; each row's stamp)."""
    result: dict[str, tuple[list[tuple], list[uuid.UUID]]] = {}
    for contract in FLEET_DATASETS.values():
        schema, table = contract.target_table.split(".")
        columns = sql.SQL(", ").join(sql.Identifier(c) for c in contract.column_names)
        order = sql.SQL(", ").join(sql.Identifier(k) for k in contract.natural_key)
        query = sql.SQL(
            "SELECT {cols}, ingestion_batch_id FROM {table} "
            "WHERE tenant_id = %s AND source_scope = %s ORDER BY {order}"
        ).format(cols=columns, table=sql.Identifier(schema, table), order=order)
        fetched = conn.execute(query, (tenant_id, scope)).fetchall()
        result[contract.name] = ([tuple(r[:-1]) for r in fetched], [r[-1] for r in fetched])
    return result


def registry(conn: psycopg.Connection) -> dict[tuple[str, str], dict[str, tuple[uuid.UUID, int]]]:
    """(tenant, scope) -> dataset -> (batch_id, row_count) from curated.ingestion_slices."""
    out: dict[tuple[str, str], dict[str, tuple[uuid.UUID, int]]] = {}
    for tenant, scope, dataset, batch_id, count in conn.execute(
        "SELECT tenant_id, source_scope, dataset, batch_id, row_count FROM curated.ingestion_slices"
    ):
        out.setdefault((tenant, scope), {})[dataset] = (batch_id, count)
    return out


def slice_differences(
    conn: psycopg.Connection, source: Source, owner: uuid.UUID | None = None
) -> list[str]:
    """Why the slice of `source` is not exactly its source rows, stamped by one batch (and
    by `owner` when given); empty when it is."""
    problems: list[str] = []
    expected = expected_rows(source)
    actual = slice_rows(conn, source.tenant_id, source.scope)
    stamps: set[uuid.UUID] = set()
    where = f"{source.tenant_id} {source.folder}"
    for dataset, want in expected.items():
        rows, row_stamps = actual[dataset]
        stamps.update(row_stamps)
        contract = FLEET_DATASETS[dataset]
        keys = [tuple(r[i] for i in _key_order(contract)) for r in rows]
        duplicated = [k for k, n in Counter(keys).items() if n > 1]
        if duplicated:
            problems.append(f"{where} {dataset}: duplicate keys {duplicated[:5]}")
        if rows != want:
            missing = len(set(want) - set(rows))
            extra = len(set(rows) - set(want))
            problems.append(
                f"{where} {dataset}: {len(rows)} rows, expected {len(want)} "
                f"({missing} missing, {extra} unexpected)"
            )
    if len(stamps) > 1:
        problems.append(f"{where}: rows stamped by several batches {sorted(map(str, stamps))}")
    if owner is not None and stamps != {owner}:
        problems.append(f"{where}: rows stamped {sorted(map(str, stamps))}, expected {owner}")
    return problems


def snapshot(database_url: str) -> psycopg.Connection:
    """A connection whose next transaction reads one consistent snapshot."""
    conn = connect(database_url)
    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    return conn


def invariant_violations(database_url: str, *, final: bool = False) -> list[str]:
    """What may never be seen, at any instant: two running batches of one scope; a slice
    stamped by a batch that neither succeeded nor can still be resumed or recovered; a row
    whose stamp differs from the registry's; a registry count that differs from the rows.
    `final` (nothing runs any more): every stamp belongs to a succeeded batch."""
    problems: list[str] = []
    with snapshot(database_url) as conn:
        for tenant, scope, n in conn.execute(
            "SELECT tenant_id, source_scope, count(*) FROM ingestion_batches "
            "WHERE status = 'running' GROUP BY 1, 2 HAVING count(*) > 1"
        ):
            problems.append(f"{n} running batches for {tenant} {scope}")
        batches = {
            row[0]: row[1:]
            for row in conn.execute(
                "SELECT id, status, details FROM ingestion_batches WHERE source_scope IS NOT NULL"
            )
        }
        for (tenant, scope), datasets in registry(conn).items():
            owners = {batch_id for batch_id, _ in datasets.values()}
            if len(owners) != 1:
                problems.append(f"{tenant} {scope}: registry names several batches {owners}")
            for owner in owners:
                status, details = batches.get(owner, (None, {}))
                failure = details.get("failure") or {}
                resumable = (
                    status == "failed"
                    and failure.get("kind") == "failed_publication"
                    and details.get("warehouse_committed")
                    and not details.get("publication_expired")
                )
                # A running batch may own the stamp before it recorded the commit (died
                # between the warehouse and the operational commit): the stamp recovers it.
                allowed = status == "succeeded" or resumable or (status == "running" and not final)
                if not allowed:
                    problems.append(
                        f"{tenant} {scope}: stamped by batch {owner} which is {status} "
                        f"({failure.get('kind')})"
                    )
            for contract in FLEET_DATASETS.values():
                schema, table = contract.target_table.split(".")
                counted = conn.execute(
                    sql.SQL(
                        "SELECT ingestion_batch_id, count(*) FROM {} "
                        "WHERE tenant_id = %s AND source_scope = %s GROUP BY 1"
                    ).format(sql.Identifier(schema, table)),
                    (tenant, scope),
                ).fetchall()
                registered = datasets.get(contract.name)
                got = {batch_id: n for batch_id, n in counted}
                want = {registered[0]: registered[1]} if registered and registered[1] else {}
                if got != want:
                    problems.append(
                        f"{tenant} {scope} {contract.name}: rows {got}, registry {registered}"
                    )
        conn.rollback()
    return problems


def running_batches(database_url: str) -> list[tuple[uuid.UUID, str, str]]:
    with connect(database_url) as conn:
        return conn.execute(
            "SELECT id, tenant_id, source_scope FROM ingestion_batches WHERE status = 'running'"
        ).fetchall()


def create_refresh_table(database_url: str) -> None:
    with connect(database_url) as conn:
        conn.execute("CREATE SCHEMA IF NOT EXISTS curated")
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {REFRESH_TABLE} "
            "(id bigserial PRIMARY KEY, at timestamptz NOT NULL DEFAULT clock_timestamp())"
        )


def refresh_count(database_url: str) -> int:
    with connect(database_url) as conn:
        return conn.execute(f"SELECT count(*) FROM {REFRESH_TABLE}").fetchone()[0]


def read_events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line torn by a SIGKILL mid-write carries no completed event
    return events


def published_counts(path: Path) -> Counter[str]:
    """fleet.slice.published events per batch id: what downstream consumers were told."""
    return Counter(e["batch_id"] for e in read_events(path) if e["event"] == SLICE_PUBLISHED)


# -- child workers ---------------------------------------------------------------------------


@pytest.fixture
def child_config(database_url, moto_endpoint, staging_bucket, tmp_path) -> dict[str, Any]:
    """What a test's child workers share (soak_worker.build): its database, S3, staging
    area, work directory and event file. Tests add their lease TTL, tenant, path..."""
    return {
        "database_url": database_url,
        "endpoint": moto_endpoint,
        "staging_uri": f"s3://{staging_bucket}/stage/",
        "workdir": str(tmp_path / "work"),
        "events": str(tmp_path / "events.jsonl"),
    }


def on_path(path: str, request: pytest.FixtureRequest) -> dict[str, Any]:
    """The child config for `path`: "core" runs the core's calls, "flow" the flows (the
    same driver) against the session's Prefect API."""
    if path != "flow":
        return {"path": path}
    from prefect.settings import PREFECT_API_URL

    request.getfixturevalue("prefect_api")
    return {"path": path, "prefect_api_url": PREFECT_API_URL.value()}


def loaded_then_replaced(
    ctx: Any, s3: Any, landing_bucket: str, *, trips: int, fuel: int, vehicles: int
) -> tuple[Source, Source, Any]:
    """What each crash case starts from: acme's folder loaded and published by delivery
    d0 (40 trips, 10 fuel, 6 vehicles), then its files replaced by a second source of
    these sizes (same names, other rows). The old source, the new one, d0's outcome."""
    from fleet_import.importing.context import Committed
    from fleet_import.importing.driver import import_folder
    from fleet_import.scope import Tenant

    old = make_source(landing_bucket, "acme", "2026-07-22", seed=1, trips=40, fuel=10, vehicles=6)
    new = make_source(
        landing_bucket, "acme", "2026-07-22", seed=2, trips=trips, fuel=fuel, vehicles=vehicles
    )
    upload_sources(s3, [old])
    first = import_folder(ctx, Tenant.named("acme"), old.folder, "d0")
    assert isinstance(first, Committed) and first.published, first
    upload_sources(s3, [new])
    return old, new, first


def worker_command(config: Mapping[str, Any]) -> list[str]:
    return [sys.executable, "-m", "tests.reliability.soak_worker", json.dumps(dict(config))]


def worker_env(failpoints: str = "") -> dict[str, str]:
    env = {**os.environ, "FLEET_FAILPOINTS": failpoints, "PYTHONPATH": str(REPO)}
    env.pop("PYTEST_XDIST_WORKER", None)
    return env


def run_once(config: Mapping[str, Any], failpoints: str = "") -> subprocess.CompletedProcess:
    """One import in a child process; its last stdout line is the outcome as JSON."""
    return subprocess.run(
        worker_command({**config, "mode": "once"}),
        env=worker_env(failpoints),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=_CHILD_TIMEOUT_SECONDS,
    )


def outcome_of(child: subprocess.CompletedProcess) -> dict[str, Any]:
    lines = [line for line in child.stdout.splitlines() if line.startswith("{")]
    assert child.returncode == 0 and lines, (child.returncode, child.stdout, child.stderr)
    return json.loads(lines[-1])
