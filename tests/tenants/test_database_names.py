"""Which database a tenant's slices go to, and how it is reached, on both backends."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet_import.config import Settings
from fleet_import.errors import ConfigurationError
from fleet_import.tenants.databases import (
    own_database,
    postgres_url_for,
    redshift_kwargs_for,
    shared_database,
    templated,
)
from fleet_import.tenants.registry import load_registry


@pytest.fixture
def registry(tmp_path: Path):
    path = tmp_path / "tenants.yaml"
    path.write_text("tenants:\n  acme: {}\n  globex:\n    database: globex_dw\n")
    return load_registry(path)


def test_postgres_shared_own_and_templated(registry) -> None:
    shared = Settings(warehouse_url="postgresql://loader:pw@wh:5432/curated_dw")
    assert not templated(shared) and shared_database(shared) == "curated_dw"
    assert own_database(shared, "acme", registry) is None
    assert own_database(shared, "globex", registry) == "globex_dw"
    assert postgres_url_for(shared, "globex_dw") == "postgresql://loader:pw@wh:5432/globex_dw"
    assert postgres_url_for(shared, None) == "postgresql://loader:pw@wh:5432/curated_dw"
    template = Settings(warehouse_url="postgresql://loader@wh:5432/{database}?sslmode=require")
    assert templated(template) and shared_database(template) is None
    assert own_database(template, "acme", registry) == "tenant_acme"
    assert own_database(template, "acme-eu", None) == "tenant_acme_eu"
    assert postgres_url_for(template, "tenant_acme").endswith("/tenant_acme?sslmode=require")
    with pytest.raises(ConfigurationError, match="no shared warehouse database"):
        postgres_url_for(template, None)


def test_redshift_database_per_tenant(registry) -> None:
    common = {"warehouse": "redshift", "redshift_host": "rs", "redshift_user": "loader"}
    shared = Settings(**common, redshift_database="dev")
    assert shared_database(shared) == "dev" and not templated(shared)
    assert redshift_kwargs_for(shared, "globex_dw")["database"] == "globex_dw"
    assert redshift_kwargs_for(shared, None)["database"] == "dev"
    template = Settings(**common, redshift_database="fleet_{database}")
    assert templated(template)
    assert own_database(template, "acme", registry) == "tenant_acme"
    assert redshift_kwargs_for(template, "tenant_acme")["database"] == "fleet_tenant_acme"
    url = Settings(warehouse="redshift", warehouse_url="redshift://u:p@rs:5439/{database}")
    assert templated(url) and redshift_kwargs_for(url, "globex_dw")["database"] == "globex_dw"
