"""Where a tenant's slices live: the shared warehouse database, or the tenant's own.

A tenant has its own database when the registry names one (`database:`), or when the
warehouse is a template (`{database}` in FLEET_WAREHOUSE_URL, or in FLEET_REDSHIFT_DATABASE)
that every tenant's database fills (the registry's, else the derived `tenant_<slug>`). The
slice registry lives in that same database, beside the rows it stamps.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

from fleet_import.config import Settings, libpq_url
from fleet_import.errors import ConfigurationError
from fleet_import.scope import Tenant
from fleet_import.tenants.registry import TenantRegistry

DATABASE_PLACEHOLDER = "{database}"
_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_$]{0,126}")


def templated(settings: Settings) -> bool:
    """Whether the warehouse names one database per tenant."""
    if settings.warehouse == "redshift":
        return DATABASE_PLACEHOLDER in str(settings.redshift_connect_kwargs().get("database"))
    return DATABASE_PLACEHOLDER in settings.effective_warehouse_url


def own_database(settings: Settings, tenant_id: str, registry: TenantRegistry | None) -> str | None:
    """The tenant's own warehouse database, or None for the shared one."""
    registered = registry.get(tenant_id) if registry is not None else None
    if registered is not None and registered.own_database:
        return registered.tenant.database
    if templated(settings):
        return registered.tenant.database if registered else Tenant.named(tenant_id).database
    return None


def shared_database(settings: Settings) -> str | None:
    """The shared warehouse database's name (None when the warehouse is a template)."""
    if templated(settings):
        return None
    if settings.warehouse == "redshift":
        return str(settings.redshift_connect_kwargs().get("database") or "") or None
    parts = urlsplit(libpq_url(settings.effective_warehouse_url))
    return parts.path.lstrip("/") or parts.username or None


def recorded_tenant(settings: Settings, tenant: Tenant, registry: TenantRegistry | None) -> Tenant:
    """`tenant` with the database that really holds its slices, as batches record it. A
    shared database whose name is no plain identifier keeps the derived name."""
    database = own_database(settings, tenant.tenant_id, registry) or shared_database(settings)
    if database is None or not _IDENTIFIER.fullmatch(database):
        return tenant
    return Tenant(tenant.tenant_id, tenant.company_id, database)


def postgres_url_for(settings: Settings, database: str | None) -> str:
    """The warehouse URL of `database` (None: the shared one)."""
    url = settings.effective_warehouse_url
    if database is None:
        if DATABASE_PLACEHOLDER in url:
            raise ConfigurationError(
                f"FLEET_WAREHOUSE_URL names a database per tenant ({DATABASE_PLACEHOLDER}): "
                "there is no shared warehouse database"
            )
        return url
    if DATABASE_PLACEHOLDER in url:
        return url.replace(DATABASE_PLACEHOLDER, database)
    parts = urlsplit(libpq_url(url))
    return urlunsplit(parts._replace(path="/" + database))


def redshift_kwargs_for(settings: Settings, database: str | None) -> dict[str, object]:
    """redshift_connector arguments for `database` (None: the shared one)."""
    kwargs = settings.redshift_connect_kwargs()
    shared = str(kwargs.get("database", ""))
    if database is None:
        if DATABASE_PLACEHOLDER in shared:
            raise ConfigurationError(
                f"the Redshift database is a template ({DATABASE_PLACEHOLDER}): there is no "
                "shared warehouse database"
            )
        return kwargs
    kwargs["database"] = (
        shared.replace(DATABASE_PLACEHOLDER, database)
        if DATABASE_PLACEHOLDER in shared
        else database
    )
    return kwargs
