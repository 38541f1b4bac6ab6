"""The operational database gone for longer than the lease TTL while a slice loads (issue
#26, the fence), with real processes: `fleet-import run` as a child, a fault proxy between
it and the operational PostgreSQL (the warehouse stays direct), the connection cut and held
down longer than the lease TTL while the child is in the slice's COPY or about to COMMIT it.

The worker cannot renew its lease, so it must stop touching the warehouse before the lease
could have expired: its slice transaction rolled back, nothing of it committed while the
database is away, one line naming the operational database, a Failed run (exit 1). After
the outage a delivery with another key takes the batch over, the drain finds nothing left,
and the invariants hold: the slice row-exact, owned by one succeeded batch, loaded once,
no running batch. Cells: phase (copy, commit) x warehouse (PostgreSQL, Redshift emulator).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from flows.reporting import ExitCode
from tests.faults.conftest import (
    CLI_TIMEOUT_SECONDS,
    LEASE_TTL_SECONDS,
    batch_rows,
    recovered_invariants,
    run_cli,
)
from tests.faults.proxy import FaultProxy, proxied_url
from tests.reliability.conftest import REFRESH_SQL, REPO, Source, connect, refresh_count

pytestmark = [pytest.mark.faults, pytest.mark.slow]

OUTAGE_SECONDS = LEASE_TTL_SECONDS * 2.5
"""Longer than the lease TTL: the database's clock expires the lease meanwhile."""
UNCONFIRMED_SECONDS = LEASE_TTL_SECONDS * 0.8 + 1.0
"""How long the held worker is kept from renewing before it goes on: past its fence."""
REACH_TIMEOUT_SECONDS = 120.0

# Where the child is held (failpoints) while the cut is made, and how the test sees it
# got there (the batch's details, read directly).
PHASES: dict[str, tuple[str, Callable[[dict[str, Any]], bool]]] = {
    # In the slice transaction (open, its session recorded), between a file and its COPY.
    "copy": ("after_normalized_file", lambda details: "warehouse_session" in details),
    # Loaded, judged, lease renewed, `commit_attempted` recorded: the COMMIT is next.
    "commit": ("before_warehouse_commit", lambda details: bool(details.get("commit_attempted"))),
}
CELLS = [
    pytest.param(phase, backend, id=f"{phase}-{backend}")
    for phase in PHASES
    for backend in ("postgres", "redshift")
]
"""None sampled into `make test`: each cell holds a database down 2.5 lease TTLs under a
child `fleet-import run` (about 25 s); `make test-faults` runs them."""
"""Each phase on PostgreSQL and on Redshift through the emulator (provisioned)."""


def _wait_for(
    reached: Callable[[dict[str, Any]], bool], database_url: str, child: subprocess.Popen[str]
) -> None:
    deadline = time.monotonic() + REACH_TIMEOUT_SECONDS
    while time.monotonic() < deadline and child.poll() is None:
        rows = batch_rows(database_url)
        if rows and reached(rows[0][3]):
            return
        time.sleep(0.1)
    out = child.communicate(timeout=CLI_TIMEOUT_SECONDS)[0] if child.poll() is not None else ""
    raise AssertionError(f"the child never reached its hold: {batch_rows(database_url)}\n{out}")


def _registry_owners(database_url: str, source: Source) -> list[str]:
    with connect(database_url) as conn:
        exists = conn.execute("SELECT to_regclass('curated.ingestion_slices')").fetchone()[0]
        if exists is None:
            return []
        rows = conn.execute(
            "SELECT DISTINCT batch_id::text FROM curated.ingestion_slices "
            "WHERE tenant_id = %s AND source_scope = %s",
            (source.tenant_id, source.scope),
        ).fetchall()
    return [row[0] for row in rows]


@pytest.mark.parametrize(("phase", "warehouse"), CELLS, indirect=["warehouse"])
def test_an_outage_longer_than_the_lease_fences_the_worker(
    phase: str,
    warehouse: Any,
    cli_env: dict[str, str],
    warehouse_proxy: FaultProxy,
    source: Source,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    proxy = warehouse_proxy  # the same server; here only the operational store goes through it
    point, reached = PHASES[phase]
    go = tmp_path / "go"
    env = {**cli_env, "FLEET_DATABASE_URL": proxied_url(database_url, proxy)}
    env.pop("FLEET_WAREHOUSE_URL")  # direct: the database's own URL, or the emulator's settings
    if env.get("FLEET_WAREHOUSE", "postgres") == "postgres":
        env["FLEET_WAREHOUSE_URL"] = database_url
    child = subprocess.Popen(
        [sys.executable, "-m", "fleet_cli", "run", "--tenant", "acme", "--delivery-key", "d1"]
        + [source.folder],
        env={**env, "FLEET_FAILPOINTS": f"{point}=wait:{go}"},
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        _wait_for(reached, database_url, child)
        time.sleep(1.0)  # the delivery's few small files are normalized by now
        proxy.refuse(OUTAGE_SECONDS)
        proxy.reset_all()  # the cut: every open connection, and no new one for a while
        cut_at = time.monotonic()
        time.sleep(UNCONFIRMED_SECONDS)
        go.touch()  # the worker goes on, its lease unconfirmed past the fence
        out, _ = child.communicate(timeout=CLI_TIMEOUT_SECONDS)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    fenced_at = time.monotonic() - cut_at
    # Nothing of the fenced worker's slice committed, and it said why in one line.
    assert _registry_owners(database_url, source) == [], out
    assert child.returncode == ExitCode.FAILED, out
    assert "Traceback" not in out, out
    [line] = [line for line in out.splitlines() if line.startswith("Failed:")]
    assert "operational database has not confirmed the lease" in line, out
    assert line.endswith("check FLEET_DATABASE_URL (host:port) and that the server runs"), out

    time.sleep(max(0.0, OUTAGE_SECONDS - fenced_at))
    proxy.pass_through()  # the operational database is back
    [(batch_id, status, _lease, details)] = batch_rows(database_url)
    assert status == "running" and "failure" not in details  # left to its successor
    time.sleep(LEASE_TTL_SECONDS + 0.5)  # its lease has expired by the database's clock

    successor = run_cli(env, "run", "--tenant", "acme", "--delivery-key", "d2", source.folder)
    assert successor.returncode == ExitCode.SUCCEEDED, successor.out
    assert not successor.traceback, successor.out

    from flows.drain_publications import drain_publications

    monkeypatch.setenv("FLEET_LEASE_TTL_SECONDS", str(LEASE_TTL_SECONDS))
    monkeypatch.setenv("FLEET_REFRESH_SQL", json.dumps([REFRESH_SQL]))
    drain_publications(limit=10)

    assert recovered_invariants(database_url, source) == []
    assert refresh_count(database_url) == 1  # published once
    rows = batch_rows(database_url)
    assert all(row[2] is None for row in rows), rows  # no lease left behind
    succeeded = [row for row in rows if row[1] == "succeeded"]
    assert len(succeeded) == 1, rows
    # The successor took the batch over: continued (same content) or failed it abandoned.
    if str(succeeded[0][0]) != str(batch_id):
        assert dict((str(r[0]), r[1]) for r in rows)[str(batch_id)] == "failed", rows
