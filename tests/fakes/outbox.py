"""`fleet_import.store.outbox.OutboxRepository` in memory, on a `MemoryStore`'s rows: the
head-step claim, claims fenced by worker and ended with the lease, backoff by the store's
clock, supersession and the cache clean-up of a superseded batch (see outbox.sql, section
by section; tests/contract holds both to the same assertions)."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterable, Sequence

from fleet_import.errors import InvalidInput, LeaseLost
from fleet_import.retry import Backoff
from fleet_import.store.details import warehouse_committed
from fleet_import.store.models import Batch, CachedFile, FileInUse
from fleet_import.store.outbox import ClaimLost, OutboxStep
from tests.fakes.state import MemoryStore, Row, as_json, batch_of, cached_of, utc_text

_MAX_WORKER_LENGTH = 100
_MAX_ERROR_LENGTH = 2000
_OPEN = ("pending", "failed")


def _step_of(row: Row) -> OutboxStep:
    return OutboxStep.from_row(dict(row))


class MemoryOutboxRepository:
    def __init__(self, store: MemoryStore) -> None:
        self.store = store

    # -- claiming and finishing steps -----------------------------------------------------

    def claim_next(
        self,
        batch_id: uuid.UUID,
        worker: str,
        claim_ttl: float,
        *,
        lease_owner: str | None = None,
    ) -> OutboxStep | None:
        if not isinstance(worker, str) or not worker or len(worker) > _MAX_WORKER_LENGTH:
            raise InvalidInput(
                f"invalid outbox worker {worker!r}: expected 1-{_MAX_WORKER_LENGTH} characters"
            )
        with self.store.transaction("claim_next"):
            batch = self.store.batch_rows.get(batch_id)
            if batch is None or batch["status"] != "running":
                return None
            if lease_owner is not None and batch["execution_lease_id"] != lease_owner:
                return None
            head = next((s for s in self.store.steps_of(batch_id) if s["status"] != "done"), None)
            if head is None:
                return None
            now = self.store.clock.now()
            previous_status, previous_worker = head["status"], head["claimed_by"]
            waiting = previous_status in _OPEN and head["available_at"] <= now
            expired = previous_status == "claimed" and head["claimed_until"] <= now
            if not (waiting or expired):
                return None
            head.update(
                status="claimed",
                claimed_by=worker,
                claimed_until=now + dt.timedelta(seconds=float(claim_ttl)),
                updated_at=now,
            )
            if expired:
                head["attempts"] += 1
                head["last_error"] = (
                    f"the claim of {previous_worker or '?'} expired before the step finished"
                )
            return _step_of(head)

    def _claimed(self, step_id: int, worker: str) -> Row:
        row = self.store.step_rows.get(step_id)
        if row is None or row["status"] != "claimed" or row["claimed_by"] != worker:
            raise self._claim_lost(step_id, worker)
        return row

    def complete(self, step_id: int, worker: str) -> OutboxStep:
        with self.store.transaction("complete"):
            row = self._claimed(step_id, worker)
            row.update(status="done", claimed_until=None, updated_at=self.store.clock.now())
            return _step_of(row)

    def fail(
        self, step_id: int, worker: str, error: str, max_attempts: int, backoff: Backoff
    ) -> OutboxStep:
        with self.store.transaction("fail"):
            row = self._claimed(step_id, worker)
            attempts = int(row["attempts"]) + 1
            dead = attempts >= max_attempts
            delay = 0.0 if dead else max(0.0, backoff.after(attempts))
            now = self.store.clock.now()
            row.update(
                status="dead" if dead else "pending",
                attempts=attempts,
                last_error=error[:_MAX_ERROR_LENGTH],
                claimed_by=row["claimed_by"] if dead else None,
                claimed_until=None,
                available_at=now + dt.timedelta(seconds=delay),
                updated_at=now,
            )
            return _step_of(row)

    def release(self, step_id: int, worker: str) -> bool:
        with self.store.transaction("release"):
            try:
                row = self._claimed(step_id, worker)
            except ClaimLost:
                return False
            row.update(
                status="pending",
                claimed_by=None,
                claimed_until=None,
                updated_at=self.store.clock.now(),
            )
            return True

    def reopen_dead_steps(self, batch_id: uuid.UUID) -> int:
        with self.store.transaction("reopen_dead_steps"):
            now = self.store.clock.now()
            reopened = 0
            for row in self.store.steps_of(batch_id):
                waiting = row["status"] == "pending" and row["available_at"] > now
                if row["status"] in ("dead", "failed") or waiting:
                    row.update(
                        status="pending",
                        attempts=0,
                        claimed_by=None,
                        claimed_until=None,
                        available_at=now,
                        updated_at=now,
                    )
                    reopened += 1
            return reopened

    def _claim_lost(self, step_id: int, worker: str) -> ClaimLost:
        row = self.store.step_rows.get(step_id)
        if row is None:
            return ClaimLost(f"outbox step {step_id} does not exist")
        return ClaimLost(
            f"outbox step {step_id} ({row['step']}) is {row['status']}, claimed by "
            f"{row['claimed_by']!r}; {worker!r} may not record its result"
        )

    # -- reads ----------------------------------------------------------------------------

    def steps(self, batch_id: uuid.UUID) -> list[OutboxStep]:
        with self.store.transaction("steps"):
            return [_step_of(row) for row in self.store.steps_of(batch_id)]

    def batches_with_open_steps(self, limit: int) -> list[uuid.UUID]:
        with self.store.transaction("batches_with_open_steps"):
            now = self.store.clock.now()
            found = []
            for row in self.store.batch_rows.values():
                if (
                    row["status"] != "running"
                    or not warehouse_committed(row["details"])
                ):
                    continue
                if (
                    row["execution_lease_id"] is not None
                    and row["execution_lease_expires_at"] > now
                ):
                    continue
                head = next(
                    (s for s in self.store.steps_of(row["id"]) if s["status"] != "done"), None
                )
                if head is not None and head["status"] in _OPEN and head["available_at"] > now:
                    continue
                found.append(row)
        found.sort(key=lambda row: (row["updated_at"], row["id"]))
        return [row["id"] for row in found[: int(limit)]]

    # -- the batch-level writes of publication --------------------------------------------

    def _same_scope(self, earlier: Row, later: Row) -> bool:
        return (
            earlier["id"] != later["id"]
            and earlier["tenant_id"] == later["tenant_id"]
            and earlier["source_scope"] == later["source_scope"]
            and earlier["created_at"] < later["created_at"]
        )

    def mark_superseded(self, batch_id: uuid.UUID, superseded_by: uuid.UUID) -> bool:
        with self.store.transaction("mark_superseded"):
            prev = self.store.batch_rows.get(batch_id)
            successor = self.store.batch_rows.get(superseded_by)
            if prev is None or successor is None or not self._same_scope(prev, successor):
                return False
            marked = prev["details"].get("superseded_by")
            if prev["status"] != "succeeded" or marked not in (None, str(superseded_by)):
                return False
            prev["details"] = {**prev["details"], "superseded_by": str(superseded_by)}
            prev["updated_at"] = self.store.clock.now()
            return True

    def supersede_failed_publications(self, superseded_by: uuid.UUID) -> list[uuid.UUID]:
        with self.store.transaction("supersede_failed_publications"):
            cur = self.store.batch_rows.get(superseded_by)
            if cur is None:
                return []
            now = self.store.clock.now()
            superseded = []
            for prev in self.store.batch_rows.values():
                failure = prev["details"].get("failure") or {}
                if (
                    not self._same_scope(prev, cur)
                    or prev["status"] != "failed"
                    or failure.get("kind") != "failed_publication"
                    or prev["details"].get("superseded_by") not in (None, str(cur["id"]))
                ):
                    continue
                prev["details"] = {**prev["details"], "superseded_by": str(cur["id"])}
                prev["updated_at"] = now
                superseded.append(prev["id"])
                for step in self.store.steps_of(prev["id"]):
                    ran_out = step["status"] == "claimed" and step["claimed_until"] <= now
                    if step["status"] in ("pending", "failed", "dead") or ran_out:
                        step.update(
                            status="retired", claimed_by=None, claimed_until=None, updated_at=now
                        )
            return sorted(superseded)

    def mark_publication_expired(self, batch_id: uuid.UUID, owner: str, error: str) -> Batch:
        with self.store.transaction("mark_publication_expired"):
            row = self.store.leased_by(batch_id, owner)
            if row is None:
                raise LeaseLost(
                    f"batch {batch_id} is not running under lease owner {owner!r}; "
                    "its publication cannot be marked expired"
                )
            now = self.store.clock.now()
            failure = {
                "kind": "failed_publication",
                "error": error[:_MAX_ERROR_LENGTH],
                "at": utc_text(now),
            }
            patch = as_json({"publication_expired": True, "failure": failure})
            row.update(status="failed", details={**row["details"], **patch}, updated_at=now)
            return batch_of(row)

    def previous_batch(self, batch_id: uuid.UUID) -> Batch | None:
        with self.store.transaction("previous_batch"):
            cur = self.store.batch_rows.get(batch_id)
            if cur is None:
                return None
            earlier = [
                prev
                for prev in self.store.batch_rows.values()
                if self._same_scope(prev, cur)
                and prev["status"] == "succeeded"
                and prev["details"].get("superseded_by") in (None, str(cur["id"]))
            ]
            latest = max(earlier, key=lambda row: (row["created_at"], row["id"]), default=None)
            return None if latest is None else batch_of(latest)

    # -- the normalized-file cache of a superseded batch ----------------------------------

    def _replaced_by(self, entry: Row, cur: Row) -> bool:
        """Created by a finished, earlier batch of `cur`'s scope."""
        creator = self.store.batch_rows.get(entry["created_by_batch"])
        return (
            creator is not None
            and self._same_scope(creator, cur)
            and creator["status"] != "running"
        )

    def cache_entries_only_used_by(
        self, batch_id: uuid.UUID, in_use: Iterable[FileInUse]
    ) -> list[CachedFile]:
        files = list(in_use)
        with self.store.transaction("cache_entries_only_used_by"):
            cur = self.store.batch_rows.get(batch_id)
            if cur is None:
                return []
            found = [
                entry
                for key, entry in sorted(self.store.cache_rows.items())
                if self._replaced_by(entry, cur)
                and not any(
                    f.source_key == key[0]
                    and f.etag in (None, key[1])
                    and f.contract_version in (None, key[2])
                    for f in files
                )
            ]
            return [cached_of(entry) for entry in found]

    def forget_cache_entries(
        self, batch_id: uuid.UUID, entries: Sequence[CachedFile]
    ) -> list[CachedFile]:
        with self.store.transaction("forget_cache_entries"):
            cur = self.store.batch_rows.get(batch_id)
            forgotten = []
            for entry in entries:
                key = (entry.source_key, entry.etag, entry.contract_version)
                row = self.store.cache_rows.get(key)
                if cur is not None and row is not None and self._replaced_by(row, cur):
                    forgotten.append(cached_of(self.store.cache_rows.pop(key)))
            return forgotten
