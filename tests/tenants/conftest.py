"""Two tenants, each with a warehouse database of its own on the test server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet_import.config import Settings
from tests import pgtools


@pytest.fixture
def tenant_databases(pg_server_url: str) -> Iterator[dict[str, str]]:
    """tenant -> a fresh, empty warehouse database of its own."""
    names = {tenant: pgtools.unique_name(f"wh_{tenant}") for tenant in ("acme", "globex")}
    for name in names.values():
        pgtools.create_database(pg_server_url, name)
    yield names
    for name in names.values():
        pgtools.drop_database(pg_server_url, name)


@pytest.fixture
def routed_settings(
    database_url: str, pg_server_url: str, tenant_databases, moto_endpoint, staging_bucket,
    tmp_path: Path,
) -> Settings:
    registry = tmp_path / "tenants.yaml"
    registry.write_text(
        "tenants:\n"
        + "".join(f"  {t}:\n    database: {name}\n" for t, name in tenant_databases.items())
    )
    return Settings(
        database_url=database_url,
        warehouse_url=pgtools.with_dbname(pg_server_url, "{database}"),
        s3_endpoint_url=moto_endpoint,
        staging_uri=f"s3://{staging_bucket}/stage/",
        lease_ttl_seconds=30,
        tenants=str(registry),
        workdir=str(tmp_path / "work"),
    )
