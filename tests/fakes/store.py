"""The operational store in memory: `BatchRepository`'s operations on dicts, for tests of
the algorithm's branches that need no PostgreSQL (like procrastinate's in-memory connector).

One `MemoryStore` holds the rows both repositories see (`batches()`, `outbox()` in
tests/fakes/outbox.py), under one lock: each method is one "transaction", as each SQL method
is. The rules are the real ones, and tests/contract checks them against PostgreSQL: one
running batch per scope (ScopeBusy), leases by the store's clock and fenced by owner
(LeaseLost), terminal rows never rewritten by a transition, `mark_committed` enqueuing the
outbox. The clock is the store's own, as `now()` is the database's: `clock.advance()` lets a
lease expire without sleeping.
"""

from __future__ import annotations

import copy
import datetime as dt
import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from fleet_import.errors import InvalidInput
from fleet_import.scope import SOURCE_SCOPE_MAX_LENGTH, Tenant
from fleet_import.store.details import BatchDetails, FailureKind, warehouse_committed
from fleet_import.store.models import (
    FLEET_MODE,
    FLEET_PIPELINE_STAGE,
    Batch,
    BatchNotRunning,
    BatchStatus,
    CachedFile,
    ContinueExisting,
    LeaseAcquired,
    LeaseHeld,
    LeaseOutcome,
    NotResumable,
    Reserved,
    ReserveOutcome,
    Resumed,
    ResumeOutcome,
    ScopeBusy,
    SourceType,
    resume_refusal,
)
from fleet_import.store.repository import InvalidTransition
from tests.fakes.review import record_review_row
from tests.fakes.state import (
    MemoryStore,
    Row,
    as_json,
    batch_of,
    cached_of,
    check_text,
    utc_text,
    without_nul,
)

_MAX_KEY_LENGTH = 200  # ingestion_batches.delivery_key
_MAX_OWNER_LENGTH = 100  # ingestion_batches.execution_lease_id


