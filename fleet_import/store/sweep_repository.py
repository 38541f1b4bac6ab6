"""SweepRepository: the operational-store reads of the landing-zone sweep.

Same conventions as BatchRepository: SQL lives in `sweep.sql`, every method is one
transaction on its own connection, and driver errors become OperationalStoreError at
`translate_driver_error`; nothing from psycopg escapes.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from fleet_import.config import DEFAULT_LEASE_TTL_SECONDS
from fleet_import.sqlfiles import load_queries
from fleet_import.store.connection import SqlStore

QUERIES = load_queries("fleet_import.store", "sweep.sql")
# Folders per query: a landing zone of years of daily folders stays a few round trips.
_CHUNK = 1000


@dataclass(frozen=True)
class FolderBatches:
    """What the store knows about one folder's scope and its current content."""

    tenant_id: str
    source_scope: str
    fingerprint: str
    running_id: uuid.UUID | None = None
    running_delivery_key: str | None = None
    running_abandoned: bool = False  # its executor is gone: an import takes it over
    latest_succeeded_id: uuid.UUID | None = None
    latest_succeeded_fingerprint: str | None = None
    same_content_id: uuid.UUID | None = None
    same_content_status: str | None = None
    same_content_failure_kind: str | None = None


FolderKey = tuple[str, str, str]  # (tenant_id, source_scope, fingerprint)


class SweepRepository(SqlStore):
    queries = QUERIES

    def folder_batches(
        self, folders: Iterable[FolderKey], lease_ttl: float = DEFAULT_LEASE_TTL_SECONDS
    ) -> dict[FolderKey, FolderBatches]:
        """The running, newest succeeded and same-content batches of each folder's scope;
        `lease_ttl` is the grace of a running batch nobody ever leased."""
        wanted = list(dict.fromkeys(folders))
        found: dict[FolderKey, FolderBatches] = {}
        for start in range(0, len(wanted), _CHUNK):
            chunk = wanted[start : start + _CHUNK]
            params = {
                "tenant_ids": [tenant for tenant, _, _ in chunk],
                "source_scopes": [scope for _, scope, _ in chunk],
                "fingerprints": [fingerprint for _, _, fingerprint in chunk],
                "lease_ttl": float(lease_ttl),
            }
            for row in self._all("folder_batches", params):
                found[(row["tenant_id"], row["source_scope"], row["fingerprint"])] = FolderBatches(
                    **row
                )
        return found
