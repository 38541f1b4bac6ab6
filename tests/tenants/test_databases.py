"""Each tenant's slices in its own warehouse database: two real PostgreSQL databases, two
tenants importing at once (in one process, and as two `fleet-import run` processes), a
replace and a resume, and neither ever touches the other's."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import psycopg
import pytest

from fleet_import.config import Settings
from fleet_import.importing.context import Committed
from fleet_import.importing.driver import import_folder
from fleet_import.importing.resume import resume_batch
from fleet_import.importing.runtime import build_runtime
from fleet_import.intake.admission import admit
from fleet_import.sample_data import fleet_delivery, today_folder
from fleet_import.scope import Tenant, source_scope
from fleet_import.store.models import BatchStatus
from fleet_import.store.repository import BatchRepository
from fleet_import.tenants.databases import postgres_url_for
from fleet_import.warehouse.routing import TenantWarehouses
from tests.helpers import upload

TABLES = ("fleet_trips", "fleet_vehicles", "fleet_fuel_transactions")


def _tenant_rows(url: str) -> dict[str, set[str]]:
    """table -> the tenants whose rows it holds (the slice registry included)."""
    found: dict[str, set[str]] = {}
    with psycopg.connect(url) as conn:
        for table in (*TABLES, "ingestion_slices"):
            exists = conn.execute("SELECT to_regclass(%s)", [f"curated.{table}"]).fetchone()
            if exists and exists[0]:
                rows = conn.execute(f"SELECT DISTINCT tenant_id FROM curated.{table}").fetchall()
                found[table] = {row[0] for row in rows}
    return found


def _versions(url: str) -> list[tuple]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT xmin::text, ctid::text, ingestion_batch_id FROM curated.fleet_trips ORDER BY 2"
        ).fetchall()


def _admitted(settings: Settings, tenant_id: str, folder: str) -> Tenant:
    tenant = admit(settings, tenant_id, folder)
    assert isinstance(tenant, Tenant), tenant
    return tenant


def test_two_tenants_each_hold_only_their_own_rows(
    routed_settings: Settings, tenant_databases, database_url, s3, landing_bucket
) -> None:
    settings = routed_settings
    folders = {t: today_folder(landing_bucket, t) for t in tenant_databases}
    for folder in folders.values():
        upload(s3, folder, fleet_delivery(trips=300, bad_rows=False))
    rt = build_runtime(settings)
    assert isinstance(rt.ctx.warehouse, TenantWarehouses)
    outcomes: dict[str, object] = {}

    def load(tenant_id: str, key: str) -> None:
        tenant = _admitted(settings, tenant_id, folders[tenant_id])
        outcomes[tenant_id] = import_folder(rt.ctx, tenant, folders[tenant_id], key)

    threads = [threading.Thread(target=load, args=(t, f"d1-{t}")) for t in tenant_databases]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(isinstance(o, Committed) and o.published for o in outcomes.values()), outcomes

    urls = {t: postgres_url_for(settings, name) for t, name in tenant_databases.items()}
    for tenant_id, url in urls.items():
        held = _tenant_rows(url)
        assert held["ingestion_slices"] == {tenant_id}
        assert held["fleet_trips"] == {tenant_id}, held
    assert _tenant_rows(database_url) == {}  # the operational database holds no slice
    repo = BatchRepository(database_url)
    for batch in repo.list():
        assert batch.tenant_database == tenant_databases[batch.tenant_id]
        assert rt.ctx.warehouse.slice_owner(batch.tenant_id, batch.source_scope) == batch.id

    # A replace of acme's slice and a failed-then-resumed publication leave globex's rows as
    # they were, row versions and all.
    globex_before = _versions(urls["globex"])
    acme = _admitted(settings, "acme", folders["acme"])
    replaced = import_folder(rt.ctx, acme, folders["acme"], "d2-acme", force=True)
    assert isinstance(replaced, Committed) and replaced.published
    failing = build_runtime(settings.model_copy(update={"refresh_sql": ["SELECT 1/0"]}))
    failed = import_folder(failing.ctx, acme, folders["acme"], "d3-acme", force=True)
    assert not isinstance(failed, Committed), failed
    (failed_batch,) = repo.list(tenant="acme", status=BatchStatus.FAILED)
    resumed = resume_batch(rt.ctx, rt.outbox, failed_batch.id)
    assert isinstance(resumed, Committed) and resumed.published, resumed
    assert rt.ctx.warehouse.slice_owner("acme", source_scope(folders["acme"])) == failed_batch.id
    assert _versions(urls["globex"]) == globex_before
    assert _tenant_rows(urls["globex"])["fleet_trips"] == {"globex"}
    assert _tenant_rows(urls["acme"])["fleet_trips"] == {"acme"}
    assert _tenant_rows(database_url) == {}


def test_a_registry_database_beside_the_shared_one(
    database_url: str, pg_server_url: str, tenant_databases, tmp_path: Path
) -> None:
    """Only the tenant the registry gives a database leaves the shared one."""
    registry = tmp_path / "tenants.yaml"
    own = tenant_databases["globex"]
    registry.write_text(f"tenants:\n  acme: {{}}\n  globex:\n    database: {own}\n")
    settings = Settings(database_url=database_url, tenants=str(registry), staging_uri=str(tmp_path))
    rt = build_runtime(settings)
    router = rt.ctx.warehouse
    assert isinstance(router, TenantWarehouses)
    assert router.database_for("acme") is None
    assert router.database_for("globex") == tenant_databases["globex"]
    assert router.for_tenant("globex") is router.for_tenant("globex")  # one per database
    assert router.for_tenant("acme") is not router.for_tenant("globex")


@pytest.mark.slow
@pytest.mark.e2e  # two `fleet-import run` child processes at once: make test-e2e
def test_two_cli_runs_at_once_each_land_in_their_tenant_s_database(
    routed_settings: Settings, tenant_databases, database_url, prefect_api, s3, landing_bucket
) -> None:
    from prefect.settings import PREFECT_API_URL

    settings = routed_settings
    folders = {t: today_folder(landing_bucket, t) for t in tenant_databases}
    for folder in folders.values():
        upload(s3, folder, fleet_delivery(trips=150, bad_rows=False))
    env = {
        **os.environ,
        **{
            f"FLEET_{name.upper()}": str(value)
            for name, value in settings.model_dump().items()
            if name
            in {"database_url", "warehouse_url", "s3_endpoint_url", "staging_uri", "tenants"}
        },
        "PREFECT_API_URL": PREFECT_API_URL.value(),
        "COLUMNS": "300",
    }
    runs = {
        tenant_id: subprocess.Popen(
            [sys.executable, "-m", "fleet_cli", "run", "--tenant", tenant_id, folder],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for tenant_id, folder in folders.items()
    }
    for tenant_id, run in runs.items():
        out, _ = run.communicate(timeout=600)
        assert run.returncode == 0, f"{tenant_id}: {out[-3000:]}"
        assert "Completed" in out and "150 trips" in out, out[-3000:]
    for tenant_id, name in tenant_databases.items():
        held = _tenant_rows(postgres_url_for(settings, name))
        assert held == {table: {tenant_id} for table in (*TABLES, "ingestion_slices")}, held
    assert _tenant_rows(database_url) == {}
    for batch in BatchRepository(database_url).list():
        assert batch.tenant_database == tenant_databases[batch.tenant_id]


def test_the_warehouse_checks_reach_each_tenant_database(
    routed_settings: Settings, tenant_databases, tmp_path: Path
) -> None:
    """What `run` checks before it starts and `doctor` prints: every tenant database, not
    the `{database}` template's literal name."""
    from fleet_import.checks.services import check_warehouse, warehouse_databases

    names = [tenant_databases[t] for t in sorted(tenant_databases)]
    assert warehouse_databases(routed_settings) == names
    checks = list(check_warehouse(routed_settings, reachable_only=True))
    assert [(c.name, c.ok) for c in checks] == [(f"warehouse reachable ({n})", True) for n in names]
    registry = tmp_path / "missing.yaml"
    registry.write_text("tenants:\n  acme:\n    database: no_such_tenant_database\n")
    missing = routed_settings.model_copy(update={"tenants": str(registry)})
    (check,) = check_warehouse(missing, reachable_only=True)
    assert check.name == "warehouse reachable (no_such_tenant_database)" and check.ok is False
    unknown = routed_settings.model_copy(update={"tenants": None})
    (check,) = check_warehouse(unknown)
    assert check.ok is None and "{database}" in check.reason  # skipped, and says why
