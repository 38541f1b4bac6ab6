"""`fleet-import tenants purge`: no row, slice-registry row or staged file of the tenant
is left, nothing of any other tenant changes, and the purge is a batch of its own."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
from typer.testing import CliRunner

from fleet_cli.cli import app
from fleet_import.config import Settings
from fleet_import.importing.context import Committed
from fleet_import.importing.driver import import_folder
from fleet_import.importing.runtime import build_runtime
from fleet_import.intake.admission import admit
from fleet_import.sample_data import fleet_delivery, today_folder
from fleet_import.scope import Tenant, source_scope
from fleet_import.store.models import BatchStatus
from fleet_import.store.repository import BatchRepository
from fleet_import.tenants.databases import postgres_url_for
from tests.helpers import upload

TABLES = ("fleet_trips", "fleet_vehicles", "fleet_fuel_transactions", "ingestion_slices")


def _env(settings: Settings) -> dict[str, str]:
    return {
        f"FLEET_{name.upper()}": str(value)
        for name, value in settings.model_dump().items()
        if name in {"database_url", "warehouse_url", "s3_endpoint_url", "staging_uri", "tenants"}
    }


def _snapshot(url: str) -> dict[str, list[tuple]]:
    """Every row of every curated table, with its row version: what 'unchanged' means."""
    with psycopg.connect(url) as conn:
        return {
            table: conn.execute(
                f"SELECT xmin::text, ctid::text, tenant_id FROM curated.{table} ORDER BY 2"
            ).fetchall()
            for table in TABLES
        }


def _staged(s3, bucket: str) -> set[str]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return {obj["Key"] for page in pages for obj in page.get("Contents", [])}


def _cache_rows(database_url: str) -> dict[str, int]:
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT b.tenant_id, count(*) FROM normalized_files n "
            "JOIN ingestion_batches b ON b.id = n.created_by_batch GROUP BY 1"
        ).fetchall()
    return dict(rows)


def test_purge_removes_one_tenant_and_nothing_else(
    routed_settings: Settings, tenant_databases, database_url, s3, landing_bucket, staging_bucket
) -> None:
    settings = routed_settings
    rt = build_runtime(settings)
    folders = {t: today_folder(landing_bucket, t) for t in tenant_databases}
    staged_by: dict[str, set[str]] = {}
    for tenant_id, folder in folders.items():
        before = _staged(s3, staging_bucket)
        upload(s3, folder, fleet_delivery(trips=200, bad_rows=True))
        tenant = admit(settings, tenant_id, folder)
        assert isinstance(tenant, Tenant)
        assert isinstance(import_folder(rt.ctx, tenant, folder, f"d-{tenant_id}"), Committed)
        staged_by[tenant_id] = _staged(s3, staging_bucket) - before
    assert all(staged_by.values()) and any("acme/rejects/" in k for k in staged_by["acme"])
    urls = {t: postgres_url_for(settings, name) for t, name in tenant_databases.items()}
    globex_before = _snapshot(urls["globex"])
    env = _env(settings)

    unconfirmed = CliRunner().invoke(app, ["tenants", "purge", "acme"], env=env)
    assert unconfirmed.exit_code == 2 and "--confirm" in unconfirmed.output
    enabled = CliRunner().invoke(app, ["tenants", "purge", "acme", "--confirm"], env=env)
    assert enabled.exit_code == 1 and "enabled: false" in enabled.output
    registry = Path(str(settings.tenants))
    registry.write_text(
        registry.read_text().replace(
            f"database: {tenant_databases['acme']}\n",
            f"database: {tenant_databases['acme']}\n    enabled: false\n",
        )
    )
    repo = BatchRepository(database_url)
    running = repo.reserve(Tenant.named("acme"), source_scope(folders["acme"] + "more/"), "x")
    busy = CliRunner().invoke(app, ["tenants", "purge", "acme", "--confirm"], env=env)
    assert busy.exit_code == 1 and "running" in busy.output and str(running.batch.id) in busy.output
    with psycopg.connect(database_url) as conn:
        conn.execute("DELETE FROM ingestion_batches WHERE id = %s", [running.batch.id])

    purged = CliRunner().invoke(app, ["tenants", "purge", "acme", "--confirm", "--json"], env=env)
    assert purged.exit_code == 0, purged.output
    record = json.loads(purged.output)
    warehouse = record["removed"]["warehouse"]
    assert warehouse["database"] == tenant_databases["acme"]
    assert warehouse["rows"]["curated.fleet_trips"] > 0 and warehouse["registry_rows"] == 3

    acme_after = _snapshot(urls["acme"])
    assert all(rows == [] for rows in acme_after.values()), acme_after
    assert _snapshot(urls["globex"]) == globex_before
    left = _staged(s3, staging_bucket)
    assert not (left & staged_by["acme"]), left & staged_by["acme"]
    assert staged_by["globex"] <= left
    assert "acme" not in _cache_rows(database_url) and _cache_rows(database_url)["globex"] > 0

    (audit,) = [b for b in repo.list(tenant="acme") if b.source_type == "tenant_purge"]
    assert str(audit.id) == record["batch_id"] and audit.status == BatchStatus.SUCCEEDED
    assert audit.tenant_database == tenant_databases["acme"]
    assert audit.details["purge"]["warehouse"]["rows"] == warehouse["rows"]
    assert sorted(audit.details["purge"]["staged_files"])
    listed = CliRunner().invoke(app, ["batches", "list", "--tenant", "acme"], env=env)
    assert listed.exit_code == 0, listed.output
    shown = CliRunner().invoke(app, ["batches", "show", str(audit.id)], env=env)
    assert shown.exit_code == 0, shown.output
