"""Retention of the operational store's own rows (issue 50): what a thousand deliveries a day
leave behind, trimmed once nothing can need it. SQL in `state_retention.sql`.

Trimmed after `older_than` (FLEET_STATE_RETAIN_DAYS): the outbox steps of succeeded batches,
delivered lineage events of finished batches, and a succeeded batch's per-file summary and
rejects sample. Never trimmed: the batch rows themselves (the slice registry's batches,
resumes, reviews, rollbacks and freshness read them), their manifests and contract versions,
a failed batch's outbox (a resume needs it), pending lineage, the normalized-file cache
(publication.retention owns it) and freshness verdicts.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleet_import.sqlfiles import load_queries
from fleet_import.store.connection import SqlStore

QUERIES = load_queries("fleet_import.store", "state_retention.sql")
TRIM_CHUNK = 5000
"""Rows per statement: each chunk is a short transaction of its own, so a first trim of a
year's backlog never holds its locks for long against the imports."""
COMPACT_ABOVE_BYTES = 4096
"""Details stored larger than this are compacted (a delivery of many files: its per-file
summary). Smaller ones are left whole: stored under about 2 kB a row is not compressed, so
compacting a tiny delivery's details made the table larger (benchmarks/state_size.py)."""


@dataclass(frozen=True)
class Trimmed:
    """What one trim removed or compacted."""

    outbox_rows: int = 0
    lineage_rows: int = 0
    compacted_batches: int = 0


class StateRetention(SqlStore):
    queries = QUERIES

    def trim(
        self,
        older_than_seconds: float,
        chunk: int = TRIM_CHUNK,
        compact_above_bytes: int = COMPACT_ABOVE_BYTES,
    ) -> Trimmed:
        """Trim everything older than the cutoff, chunk by chunk until none is left."""
        params = {
            "older_than_seconds": float(older_than_seconds),
            "limit": chunk,
            "compact_above_bytes": compact_above_bytes,
        }
        done = {name: 0 for name in QUERIES if name != "table_bytes"}
        for name in done:
            while True:
                with self._transaction() as conn:
                    count = conn.execute(QUERIES[name], params).rowcount
                done[name] += count
                if count < chunk:
                    break
        return Trimmed(
            outbox_rows=done["delete_finished_outbox"],
            lineage_rows=done["delete_delivered_lineage"],
            compacted_batches=done["compact_succeeded_details"],
        )

    def table_bytes(self) -> dict[str, int]:
        return {row["name"]: int(row["bytes"]) for row in self._all("table_bytes", {})}
