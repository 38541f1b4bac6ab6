"""LineageOutbox: the OpenLineage RunEvents of committed batches, until delivered.

Written by `BatchRepository.mark_committed` in the commit's transaction (`enqueue_params`),
claimed and recorded here by `publication.lineage_delivery`. Unlike publication steps these
rows never gate a batch: a batch succeeds with its lineage pending. SQL in `lineage.sql`.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from psycopg.types.json import Jsonb

from fleet_import.retry import Backoff
from fleet_import.sqlfiles import load_queries
from fleet_import.store.connection import SqlStore

QUERIES = load_queries("fleet_import.store", "lineage.sql")
_MAX_ERROR_LENGTH = 2000


@dataclass(frozen=True)
class LineageEvent:
    """One RunEvent to enqueue: `event` is its OpenLineage JSON, as it will be sent."""

    run_id: uuid.UUID
    job_name: str
    event_type: str
    event_time: dt.datetime
    event: dict[str, Any]


@dataclass(frozen=True)
class LineageRow:
    """An enqueued event as the store holds it (its JSON read separately: `event`)."""

    id: int
    batch_id: uuid.UUID
    run_id: uuid.UUID
    job_name: str
    event_type: str
    event_time: dt.datetime
    status: str
    attempts: int
    last_error: str | None
    available_at: dt.datetime
    delivered_at: dt.datetime | None


def enqueue_params(batch_id: uuid.UUID, events: Sequence[LineageEvent]) -> dict[str, Any]:
    """The parameters of `enqueue_lineage`, which mark_committed runs in its transaction."""
    return {
        "batch_id": batch_id,
        "run_ids": [e.run_id for e in events],
        "job_names": [e.job_name for e in events],
        "event_types": [e.event_type for e in events],
        "event_times": [e.event_time for e in events],
        "events": [Jsonb(e.event) for e in events],
    }


class LineageOutbox(SqlStore):
    queries = QUERIES

    def claim_next(
        self, worker: str, ttl: float, batch_id: uuid.UUID | None = None
    ) -> tuple[LineageRow, dict[str, Any]] | None:
        """The earliest due event whose run's earlier events are delivered, claimed for
        `ttl` seconds, with its JSON; None when nothing is due."""
        with self._transaction() as conn:
            params = {"worker": worker, "ttl": float(ttl), "batch_id": batch_id}
            row = conn.execute(QUERIES["claim_next"], params).fetchone()
        if row is None:
            return None
        event = row.pop("event")
        for extra in ("claimed_by", "claimed_until", "created_at"):
            row.pop(extra)
        return LineageRow(**row), event

    def delivered(self, row_id: int, worker: str) -> bool:
        """Record a delivery; False if this worker's claim was taken over meanwhile."""
        return self._one("delivered", {"id": row_id, "worker": worker}) is not None

    def failed(
        self, row: LineageRow, worker: str, error: str, backoff: Backoff
    ) -> None:
        """Give the event back, due again after `backoff.after(attempts)`."""
        params = {
            "id": row.id,
            "worker": worker,
            "error": error[:_MAX_ERROR_LENGTH],
            "delay": backoff.after(row.attempts + 1),
        }
        self._one("failed", params)

    def of_batch(self, batch_id: uuid.UUID) -> list[LineageRow]:
        return [LineageRow(**row) for row in self._all("of_batch", {"batch_id": batch_id})]

    def event(self, row_id: int) -> dict[str, Any] | None:
        row = self._one("event", {"id": row_id})
        return None if row is None else dict(row["event"])
