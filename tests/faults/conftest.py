"""What the fault tests share: a fault proxy in front of the warehouse PostgreSQL (the
operational database stays direct), `fleet-import run` as a subprocess pointed through it,
and the invariants read after recovery (tests/reliability/conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pytest

from fleet_import.config import libpq_url
from fleet_import.sample_data import today_folder
from fleet_import.scope import split_folder
from tests.faults.proxy import FaultProxy, proxied_url
from tests.reliability.conftest import (
    REFRESH_SQL,
    REPO,
    Source,
    connect,
    create_refresh_table,
    invariant_violations,
    make_source,
    slice_differences,
    upload_sources,
)

CLI_TIMEOUT_SECONDS = 180
LEASE_TTL_SECONDS = 4.0
"""Short, so a batch left with its lease released is abandoned, and taken over, soon."""
# The lost reply: the slice transaction's COMMIT (the one after the registry is stamped).
SLICE_COMMIT = r"^\s*commit\b"
AFTER_STAMP = r"insert\s+into\s+\S*ingestion_slices"


@pytest.fixture
def warehouse_proxy(database_url: str) -> Iterator[FaultProxy]:
    parts = urlsplit(libpq_url(database_url))
    with FaultProxy((parts.hostname or "127.0.0.1", parts.port or 5432)) as proxy:
        yield proxy


@pytest.fixture
def source(s3: Any, landing_bucket: str, database_url: str) -> Source:
    """One small delivery of the three Fleet datasets, uploaded, and the refresh side-effect
    table (one row per run of refresh_dependants: publication runs once)."""
    _, prefix = split_folder(today_folder(landing_bucket, "acme"))
    name = prefix.rstrip("/").rsplit("/", 1)[-1]
    delivery = make_source(landing_bucket, "acme", name, seed=26, trips=300, fuel=40, vehicles=6)
    upload_sources(s3, [delivery])
    create_refresh_table(database_url)
    return delivery


@pytest.fixture
def cli_env(flow_env: str, warehouse_proxy: FaultProxy, database_url: str) -> dict[str, str]:
    from prefect.settings import PREFECT_API_URL

    return {
        **os.environ,
        "PREFECT_API_URL": PREFECT_API_URL.value(),
        "FLEET_WAREHOUSE_URL": proxied_url(database_url, warehouse_proxy),
        "FLEET_LEASE_TTL_SECONDS": str(LEASE_TTL_SECONDS),
        "FLEET_REFRESH_SQL": json.dumps([REFRESH_SQL]),
        "PYTHONPATH": str(REPO),
        "COLUMNS": "200",
    }


@dataclass(frozen=True)
class CliRun:
    returncode: int
    out: str

    @property
    def traceback(self) -> bool:
        return "Traceback" in self.out


def run_cli(env: dict[str, str], *args: str) -> CliRun:
    child = subprocess.run(
        [sys.executable, "-m", "fleet_cli", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_SECONDS,
    )
    return CliRun(child.returncode, child.stdout + child.stderr)


def batch_rows(database_url: str) -> list[tuple[Any, ...]]:
    """(id, status, execution_lease_id, details) of every fleet batch, oldest first."""
    with connect(database_url) as conn:
        return conn.execute(
            "SELECT id, status, execution_lease_id, details FROM ingestion_batches "
            "WHERE source_scope IS NOT NULL ORDER BY created_at, id"
        ).fetchall()


def recovered_invariants(database_url: str, source: Source) -> list[str]:
    """After recovery: nothing running, every stamp a succeeded batch's, the slice exactly
    the delivery's rows, owned by one succeeded batch."""
    problems = invariant_violations(database_url, final=True)
    rows = batch_rows(database_url)
    problems += [f"batch {b[0]} still running" for b in rows if b[1] == "running"]
    succeeded = [b[0] for b in rows if b[1] == "succeeded"]
    if len(succeeded) != 1:
        problems.append(f"succeeded batches: {succeeded}")
    with connect(database_url) as conn:
        problems += slice_differences(conn, source, succeeded[0] if succeeded else None)
    return problems
