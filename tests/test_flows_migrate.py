"""A curated table of an older contract's shape under Prefect's test harness (issue 25, part
4): the import flow stops at its start, before any batch is reserved, naming the command;
`fleet-import tables migrate --apply` converts the table holding the earlier slice, and the
next import loads and stamps the delivery."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from typer.testing import CliRunner

from fleet_cli.cli import app
from fleet_import.sample_data import fleet_delivery, today_folder
from fleet_import.store.repository import BatchRepository
from flows.import_s3_folder import import_s3_folder
from flows.reporting import ExitCode, exit_code_for
from tests.helpers import slice_rows, upload

pytestmark = pytest.mark.slow
TABLE = "curated.fleet_fuel_transactions"


def test_an_import_stops_before_reserving_until_tables_migrate_applies(
    flow_env: str, db: psycopg.Connection[Any], s3: Any, landing_bucket: str
) -> None:
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=50))
    db.execute(
        f"ALTER TABLE {TABLE} ALTER COLUMN total_amount TYPE double precision,"
        " ALTER COLUMN price_per_litre TYPE double precision"
    )
    stopped = import_s3_folder(tenant_id="acme", folder=folder, return_state=True)
    assert stopped.is_failed() and exit_code_for(stopped) == ExitCode.FAILED
    assert "does not match dataset 'fuel_transactions'" in stopped.message
    assert "fleet-import tables migrate --tenant acme --apply" in stopped.message
    assert BatchRepository(flow_env).list() == []

    env = {"FLEET_DATABASE_URL": flow_env, "COLUMNS": "200"}
    migrated = CliRunner().invoke(
        app, ["tables", "migrate", "--tenant", "acme", "--apply"], env=env
    )
    assert migrated.exit_code == 0, migrated.output
    assert "migrated (in place)" in migrated.output

    loaded = import_s3_folder(tenant_id="acme", folder=folder, return_state=True)
    assert loaded.name == "Completed", loaded.message
    (owner,) = slice_rows(flow_env, "fleet_fuel_transactions", "acme", folder)
    assert owner[1] > 0
    kinds = dict(
        db.execute(
            "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a"
            f" WHERE a.attrelid = '{TABLE}'::regclass AND a.attnum > 0"
        ).fetchall()
    )
    assert kinds["total_amount"] == "numeric(12,2)"
