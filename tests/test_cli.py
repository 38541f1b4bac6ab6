"""The CLI as users run it: a real subprocess against a real database."""

from __future__ import annotations

import os
import subprocess
import sys

from fleet_import.batches import BatchRepository, FailureKind
from fleet_import.scope import Tenant, source_scope


def run_cli(*args: str, database_url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FLEET_DATABASE_URL": database_url, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "fleet_import.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_db_upgrade_then_batches_list(empty_database_url: str) -> None:
    upgraded = run_cli("db", "upgrade", database_url=empty_database_url)
    assert upgraded.returncode == 0, upgraded.stderr
    assert "revision 0003" in upgraded.stdout
    again = run_cli("db", "upgrade", database_url=empty_database_url)
    assert again.returncode == 0, again.stderr

    repo = BatchRepository(empty_database_url)
    acme = repo.reserve(Tenant.named("acme"), source_scope("s3://fleet-landing/acme/a/"), "d1")
    globex = repo.reserve(
        Tenant.named("globex"), source_scope("s3://fleet-landing/globex/a/"), "d1"
    )
    repo.mark_failed(globex.batch.id, None, FailureKind.ENQUEUE_FAILED, "no worker")

    listed = run_cli("batches", "list", database_url=empty_database_url)
    assert listed.returncode == 0, listed.stderr
    assert str(acme.batch.id) in listed.stdout and str(globex.batch.id) in listed.stdout
    assert "failed (enqueue_failed)" in listed.stdout

    only_acme = run_cli("batches", "list", "--tenant", "acme", database_url=empty_database_url)
    assert str(acme.batch.id) in only_acme.stdout and "globex" not in only_acme.stdout
    failed = run_cli("batches", "list", "--status", "failed", database_url=empty_database_url)
    assert str(globex.batch.id) in failed.stdout and str(acme.batch.id) not in failed.stdout


def test_unreachable_database_is_a_clear_error(pg_server_url: str) -> None:
    from tests.pgtools import with_dbname

    result = run_cli("batches", "list", database_url=with_dbname(pg_server_url, "nope_missing"))
    assert result.returncode == 1
    assert "error:" in result.stderr and "operational database error" in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_status_is_rejected(database_url: str) -> None:
    result = run_cli("batches", "list", "--status", "exploded", database_url=database_url)
    assert result.returncode == 2
    assert "exploded" in result.stderr
