"""Run one import in a child process, so tests can kill it at a failpoint.

Usage: python -m tests.import_child DATABASE_URL S3_ENDPOINT STAGING_URI TENANT FOLDER KEY TTL
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from fleet_import.importing.context import ImportContext
from fleet_import.importing.driver import import_folder
from fleet_import.s3.client import s3_client
from fleet_import.s3.staging import StagingArea
from fleet_import.scope import Tenant
from fleet_import.store.repository import BatchRepository
from fleet_import.warehouse.base import Warehouse
from fleet_import.warehouse.postgres.warehouse import PostgresWarehouse


def peak_rss_kb() -> int:
    """VmHWM: this process's own peak. (getrusage's ru_maxrss survives exec on Linux, so a
    child would report its parent's peak.)"""
    status = Path("/proc/self/status").read_text()
    return int(status.split("VmHWM:")[1].split()[0])


def _warehouse(database_url: str, s3: object) -> Warehouse:
    """PostgreSQL, or Redshift through the test emulator when FLEET_TEST_REDSHIFT holds
    {"connect": {...}, "staging_uri": ..., "iam_role": ...}."""
    redshift = os.environ.get("FLEET_TEST_REDSHIFT")
    if not redshift:
        return PostgresWarehouse(database_url)
    from fleet_import.warehouse.redshift.warehouse import RedshiftWarehouse

    config = json.loads(redshift)
    return RedshiftWarehouse(
        config["connect"],
        s3=s3,
        staging_uri=config["staging_uri"],
        iam_role=config["iam_role"],
        **({"lock_wait_seconds": config["lock_wait"]} if "lock_wait" in config else {}),
    )


def main(argv: list[str]) -> int:
    database_url, endpoint, staging_uri, tenant_id, folder, key, ttl, workdir = argv
    s3 = s3_client(endpoint)
    ctx = ImportContext(
        repo=BatchRepository(database_url),
        warehouse=_warehouse(database_url, s3),
        s3=s3,
        staging=StagingArea(staging_uri, s3),
        lease_ttl=float(ttl),
        workdir=Path(workdir),
    )
    outcome = import_folder(ctx, Tenant.named(tenant_id), folder, key)
    print(type(outcome).__name__, flush=True)
    print(f"maxrss_kb={peak_rss_kb()}", flush=True)
    return 0


KILLED = 86  # fleet_import.failpoints' exit code


def run_import_child(
    database_url: str,
    endpoint: str,
    staging_bucket: str,
    folder: str,
    key: str,
    *,
    workdir: Path,
    ttl: float = 1.5,
    env: dict[str, str] | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """Run one import of tenant acme in a child process (FLEET_FAILPOINTS etc. in `env`)."""
    arguments = [
        database_url,
        endpoint,
        f"s3://{staging_bucket}/stage/",
        "acme",
        folder,
        key,
        str(ttl),
        str(workdir),
    ]
    return subprocess.run(
        [sys.executable, "-m", "tests.import_child", *arguments],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
