"""`fleet-import tenants purge`: remove everything a tenant's imports left, and record it.

Removed: the tenant's rows in every curated table and its slice-registry rows (one
transaction in the warehouse database that holds them), the normalized files and rejects
its batches staged, and their cache rows. Kept: its operational batches, the history an
auditor reads, and the purge itself is one more: a `tenant_purge` batch whose details list
what went (or, if the purge stopped half way, what went before it stopped, and why).

Refused while a batch of the tenant runs, and while the registry still lists the tenant as
enabled: a purge of a tenant that may still import would be undone by its next delivery.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, cast

from fleet_import.contracts.model import DatasetContract
from fleet_import.errors import FleetImportError
from fleet_import.s3.staging import StagingArea
from fleet_import.scope import Tenant, validate_tenant_id
from fleet_import.store.models import BatchStatus
from fleet_import.store.purges import TenantPurges
from fleet_import.tenants.registry import TenantRegistry
from fleet_import.warehouse.base import Warehouse
from fleet_import.warehouse.committer import SliceCommitter
from fleet_import.warehouse.routing import TenantWarehouses
from fleet_import.warehouse.tenant_purge import purge_tenant_rows

TENANT_PURGED_EVENT = "fleet.tenant.purged"


@dataclass(frozen=True)
class PurgeRefused:
    """Nothing was removed, and nothing recorded."""

    tenant_id: str
    reason: str


@dataclass(frozen=True)
class Purged:
    """The purge ran: `batch_id` records it; `error` says why it stopped, if it did."""

    tenant_id: str
    batch_id: Any
    removed: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def purge_tenant(
    tenant: Tenant,
    *,
    purges: TenantPurges,
    warehouse: Warehouse,
    staging: StagingArea,
    contracts: Iterable[DatasetContract],
    registry: TenantRegistry | None,
) -> Purged | PurgeRefused:
    validate_tenant_id(tenant.tenant_id)
    registered = registry.get(tenant.tenant_id) if registry is not None else None
    if registry is not None and registered is not None and registered.enabled:
        return PurgeRefused(
            tenant.tenant_id,
            f"tenant {tenant.tenant_id!r} is enabled in the tenant registry {registry.path}: "
            "set `enabled: false` first, so that no delivery loads while it is purged",
        )
    running = purges.running_batches(tenant.tenant_id)
    if running:
        return PurgeRefused(
            tenant.tenant_id,
            f"batches of tenant {tenant.tenant_id!r} are running ({', '.join(map(str, running))}): "
            "purge once they have finished",
        )
    removed: dict[str, Any] = {"started_at": dt.datetime.now(dt.UTC).isoformat()}
    error = None
    try:
        removed["warehouse"] = _purge_warehouse(tenant.tenant_id, warehouse, contracts)
        removed["staged_files"] = _purge_staged(tenant.tenant_id, purges, staging)
        removed["cache_rows"] = purges.forget_cached_files(tenant.tenant_id)
    except FleetImportError as exc:
        error = f"{type(exc).__name__}: {exc}"
    status = BatchStatus.FAILED if error else BatchStatus.SUCCEEDED
    details: dict[str, Any] = {"purge": removed}
    if error:
        details["failure"] = {"kind": "purge_failed", "error": error}
    batch_id = purges.record_purge(tenant, status, details)
    return Purged(tenant.tenant_id, batch_id, removed, error)


def _purge_warehouse(
    tenant_id: str, warehouse: Warehouse, contracts: Iterable[DatasetContract]
) -> dict[str, Any]:
    database = None
    if isinstance(warehouse, TenantWarehouses):
        database = warehouse.database_for(tenant_id)
        warehouse = warehouse.for_tenant(tenant_id)
    removed = purge_tenant_rows(cast(SliceCommitter, warehouse), tenant_id, contracts)
    return {"database": database, **removed.to_json()}


def _purge_staged(tenant_id: str, purges: TenantPurges, staging: StagingArea) -> list[str]:
    """Staging-relative names deleted: each cached file's output and rejects, and each
    batch's rejects file; objects outside the staging area are not ours to delete."""
    root = staging.uri("")
    uris = [uri for entry in purges.cached_files(tenant_id) for uri in _entry_uris(entry)]
    uris += purges.rejects_uris(tenant_id)
    names = sorted({uri.removeprefix(root) for uri in uris if uri.startswith(root) and uri != root})
    staging.delete(names)
    return names


def _entry_uris(entry: Any) -> list[str]:
    rejects = entry.details.get("rejects_uri")
    return [entry.output_uri, *([rejects] if isinstance(rejects, str) else [])]
