"""ReviewRepository: the operational-store side of held batches (issue #24) and of the
retention that lets a rollback load an earlier success's normalized files.

Same conventions as BatchRepository: SQL lives in `review.sql`, each method is one
transaction on its own connection, driver errors become OperationalStoreError.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from psycopg.types.json import Jsonb

from fleet_import.sqlfiles import load_queries
from fleet_import.store.batch_state import HeldSince
from fleet_import.store.connection import SqlStore
from fleet_import.store.models import Batch

QUERIES = load_queries("fleet_import.store", "review.sql")


class ReviewRepository(SqlStore):
    queries = QUERIES

    def record_review(
        self,
        batch_id: uuid.UUID,
        decision: str,
        by_batch: uuid.UUID | None = None,
        facts: Mapping[str, Any] | None = None,
    ) -> Batch | None:
        """Record `decision` (approved, rejected) on a held batch, once; None if it is not
        held or was decided otherwise already."""
        row = self._one("record_review", review_params(batch_id, decision, by_batch, facts))
        return None if row is None else Batch.from_row(row)

    def held_batches(self, tenant: str | None = None, limit: int = 50) -> list[Batch]:
        """Held batches that wait for review, newest first."""
        rows = self._all("held_batches", {"tenant_id": tenant, "limit": int(limit)})
        return [Batch.from_row(row) for row in rows]

    def held_since(self, ids: Iterable[uuid.UUID]) -> dict[uuid.UUID, HeldSince]:
        """What later deliveries of their folders say of these held batches (one query for a
        whole list): overtaken or stale, read by `batch_state.review_state`."""
        wanted = list(dict.fromkeys(ids))
        if not wanted:
            return {}
        rows = self._all("held_since", {"ids": wanted})
        return {
            row["held_id"]: HeldSince(row["later_id"], row["same_content"], row["succeeded"])
            for row in rows
        }

    def retained_batches(
        self, batch_id: uuid.UUID, keep_seconds: float, keep_count: int = 1
    ) -> list[Batch]:
        """The scope's batches whose files the retention keeps while `batch_id` publishes."""
        params = {
            "batch_id": batch_id,
            "keep_seconds": float(keep_seconds),
            "keep_count": int(keep_count),
        }
        return [_batch(row) for row in self._all("retained_batches", params)]

    def rollback_candidates(
        self, tenant_id: str, scope: str, owner: uuid.UUID | None, limit: int = 20
    ) -> list[Batch]:
        """The scope's earlier successes a default rollback may load, newest first: not the
        slice's `owner`, nor its content, nor any content a rollback removed."""
        params = {
            "tenant_id": tenant_id,
            "source_scope": scope,
            "owner": owner,
            "limit": int(limit),
        }
        return [Batch.from_row(row) for row in self._all("rollback_candidates", params)]


def review_params(
    batch_id: uuid.UUID,
    decision: str,
    by_batch: uuid.UUID | None = None,
    facts: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """`record_review`'s parameters; `BatchRepository.mark_committed` records an approval
    with them in its own transaction."""
    by = str(by_batch) if by_batch is not None else None
    review = {**dict(facts or {}), "decision": decision, "batch_id": by}
    return {"batch_id": batch_id, "decision": decision, "by_batch": by, "review": Jsonb(review)}


def _batch(row: Mapping[str, Any]) -> Batch:
    return Batch.from_row({k: v for k, v in row.items() if k != "recency"})
