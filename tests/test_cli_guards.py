"""`fleet-import run` of a shrinking redelivery, `batches list --status held`, `batches
approve` and `batches reject`, as users run them: subprocesses (issue #24)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fleet_import.sample_data import csv_bytes, fleet_delivery, today_folder, trips_table
from fleet_import.store.repository import BatchRepository
from tests.helpers import slice_rows, upload
from tests.importing.guard_helpers import redeliver, slice_snapshot
from tests.warehouse_helpers import WAREHOUSE_BACKENDS

pytestmark = pytest.mark.slow


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fleet_cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )


@pytest.fixture
def api_env(flow_env: str) -> dict[str, str]:
    from prefect.settings import PREFECT_API_URL

    return {"PREFECT_API_URL": PREFECT_API_URL.value()}


@pytest.mark.parametrize("warehouse", WAREHOUSE_BACKENDS, indirect=True)
def test_held_listed_rejected_then_approved_from_the_cli(
    flow_env: str, api_env, s3, landing_bucket: str
) -> None:
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=400))
    assert cli("run", "--tenant", "acme", folder, env=api_env).returncode == 0
    before = slice_snapshot(flow_env, folder)

    header = csv_bytes(trips_table(1)).split(b"\n", 1)[0] + b"\n"
    redeliver(s3, folder, {"trips-1.csv": header})  # header only: would empty trips
    held = cli("run", "--tenant", "acme", folder, env=api_env)
    assert held.returncode == 6, held.stdout + held.stderr
    assert held.stdout.startswith("Held: ") and "allow_empty false" in held.stdout
    assert slice_snapshot(flow_env, folder) == before
    repo = BatchRepository(flow_env)
    assert repo.list(status="running") == []
    (first_held,) = repo.list(status="failed")

    listed = cli("batches", "list", "--status", "held", "--json", env=api_env)
    assert listed.returncode == 0, listed.stderr
    assert [b["id"] for b in json.loads(listed.stdout)] == [str(first_held.id)]
    rejected = cli("batches", "reject", str(first_held.id)[:8], env=api_env)
    assert rejected.returncode == 0, rejected.stdout + rejected.stderr
    assert "rejected" in rejected.stdout
    listed = cli("batches", "list", "--status", "held", env=api_env)
    assert "no batches wait for review" in listed.stdout

    redeliver(s3, folder, {"trips-1.csv": csv_bytes(trips_table(10))})  # truncated
    held = cli("run", "--tenant", "acme", folder, env=api_env)
    assert held.returncode == 6 and "to 10 (min_rows_ratio 0.5)" in held.stdout, held.stdout
    (second,) = [b for b in repo.list(status="failed") if b.id != first_held.id]
    approved = cli("batches", "approve", str(second.id), env=api_env)
    assert approved.returncode == 0, approved.stdout + approved.stderr
    assert approved.stdout.startswith("Completed: ")
    (owner,) = slice_rows(flow_env, "fleet_trips", "acme", folder)
    assert owner[1] == 10
    refused = cli("batches", "approve", str(first_held.id), env=api_env)
    assert refused.returncode == 1 and "already rejected" in refused.stdout, refused.stdout
