"""Each tenant's slices in its own database on the Redshift backend (issue 31): two tenants
routed by the registry to two databases behind the emulator (tests/redshift_databases.py),
importing at once through redshift_connector, S3 staging and COPY; each database holds only
its own tenant's rows and slice-registry rows, and a replace and a rollback of one tenant
never touch the other's database."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest

from fleet_import.config import Settings
from fleet_import.importing.context import Committed
from fleet_import.importing.driver import import_folder
from fleet_import.importing.guards import GuardOverride
from fleet_import.importing.rollback import rollback_slice
from fleet_import.importing.runtime import build_runtime
from fleet_import.intake.admission import admission
from fleet_import.sample_data import csv_bytes, fleet_delivery, today_folder, trips_table
from fleet_import.scope import Tenant, source_scope
from fleet_import.store.repository import BatchRepository
from fleet_import.store.review_repository import ReviewRepository
from fleet_import.warehouse.routing import TenantWarehouses
from tests import pgtools
from tests.helpers import upload
from tests.importing.guard_helpers import redeliver
from tests.redshift_databases import tenant_databases
from tests.redshift_emulator import RedshiftEmulator

pytestmark = pytest.mark.slow

ROLE = "arn:aws:iam::123456789012:role/fleet-redshift-copy"
TENANTS = ("acme", "globex")
TABLES = ("fleet_trips", "fleet_vehicles", "fleet_fuel_transactions", "ingestion_slices")


def _tenants_in(url: str) -> dict[str, set[str]]:
    """table -> the tenants whose rows it holds; tables that do not exist are left out."""
    found: dict[str, set[str]] = {}
    with psycopg.connect(url) as conn:
        for table in TABLES:
            exists = conn.execute("SELECT to_regclass(%s)", [f"curated.{table}"]).fetchone()
            if exists and exists[0]:
                rows = conn.execute(f"SELECT DISTINCT tenant_id FROM curated.{table}").fetchall()
                found[table] = {row[0] for row in rows}
    return found


def _versions(url: str) -> dict[str, list[tuple]]:
    """Every curated row's version: what 'not touched' means."""
    with psycopg.connect(url) as conn:
        return {
            table: conn.execute(
                f"SELECT xmin::text, ctid::text FROM curated.{table} ORDER BY 2"
            ).fetchall()
            for table in TABLES
        }


def test_two_tenants_in_two_redshift_databases(
    emulator: RedshiftEmulator,
    pg_server_url: str,
    database_url: str,
    s3: Any,
    moto_endpoint: str,
    landing_bucket: str,
    staging_bucket: str,
    tmp_path: Path,
) -> None:
    with tenant_databases(emulator, pg_server_url, TENANTS) as names:
        registry = tmp_path / "tenants.yaml"
        registry.write_text(
            "tenants:\n" + "".join(f"  {t}:\n    database: {n}\n" for t, n in names.items())
        )
        settings = Settings(
            database_url=database_url,
            warehouse="redshift",
            redshift_host="127.0.0.1",
            redshift_port=emulator.port,
            redshift_database="{database}",  # every tenant's own: the registry's names
            redshift_user=emulator.user,
            redshift_password="unused-trust-auth",
            redshift_ssl=False,
            redshift_serverless=emulator.serverless,
            redshift_iam_role=ROLE,
            redshift_staging_uri=f"s3://{staging_bucket}/redshift/",
            s3_endpoint_url=moto_endpoint,
            staging_uri=f"s3://{staging_bucket}/stage/",
            lease_ttl_seconds=30,
            tenants=str(registry),
            workdir=str(tmp_path / "work"),
        )
        admit = admission(settings)
        rt = build_runtime(settings)
        router = rt.ctx.warehouse
        assert isinstance(router, TenantWarehouses)
        folders = {t: today_folder(landing_bucket, t) for t in TENANTS}
        for folder in folders.values():
            upload(s3, folder, fleet_delivery(trips=120, fuel=30, vehicles=8))
        urls = {t: pgtools.with_dbname(pg_server_url, n) for t, n in names.items()}

        outcomes: dict[str, object] = {}

        def load(tenant_id: str) -> None:
            tenant = admit(tenant_id, folders[tenant_id])
            assert isinstance(tenant, Tenant) and tenant.database == names[tenant_id]
            outcomes[tenant_id] = import_folder(rt.ctx, tenant, folders[tenant_id], "d1")

        threads = [threading.Thread(target=load, args=(t,)) for t in TENANTS]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert all(isinstance(o, Committed) and o.published for o in outcomes.values()), outcomes
        for tenant_id, url in urls.items():
            assert _tenants_in(url) == {table: {tenant_id} for table in TABLES}
            warehouse = router.for_tenant(tenant_id)
            assert warehouse.counters.replays == 0  # two databases: no 1023 between them
            assert warehouse.counters.copies >= 3  # loaded through the emulator's COPY
        assert _tenants_in(database_url) == {}  # the operational database holds no slice
        for batch in BatchRepository(database_url).list():
            assert batch.tenant_database == names[batch.tenant_id]

        # acme's slice replaced (other content), then rolled back: globex's rows stay as
        # they were, row versions and all.
        globex_before = _versions(urls["globex"])
        acme, folder = admit("acme", folders["acme"]), folders["acme"]
        assert isinstance(acme, Tenant)
        first = router.slice_owner("acme", source_scope(folder))
        redeliver(s3, folder, {"trips-1.csv": csv_bytes(trips_table(15, start=5000))})
        no_guard = GuardOverride(waived=True, reason="test")
        replaced = import_folder(rt.ctx, acme, folder, "d2", guard=no_guard)
        assert isinstance(replaced, Committed) and replaced.row_counts["trips"] == 15, replaced
        reviews = ReviewRepository(database_url)
        restored = rollback_slice(rt.ctx, reviews, "acme", folder, admission=admit)
        assert isinstance(restored, Committed) and restored.published, restored
        assert restored.row_counts == outcomes["acme"].row_counts  # type: ignore[attr-defined]
        owner = BatchRepository(database_url).get(router.slice_owner("acme", source_scope(folder)))
        assert owner is not None and owner.details["rolled_back_to"] == str(first)
        assert _versions(urls["globex"]) == globex_before
        assert _tenants_in(urls["acme"]) == {table: {"acme"} for table in TABLES}
        assert _tenants_in(urls["globex"]) == {table: {"globex"} for table in TABLES}
