"""MetricsRepository: what the operational store says of the fleet's health, read in one
transaction per scrape (`snapshot`), for the metrics collector and `fleet-import costs`.

Read from the store, never counted inside runs: a run that crashed or never started
reports nothing, while its batch row still says what became of it. SQL in `metrics.sql`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fleet_import.sqlfiles import load_queries
from fleet_import.store.batch_state import HeldSince
from fleet_import.store.connection import SqlStore
from fleet_import.store.models import Batch
from fleet_import.store.review_repository import QUERIES as REVIEW_QUERIES

QUERIES = load_queries("fleet_import.store", "metrics.sql")


@dataclass(frozen=True)
class AgedBatch:
    batch: Batch
    age_seconds: float


@dataclass(frozen=True)
class Latencies:
    """Delivery-to-publish seconds of the succeeded batches: cumulative counts at each bound."""

    bounds: tuple[float, ...]
    at_most: tuple[int, ...]
    count: int
    total_seconds: float


@dataclass(frozen=True)
class StoreSnapshot:
    batches: list[dict[str, Any]]  # status, phase, batches
    held: list[AgedBatch]
    held_since: dict[Any, HeldSince]
    failed_publications: list[AgedBatch]
    expired_leases: list[dict[str, Any]]  # tenant_id, batches, oldest_seconds
    latencies: Latencies
    rows: list[dict[str, Any]]  # dataset, loaded, rejected, staged_bytes
    warehouse_seconds: list[dict[str, Any]]  # dataset, step, seconds
    gate_findings: list[dict[str, Any]]  # severity, rule, findings
    freshness: list[dict[str, Any]]  # tenant_id, dataset, late, lag_seconds


@dataclass(frozen=True)
class TenantCost:
    """What one tenant's committed slices cost, by our own timings."""

    tenant_id: str
    batches: int
    batch_ids: list[str]
    rows: int
    rejected: int
    staged_bytes: int
    copy_seconds: float
    commit_seconds: float
    load_seconds: float


MAX_HELD = 10_000
"""Held batches read per scrape: far more than any review queue holds."""


def _aged(rows: list[dict[str, Any]], now: dt.datetime) -> list[AgedBatch]:
    """Batches with how long ago they were last written (when they were held or failed)."""
    return [
        AgedBatch(batch, max((now - batch.updated_at).total_seconds(), 0.0))
        for batch in map(Batch.from_row, rows)
    ]


class MetricsRepository(SqlStore):
    queries = QUERIES

    def snapshot(self, latency_bounds: Sequence[float]) -> StoreSnapshot:
        """Everything a scrape reports, in one transaction (read committed, like every store
        call: each query sees the store as it was when it started, milliseconds apart)."""
        q = self.queries
        with self._transaction() as conn:

            def rows(name: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
                return conn.execute(q[name], params or {}).fetchall()

            now = conn.execute("SELECT now() AS now").fetchone()["now"]
            held = _aged(
                conn.execute(
                    REVIEW_QUERIES["held_batches"], {"tenant_id": None, "limit": MAX_HELD}
                ).fetchall(),
                now,
            )
            since_rows = (
                conn.execute(
                    REVIEW_QUERIES["held_since"], {"ids": [h.batch.id for h in held]}
                ).fetchall()
                if held
                else []
            )
            latency = rows("publish_latencies", {"bounds": list(latency_bounds)})[0]
            return StoreSnapshot(
                batches=rows("batches_by_status_phase"),
                held=held,
                held_since={
                    row["held_id"]: HeldSince(
                        row["later_id"], bool(row["same_content"]), bool(row["succeeded"])
                    )
                    for row in since_rows
                },
                failed_publications=_aged(rows("failed_publications"), now),
                expired_leases=rows("expired_leases"),
                latencies=Latencies(
                    tuple(latency_bounds),
                    tuple(int(n) for n in latency["at_most"]),
                    int(latency["total"]),
                    float(latency["total_seconds"]),
                ),
                rows=rows("rows_by_dataset"),
                warehouse_seconds=rows("warehouse_seconds"),
                gate_findings=rows("gate_findings"),
                freshness=rows("freshness"),
            )

    def costs(self, tenant_id: str | None, since: dt.datetime | None) -> list[TenantCost]:
        """Per tenant, the committed slices created since `since` (all without it)."""
        found = self._all("tenant_costs", {"tenant_id": tenant_id, "since": since})
        return [TenantCost(**row) for row in found]
