"""What offboarding a tenant reads and writes in the operational store: its running
batches (a purge waits for none), the files its batches staged, and the purge's own record
(a `tenant_purge` batch, migration 0007). SQL in `purges.sql`."""

from __future__ import annotations

import uuid
from typing import Any

from psycopg.types.json import Jsonb

from fleet_import.scope import Tenant
from fleet_import.sqlfiles import load_queries
from fleet_import.store.connection import SqlStore
from fleet_import.store.models import BatchStatus, CachedFile

QUERIES = load_queries("fleet_import.store", "purges.sql")
PURGE_SCOPE_PREFIX = "tenant_purge:"


class TenantPurges(SqlStore):
    queries = QUERIES

    def running_batches(self, tenant_id: str) -> list[uuid.UUID]:
        return [row["id"] for row in self._all("running_batches", {"tenant_id": tenant_id})]

    def cached_files(self, tenant_id: str) -> list[CachedFile]:
        return [CachedFile(**row) for row in self._all("cached_files", {"tenant_id": tenant_id})]

    def rejects_uris(self, tenant_id: str) -> list[str]:
        return [row["uri"] for row in self._all("rejects_uris", {"tenant_id": tenant_id})]

    def forget_cached_files(self, tenant_id: str) -> int:
        with self._transaction() as conn:
            return conn.execute(QUERIES["forget_cached_files"], {"tenant_id": tenant_id}).rowcount

    def record_purge(
        self, tenant: Tenant, status: BatchStatus, details: dict[str, Any]
    ) -> uuid.UUID:
        """The purge as a finished batch of the tenant: what was removed, or why it stopped."""
        row = self._one(
            "record_purge",
            {
                "id": uuid.uuid4(),
                "tenant_id": tenant.tenant_id,
                "company_id": tenant.company_id,
                "tenant_database": tenant.database,
                "source_scope": PURGE_SCOPE_PREFIX + tenant.tenant_id,
                "delivery_key": f"purge:{uuid.uuid4()}",
                "status": str(status),
                "details": Jsonb({"version": 1, **details}),
            },
        )
        assert row is not None
        return row["id"]
