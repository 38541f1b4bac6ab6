"""GateRepository: the content gate's profiles and check results, per batch and dataset
(`batch_gates`, migration 0010). SQL in `gates.sql`; one transaction per call."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from psycopg.types.json import Jsonb

from fleet_import.sqlfiles import load_queries
from fleet_import.store.connection import SqlStore

QUERIES = load_queries("fleet_import.store", "gates.sql")


@dataclass(frozen=True)
class DatasetGate:
    """One dataset of one batch as the gate judged it: its profile, what it was compared
    with (`baseline_batch_id`, None for a folder's first load) and each result."""

    dataset: str
    outcome: str
    profile: Mapping[str, Any]
    results: Sequence[Mapping[str, Any]]
    baseline_batch_id: uuid.UUID | None = None
    created_at: dt.datetime | None = None


class GateRepository(SqlStore):
    queries = QUERIES

    def record_gate(
        self,
        batch_id: uuid.UUID,
        gates: Sequence[DatasetGate],
        baseline_batch_id: uuid.UUID | None,
    ) -> None:
        params = {
            "batch_id": batch_id,
            "baseline_batch_id": baseline_batch_id,
            "datasets": [gate.dataset for gate in gates],
            "outcomes": [gate.outcome for gate in gates],
            "profiles": [Jsonb(dict(gate.profile)) for gate in gates],
            "results": [Jsonb([dict(r) for r in gate.results]) for gate in gates],
        }
        with self._transaction() as conn:
            conn.execute(self.queries["record_gate"], params)

    def gate_of(self, batch_id: uuid.UUID) -> list[DatasetGate]:
        """The batch's datasets as the gate judged them; [] if it never ran for it."""
        return [_gate(row) for row in self._all("gate_of", {"batch_id": batch_id})]

    def baseline_of(
        self, batch_id: uuid.UUID, tenant_id: str, source_scope: str
    ) -> tuple[uuid.UUID | None, list[DatasetGate]]:
        """The batch whose slice `batch_id` replaces (the newest other committed batch of
        the scope) and its datasets' profiles; (None, []) when it kept none."""
        params = {"batch_id": batch_id, "tenant_id": tenant_id, "source_scope": source_scope}
        rows = self._all("baseline_of", params)
        return (rows[0]["batch_id"] if rows else None), [_gate(row) for row in rows]


def _gate(row: Mapping[str, Any]) -> DatasetGate:
    return DatasetGate(
        row["dataset"],
        row["outcome"],
        row["profile"],
        row["results"],
        row["baseline_batch_id"],
        row["created_at"],
    )
