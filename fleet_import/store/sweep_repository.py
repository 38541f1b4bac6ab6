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
    contract_versions: str = "{}"  # as JSON: with the fingerprint, the content's identity
    running_id: uuid.UUID | None = None
    running_delivery_key: str | None = None
    running_abandoned: bool = False  # its executor is gone: an import takes it over
    latest_succeeded_id: uuid.UUID | None = None
    latest_succeeded_fingerprint: str | None = None
    latest_succeeded_contract_versions: dict[str, str] | None = None
    same_content_id: uuid.UUID | None = None
    same_content_status: str | None = None
    same_content_failure_kind: str | None = None


# (tenant_id, source_scope, fingerprint, contract versions as JSON): a delivery's identity.
FolderKey = tuple[str, str, str, str]


class SweepRepository(SqlStore):
    queries = QUERIES

    def folder_batches(
        self, folders: Iterable[FolderKey], lease_ttl: float = DEFAULT_LEASE_TTL_SECONDS
    ) -> dict[FolderKey, FolderBatches]:
        """The running, newest succeeded and same-content (same fingerprint and contract
        versions) batches of each folder's scope; `lease_ttl` is the grace of a running
        batch nobody ever leased."""
        wanted = list(dict.fromkeys(folders))
        found: dict[FolderKey, FolderBatches] = {}
        for start in range(0, len(wanted), _CHUNK):
            chunk = wanted[start : start + _CHUNK]
            params = {
                "tenant_ids": [key[0] for key in chunk],
                "source_scopes": [key[1] for key in chunk],
                "fingerprints": [key[2] for key in chunk],
                "contract_versions": [key[3] for key in chunk],
                "lease_ttl": float(lease_ttl),
            }
            for row in self._all("folder_batches", params):
                key = (
                    row["tenant_id"],
                    row["source_scope"],
                    row["fingerprint"],
                    row["contract_versions"],
                )
                found[key] = FolderBatches(**row)
        return found
