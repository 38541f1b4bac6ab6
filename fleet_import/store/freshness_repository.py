"""FreshnessRepository: what the freshness check reads from the operational store (the
succeeded batches of each tenant) and the verdicts it remembers (`freshness_states`).

Same conventions as the other repositories: SQL in `freshness.sql`, one transaction per
call, driver errors translated at `translate_driver_error`.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass

from fleet_import.sqlfiles import load_queries
from fleet_import.store.connection import SqlStore

QUERIES = load_queries("fleet_import.store", "freshness.sql")


@dataclass(frozen=True)
class SucceededBatch:
    """A succeeded fleet batch: its folder's scope, when it started, the datasets it loaded."""

    tenant_id: str
    source_scope: str | None
    batch_id: uuid.UUID
    started_at: dt.datetime
    datasets: tuple[str, ...]


@dataclass(frozen=True)
class StoredVerdict:
    """A (tenant, dataset)'s last remembered verdict; `state` None: never checked."""

    tenant_id: str
    dataset: str
    state: str | None = None
    late: bool = False
    expected_at: dt.datetime | None = None
    found: str | None = None
    checked_at: dt.datetime | None = None
    changed_at: dt.datetime | None = None


class FreshnessRepository(SqlStore):
    queries = QUERIES

    def succeeded_batches(
        self, tenant_ids: Collection[str], since: dt.datetime, until: dt.datetime
    ) -> list[SucceededBatch]:
        """The tenants' succeeded fleet batches started from `since` to `until` (the moment
        judged: a later batch did not exist then), newest first."""
        rows = self._all(
            "succeeded_batches",
            {"tenant_ids": list(tenant_ids), "since": since, "until": until},
        )
        return [SucceededBatch(**row | {"datasets": tuple(row["datasets"])}) for row in rows]

    def last_succeeded(
        self, tenant_ids: Collection[str], until: dt.datetime
    ) -> dict[str, SucceededBatch]:
        """Each tenant's newest succeeded fleet batch started by `until`, however old
        (datasets not read)."""
        rows = self._all("last_succeeded", {"tenant_ids": list(tenant_ids), "until": until})
        return {
            row["tenant_id"]: SucceededBatch(
                row["tenant_id"], None, row["batch_id"], row["started_at"], ()
            )
            for row in rows
        }

    def known_tenants(self) -> list[str]:
        return [row["tenant_id"] for row in self._all("known_tenants", {})]

    def remember(
        self, verdict: StoredVerdict, is_change: Callable[[StoredVerdict], bool]
    ) -> tuple[StoredVerdict, bool]:
        """Write `verdict` over the one remembered, which stays locked while `is_change`
        judges it: (the previous verdict, whether it changed). Checks running at once see
        each other's verdicts, so a change is reported by one of them only."""
        key = {"tenant_id": verdict.tenant_id, "dataset": verdict.dataset}
        with self._transaction() as conn:
            conn.execute(self.queries["ensure_state"], key)
            row = conn.execute(self.queries["lock_state"], key).fetchone()
            previous = StoredVerdict(**key, **(row or {}))
            changed = is_change(previous)
            conn.execute(
                self.queries["write_state"],
                {
                    **key,
                    "state": verdict.state,
                    "late": verdict.late,
                    "expected_at": verdict.expected_at,
                    "found": verdict.found,
                    "checked_at": verdict.checked_at,
                    "changed": changed,
                },
            )
        return previous, changed

    def verdicts(self) -> list[StoredVerdict]:
        return [StoredVerdict(**row) for row in self._all("states", {})]
