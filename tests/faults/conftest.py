"""What the fault tests share: a fault proxy in front of the warehouse PostgreSQL (the
operational database stays direct), `fleet-import run` as a subprocess pointed through it,
and the invariants read after recovery (tests/reliability/conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from fleet_import.sample_data import today_folder
from fleet_import.scope import split_folder
from tests.faults.proxy import FaultProxy, postgres_address, proxied_url
from tests.reliability.conftest import (
    REFRESH_SQL,
    REPO,
    Source,
    connect,
    create_refresh_table,
    make_source,
    slice_differences,
    slice_rows,
    upload_sources,
)

CUT_HANDSHAKE_SOCKETS = pytest.mark.filterwarnings(
    r"ignore:Exception ignored in. <socket\.socket:pytest.PytestUnraisableExceptionWarning"
)
"""A connection the proxy cuts while a driver is still opening it leaves that driver's
socket unclosed (redshift_connector creates it in the constructor that raises, so no caller
holds it to close); the garbage collector reports it in whichever later test it happens to
run (seen once in CI, at a Redshift path cell's setup). The fault tests cut connections on
purpose, so there it is expected; everywhere else it still fails the test."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("faults"):
            item.add_marker(CUT_HANDSHAKE_SOCKETS)


CLI_TIMEOUT_SECONDS = 180
LEASE_TTL_SECONDS = 4.0
"""Short, so a batch left with its lease released is abandoned, and taken over, soon."""
# The lost reply: the slice transaction's COMMIT (the one after the registry is stamped).
SLICE_COMMIT = r"^\s*commit\b"
AFTER_STAMP = r"insert\s+into\s+\S*ingestion_slices"


@pytest.fixture
def warehouse_proxy(database_url: str) -> Iterator[FaultProxy]:
    with FaultProxy(postgres_address(database_url)) as proxy:
        yield proxy


@pytest.fixture
def operational_proxy(warehouse_proxy: FaultProxy) -> FaultProxy:
    """The same upstream server; a test that takes this one points only the operational
    database through it (the warehouse stays direct)."""
    return warehouse_proxy


@pytest.fixture
def redshift_proxy(emulator: Any) -> Iterator[FaultProxy]:  # noqa: F811 (the fixture)
    """A fault proxy in front of the Redshift emulator (the `emulator` fixture below)."""
    with FaultProxy(("127.0.0.1", emulator.port)) as proxy:
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
    """After recovery: no batch running, every batch's status what the warehouse stamp says
    (the slice owned by exactly one succeeded batch, the registry counts its rows), and the
    slice exactly the delivery's rows. Stamps compare as text: Redshift keeps them varchar."""
    rows = batch_rows(database_url)
    problems = [f"batch {b[0]} still running" for b in rows if b[1] == "running"]
    status = {str(b[0]): b[1] for b in rows}
    with connect(database_url) as conn:
        registry = conn.execute(
            "SELECT dataset, batch_id::text, row_count FROM curated.ingestion_slices "
            "WHERE tenant_id = %s AND source_scope = %s",
            (source.tenant_id, source.scope),
        ).fetchall()
        owners = {owner for _, owner, _ in registry}
        if len(owners) != 1:
            problems.append(f"the slice registry names {sorted(owners)}")
        for owner in owners:
            if status.get(owner) != "succeeded":
                problems.append(f"the slice is stamped by {owner}, which is {status.get(owner)}")
        succeeded = [b for b, s in status.items() if s == "succeeded"]
        if succeeded != sorted(owners):
            problems.append(f"succeeded batches {succeeded}, slice owners {sorted(owners)}")
        problems += slice_differences(conn, source)
        for dataset, (_, stamps) in slice_rows(conn, source.tenant_id, source.scope).items():
            counted = Counter(str(stamp) for stamp in stamps)
            registered = {owner: n for d, owner, n in registry if d == dataset and n}
            if dict(counted) != registered:
                problems.append(f"{dataset}: rows by stamp {dict(counted)}, registry {registered}")
    return problems


# The Redshift emulator of tests/warehouse (both modes), reused, not written again.
from tests.warehouse.conftest import emulator  # noqa: E402, F401


def matrix_cells(cells: Mapping[tuple[str, str], str], sampled: set[tuple[str, str]]) -> list[Any]:
    """(phase, fault) parameters of a fault matrix, one per distinct recovery path: `cells`
    maps each kept cell to the path it stands for (the other cells of phase x fault meet the
    same code, and the module's docstring says which). The `sampled` cells are marked
    `faults_sample`, which `make test` runs too (`make test-faults` runs them all)."""
    unknown = sampled - set(cells)
    assert not unknown, f"sampled cells that are not in the matrix: {unknown}"
    return [
        pytest.param(
            phase,
            fault,
            id=f"{phase}-{fault}",
            marks=[pytest.mark.faults_sample] if (phase, fault) in sampled else [],
        )
        for phase, fault in cells
    ]


def wait_out_abandoned(database_url: str) -> None:
    """A batch left running without its executor is abandoned one lease TTL later, when the
    next delivery or the drain may take it over: wait that long only if one is left."""
    if any(status == "running" for _, status, _, _ in batch_rows(database_url)):
        time.sleep(LEASE_TTL_SECONDS + 0.5)