class MemoryBatchRepository:
    """`fleet_import.store.repository.BatchRepository` in memory (same methods, same
    outcomes, same errors)."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store

    # -- reservation ----------------------------------------------------------------------

    def reserve(
        self,
        tenant: Tenant,
        scope: str,
        delivery_key: str,
        details: Mapping[str, Any] | None = None,
        *,
        source_type: SourceType = SourceType.FLEET_S3,
    ) -> ReserveOutcome:
        check_text("source scope", scope, SOURCE_SCOPE_MAX_LENGTH)
        check_text("delivery key", delivery_key, _MAX_KEY_LENGTH)
        initial = BatchDetails.parse({**(details or {}), "version": 1}).to_json()
        with self.store.transaction("reserve"):
            earlier = self._delivery_row(tenant.tenant_id, scope, delivery_key)
            if earlier is not None:
                return ContinueExisting(batch_of(earlier))
            holder = self.store.running_holder(tenant.tenant_id, scope)
            if holder is not None:
                return ScopeBusy(holder["id"], holder["delivery_key"])
            now = self.store.clock.now()
            row: Row = {
                "id": self.store.new_batch_id(),
                "tenant_id": tenant.tenant_id,
                "company_id": tenant.company_id,
                "tenant_database": tenant.database,
                "mode": FLEET_MODE,
                "source_type": str(source_type),
                "business_date": None,
                "pipeline_stage": FLEET_PIPELINE_STAGE,
                "source_scope": scope,
                "delivery_key": delivery_key,
                "status": "running",
                "details": as_json(initial),
                "execution_lease_id": None,
                "execution_lease_expires_at": None,
                "is_current": False,
                "created_at": now,
                "updated_at": now,
            }
            self.store.batch_rows[row["id"]] = row
            return Reserved(batch_of(row))

    def _delivery_row(self, tenant_id: str, scope: str, delivery_key: str) -> Row | None:
        rows = [
            row
            for row in self.store.batch_rows.values()
            if row["tenant_id"] == tenant_id
            and row["source_scope"] == scope
            and row["delivery_key"] == delivery_key
            and row["status"] != "failed"
        ]
        return max(rows, key=lambda row: row["created_at"], default=None)

    def delivery_batch(self, tenant_id: str, scope: str, delivery_key: str) -> Batch | None:
        with self.store.transaction("delivery_batch"):
            row = self._delivery_row(tenant_id, scope, delivery_key)
            return None if row is None else batch_of(row)

    # -- execution leases -----------------------------------------------------------------

    def acquire_lease(self, batch_id: uuid.UUID, owner: str, ttl: float) -> LeaseOutcome:
        return self._acquire("acquire_lease", batch_id, owner, ttl, abandoned_only=False)

    def take_over(self, batch_id: uuid.UUID, owner: str, ttl: float) -> LeaseOutcome:
        return self._acquire("take_over", batch_id, owner, ttl, abandoned_only=True)

    def _acquire(
        self, name: str, batch_id: uuid.UUID, owner: str, ttl: float, *, abandoned_only: bool
    ) -> LeaseOutcome:
        check_text("lease owner", owner, _MAX_OWNER_LENGTH)
        with self.store.transaction(name):
            row = self.store.batch_rows.get(batch_id)
            if row is None:
                return BatchNotRunning(None)
            if row["status"] != "running":
                return BatchNotRunning(BatchStatus(row["status"]))
            now = self.store.clock.now()
            previous = row["execution_lease_id"]
            free = previous is None or previous == owner or row["execution_lease_expires_at"] <= now
            allowed = self.store.abandoned(row, ttl, now) or not abandoned_only
            if not (free and allowed):
                return LeaseHeld(previous, row["execution_lease_expires_at"])
            row["execution_lease_id"] = owner
            row["execution_lease_expires_at"] = now + dt.timedelta(seconds=float(ttl))
            row["updated_at"] = now
            for step in self.store.steps_of(batch_id):  # end_claims_of_other_owners
                if (
                    step["status"] == "claimed"
                    and step["claimed_by"] != owner
                    and step["claimed_until"] > now
                ):
                    step["claimed_until"] = now
                    step["updated_at"] = now
            expires_at = row["execution_lease_expires_at"]
        return LeaseAcquired(owner, expires_at, None if previous == owner else previous)

    def abandoned_uncommitted(self, ttl: float, limit: int) -> list[uuid.UUID]:
        with self.store.transaction("abandoned_uncommitted"):
            now = self.store.clock.now()
            rows = [
                row
                for row in self.store.batch_rows.values()
                if row["source_scope"] is not None
                and not warehouse_committed(row["details"])
                and self.store.abandoned(row, ttl, now)
            ]
        rows.sort(key=lambda row: (row["updated_at"], row["id"]))
        return [row["id"] for row in rows[: int(limit)]]

    def renew_lease(self, batch_id: uuid.UUID, owner: str, ttl: float) -> LeaseAcquired:
        with self.store.transaction("renew_lease"):
            row = self.store.leased_by(batch_id, owner)
            if row is None:
                raise self.store.lease_lost(batch_id, owner)
            now = self.store.clock.now()
            row["execution_lease_expires_at"] = now + dt.timedelta(seconds=float(ttl))
            row["updated_at"] = now
            return LeaseAcquired(owner, row["execution_lease_expires_at"])

    def release_lease(self, batch_id: uuid.UUID, owner: str) -> bool:
        with self.store.transaction("release_lease"):
            row = self.store.batch_rows.get(batch_id)
            if row is None or row["execution_lease_id"] != owner:
                return False
            row["execution_lease_id"] = row["execution_lease_expires_at"] = None
            row["updated_at"] = self.store.clock.now()
            return True

    def withdraw(self, batch_id: uuid.UUID, owner: str) -> bool:
        with self.store.transaction("withdraw"):
            row = self.store.batch_rows.get(batch_id)
            if (
                row is None
                or row["status"] != "running"
                or row["execution_lease_id"] != owner
                or row["details"].get("phase") != "reserved"
            ):
                return False
            del self.store.batch_rows[batch_id]
            return True

    # -- transitions (each fenced by the caller's lease) ----------------------------------

    def _patch(self, name: str, batch_id: uuid.UUID, owner: str | None, **changes: Any) -> Batch:
        """One fenced UPDATE: `details || patch` and other columns, or LeaseLost."""
        with self.store.transaction(name):
            row = self.store.leased_by(batch_id, owner)
            if row is None:
                raise self.store.lease_lost(batch_id, owner)
            patch = changes.pop("details", {})
            row["details"] = {**row["details"], **as_json(patch)}
            row.update(changes, updated_at=self.store.clock.now())
            return batch_of(row)

    def update_details(self, batch_id: uuid.UUID, owner: str, patch: Mapping[str, Any]) -> Batch:
        return self._patch("update_details", batch_id, owner, details=dict(patch))

    def mark_committed(
        self,
        batch_id: uuid.UUID,
        owner: str,
        *,
        row_counts: Mapping[str, int],
        publication_steps: Sequence[str] = (),
        patch: Mapping[str, Any] | None = None,
        lineage: Sequence[Any] = (),
    ) -> Batch:
        _no_lineage(lineage)
        with self.store.transaction("mark_committed"):
            details = {**(patch or {}), "row_counts": dict(row_counts)}
            details |= {"phase": "committed", "warehouse_committed": True}
            batch = self._patch("mark_committed", batch_id, owner, details=details)
            approves = batch.details.get("approves")
            if approves:  # an approval's commit decides the held batch, in this transaction
                record_review_row(self.store, uuid.UUID(approves), "approved", batch_id)
            now = self.store.clock.now()
            known = {step["step"] for step in self.store.steps_of(batch_id)}
            for seq, step in enumerate(publication_steps, start=1):
                if step in known:
                    continue  # ON CONFLICT (batch_id, step) DO NOTHING
                step_id = self.store.new_step_id()
                self.store.step_rows[step_id] = {
                    "id": step_id,
                    "batch_id": batch_id,
                    "step": step,
                    "seq": seq,
                    "status": "pending",
                    "attempts": 0,
                    "claimed_by": None,
                    "claimed_until": None,
                    "last_error": None,
                    "available_at": now,
                    "created_at": now,
                    "updated_at": now,
                }
            return batch

    def mark_failed(
        self,
        batch_id: uuid.UUID,
        owner: str | None,
        kind: FailureKind,
        error: str,
        facts: Mapping[str, Any] | None = None,
        lineage: Sequence[Any] = (),
    ) -> Batch:
        _no_lineage(lineage)
        with self.store.transaction("mark_failed"):
            failure = {
                **as_json(dict(facts or {})),
                "kind": str(FailureKind(kind)),
                "error": without_nul(error),
                "at": utc_text(self.store.clock.now()),
            }
            return self._patch(
                "mark_failed", batch_id, owner, status="failed", details={"failure": failure}
            )

    def mark_succeeded(
        self, batch_id: uuid.UUID, owner: str, patch: Mapping[str, Any] | None = None
    ) -> Batch:
        with self.store.transaction("mark_succeeded"):
            row = self.store.leased_by(batch_id, owner)
            if row is not None and not warehouse_committed(row["details"]):
                raise InvalidTransition(
                    f"batch {batch_id} cannot succeed: its warehouse commit was never recorded"
                )
            details = {**(patch or {}), "phase": "published"}
            return self._patch(
                "mark_succeeded", batch_id, owner, status="succeeded", details=details
            )

    # -- resume ---------------------------------------------------------------------------

    def resume_publication(
        self, batch_id: uuid.UUID, source_type: SourceType | str, scope: str
    ) -> ResumeOutcome:
        with self.store.transaction("resume_publication"):
            row = self.store.batch_rows.get(batch_id)
            if row is None:
                return NotResumable(f"batch {batch_id} does not exist")
            refusal = resume_refusal(batch_of(row), str(source_type), scope)
            if refusal is not None:
                return NotResumable(refusal)
            holder = self.store.running_holder(row["tenant_id"], scope)
            if holder is not None:
                return ScopeBusy(holder["id"], holder["delivery_key"])
            details = copy.deepcopy(row["details"])
            details["resumes"] = int(details.get("resumes", 0)) + 1
            details["last_failure"] = details.pop("failure", None)
            row.update(
                status="running",
                execution_lease_id=None,
                execution_lease_expires_at=None,
                details=details,
                updated_at=self.store.clock.now(),
            )
            return Resumed(batch_of(row))

    # -- normalized-file cache -------------------------------------------------------------

    def cached_file(self, source_key: str, etag: str, contract_version: str) -> CachedFile | None:
        with self.store.transaction("cached_file"):
            row = self.store.cache_rows.get((source_key, etag, contract_version))
            return None if row is None else cached_of(row)

    def store_cached_file(self, cached: CachedFile, batch_id: uuid.UUID | None) -> None:
        with self.store.transaction("store_cached_file"):
            key = (cached.source_key, cached.etag, cached.contract_version)
            known = self.store.cache_rows.get(key)
            # ON CONFLICT replaces every column but the dataset: the key names one file.
            dataset = cached.dataset if known is None else known["dataset"]
            self.store.cache_rows[key] = {
                **copy.deepcopy(cached.__dict__),
                "dataset": dataset,
                "details": as_json(cached.details),
                "created_by_batch": batch_id,
                "created_at": self.store.clock.now(),
            }

    def forget_cached_file(self, source_key: str, etag: str, contract_version: str) -> None:
        with self.store.transaction("forget_cached_file"):
            self.store.cache_rows.pop((source_key, etag, contract_version), None)

    # -- reads ----------------------------------------------------------------------------

    def get(self, batch_id: uuid.UUID) -> Batch | None:
        with self.store.transaction("get"):
            row = self.store.batch_rows.get(batch_id)
            return None if row is None else batch_of(row)

    def ids_with_prefix(self, prefix: str, limit: int = 2) -> list[uuid.UUID]:
        digits = prefix.replace("-", "").lower()
        if not re.fullmatch(r"[0-9a-f]{1,32}", digits):
            raise InvalidInput(f"invalid batch id prefix {prefix!r}: expected hex digits")
        with self.store.transaction("ids_with_prefix"):
            ids = sorted(i for i in self.store.batch_rows if i.hex.startswith(digits))
        return ids[: int(limit)]

    def list(
        self,
        tenant: str | None = None,
        status: BatchStatus | str | None = None,
        limit: int = 50,
        scope: str | None = None,
    ) -> list[Batch]:
        wanted = None if status is None else str(BatchStatus(status))
        with self.store.transaction("list"):
            rows = [
                row
                for row in self.store.batch_rows.values()
                if (tenant is None or row["tenant_id"] == tenant)
                and (scope is None or row["source_scope"] == scope)
                and (wanted is None or row["status"] == wanted)
            ]
            rows.sort(key=lambda row: row["id"])
            rows.sort(key=lambda row: row["created_at"], reverse=True)
            return [batch_of(row) for row in rows[: int(limit)]]


def _no_lineage(lineage: Sequence[Any]) -> None:
    """The fakes hold no lineage outbox: a test that turns OpenLineage on uses PostgreSQL."""
    if lineage:
        raise NotImplementedError("the in-memory store has no lineage outbox")
