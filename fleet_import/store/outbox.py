"""OutboxRepository: the one layer that runs publication-outbox SQL.

Publication steps are rows of `publication_outbox`, enqueued by `BatchRepository.mark_committed`
in the transaction that records the warehouse commit. Drains claim them here; the claim is a
row in PostgreSQL (not a process flag), so drains in threads, processes or hosts never run one
step at the same time. As in BatchRepository, every method is one transaction on its own
connection, and psycopg errors are translated at one boundary.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from fleet_import.errors import InvalidInput, LeaseLost
from fleet_import.retry import Backoff
from fleet_import.sqlfiles import load_queries
from fleet_import.store.connection import SqlStore
from fleet_import.store.models import Batch, CachedFile, FileInUse

QUERIES = load_queries("fleet_import.store", "outbox.sql")
_MAX_WORKER_LENGTH = 100  # publication_outbox.claimed_by is varchar(100)
# Enough of a traceback's last line to act on; the full error belongs in the worker's log.
_MAX_ERROR_LENGTH = 2000


class ClaimLost(LeaseLost):
    """This worker no longer holds the step's claim; it must not record the step's result."""


class StepStatus(StrEnum):
    PENDING = "pending"
    CLAIMED = "claimed"
    DONE = "done"
    FAILED = "failed"  # a legacy "retry later"; claimed like pending
    DEAD = "dead"
    RETIRED = "retired"  # its batch was superseded: never claimed, reopened or run again


@dataclass(frozen=True)
class OutboxStep:
    id: int
    batch_id: uuid.UUID
    step: str
    seq: int
    status: StepStatus
    attempts: int
    claimed_by: str | None
    claimed_until: dt.datetime | None
    last_error: str | None
    available_at: dt.datetime
    created_at: dt.datetime
    updated_at: dt.datetime

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> OutboxStep:
        return cls(**{**row, "status": StepStatus(row["status"])})


class OutboxRepository(SqlStore):
    queries = QUERIES

    # -- claiming and finishing steps -----------------------------------------------------

    def claim_next(
        self,
        batch_id: uuid.UUID,
        worker: str,
        claim_ttl: float,
        *,
        lease_owner: str | None = None,
    ) -> OutboxStep | None:
        """Claim the batch's head step if it is runnable now; None if there is none.

        None covers: every step done, the head claimed by a live worker, the head waiting
        out a backoff or dead, the batch not running, or (with `lease_owner`) the batch's
        execution lease held by someone else. `steps()` tells them apart.
        """
        _check_worker(worker)
        row = self._one(
            "claim_next",
            {
                "batch_id": batch_id,
                "worker": worker,
                "ttl": float(claim_ttl),
                "lease_owner": lease_owner,
            },
        )
        return None if row is None else OutboxStep.from_row(row)

    def complete(self, step_id: int, worker: str) -> OutboxStep:
        row = self._one("complete", {"step_id": step_id, "worker": worker})
        if row is None:
            raise self._claim_lost(step_id, worker)
        return OutboxStep.from_row(row)

    def fail(
        self, step_id: int, worker: str, error: str, max_attempts: int, backoff: Backoff
    ) -> OutboxStep:
        """Count a failed attempt: back to pending after `backoff.after(attempts)`, or dead
        once `max_attempts` attempts have failed."""
        params: dict[str, Any] = {"step_id": step_id, "worker": worker}
        with self._transaction() as conn:
            locked = conn.execute(QUERIES["lock_claimed_step"], params).fetchone()
            if locked is not None:
                attempts = int(locked["attempts"]) + 1
                dead = attempts >= max_attempts
                params |= {
                    "attempts": attempts,
                    "dead": dead,
                    "delay": 0.0 if dead else max(0.0, backoff.after(attempts)),
                    "error": error[:_MAX_ERROR_LENGTH],
                }
                row = conn.execute(QUERIES["fail"], params).fetchone()
        if locked is None or row is None:
            raise self._claim_lost(step_id, worker)
        return OutboxStep.from_row(row)

    def release(self, step_id: int, worker: str) -> bool:
        """Hand back a claimed step that did not run. False if the claim was not ours."""
        return self._one("release", {"step_id": step_id, "worker": worker}) is not None

    def reopen_dead_steps(self, batch_id: uuid.UUID) -> int:
        """After an explicit resume: dead steps become pending with fresh attempts."""
        return len(self._all("reopen_dead_steps", {"batch_id": batch_id}))

    def _claim_lost(self, step_id: int, worker: str) -> ClaimLost:
        row = self._one("step_state", {"step_id": step_id})
        if row is None:
            return ClaimLost(f"outbox step {step_id} does not exist")
        return ClaimLost(
            f"outbox step {step_id} ({row['step']}) is {row['status']}, claimed by "
            f"{row['claimed_by']!r}; {worker!r} may not record its result"
        )

    # -- reads ----------------------------------------------------------------------------

    def steps(self, batch_id: uuid.UUID) -> list[OutboxStep]:
        return [OutboxStep.from_row(row) for row in self._all("steps", {"batch_id": batch_id})]

    def batches_with_open_steps(self, limit: int) -> list[uuid.UUID]:
        """Running, committed batches a drain could publish now (see outbox.sql)."""
        rows = self._all("batches_with_open_steps", {"limit": int(limit)})
        return [row["id"] for row in rows]

    # -- the batch-level writes of publication --------------------------------------------

    def mark_superseded(self, batch_id: uuid.UUID, superseded_by: uuid.UUID) -> bool:
        """Record on a succeeded batch which later batch replaced its slice. False if it is
        not a succeeded batch of the same scope, or another batch superseded it already."""
        row = self._one("mark_superseded", {"batch_id": batch_id, "superseded_by": superseded_by})
        return row is not None

    def supersede_failed_publications(self, superseded_by: uuid.UUID) -> list[uuid.UUID]:
        """Mark every earlier failed publication of the batch's scope superseded by it and
        retire their open steps: their slices were replaced, so nothing of them may publish
        or be resumed. Returns the batches superseded (again, on a retry)."""
        rows = self._all("supersede_failed_publications", {"batch_id": superseded_by})
        return [row["id"] for row in rows]

    def mark_publication_expired(self, batch_id: uuid.UUID, owner: str, error: str) -> Batch:
        """Fail the batch for good: a newer batch owns its slice, so nothing of its
        publication may run. Fenced by the execution lease; LeaseLost otherwise."""
        row = self._one(
            "mark_publication_expired",
            {"batch_id": batch_id, "owner": owner, "error": error[:_MAX_ERROR_LENGTH]},
        )
        if row is None:
            raise LeaseLost(
                f"batch {batch_id} is not running under lease owner {owner!r}; "
                "its publication cannot be marked expired"
            )
        return Batch.from_row(row)

    def previous_batch(self, batch_id: uuid.UUID) -> Batch | None:
        row = self._one("previous_batch", {"batch_id": batch_id})
        return None if row is None else Batch.from_row(row)

    # -- the normalized-file cache of a superseded batch ----------------------------------

    def cache_entries_only_used_by(
        self, batch_id: uuid.UUID, in_use: Iterable[FileInUse]
    ) -> list[CachedFile]:
        """Cache entries that only batches before `batch_id` used: created by a finished
        batch of its scope older than it, and not among the files it was loaded from
        (`in_use`; a None etag or version there matches any). The slice it committed
        replaced all of theirs."""
        files = list(in_use)
        rows = self._all(
            "cache_entries_only_used_by",
            {
                "batch_id": batch_id,
                "keep_keys": [f.source_key for f in files],
                "keep_etags": [f.etag for f in files],
                "keep_versions": [f.contract_version for f in files],
            },
        )
        return [CachedFile(**row) for row in rows]

    def forget_cache_entries(
        self, batch_id: uuid.UUID, entries: Sequence[CachedFile]
    ) -> list[CachedFile]:
        """Delete these entries unless another batch re-stored them meanwhile; returns those
        deleted."""
        if not entries:
            return []
        rows = self._all(
            "forget_cache_entries",
            {
                "batch_id": batch_id,
                "source_keys": [e.source_key for e in entries],
                "etags": [e.etag for e in entries],
                "contract_versions": [e.contract_version for e in entries],
            },
        )
        return [CachedFile(**row) for row in rows]


def _check_worker(worker: object) -> None:
    if not isinstance(worker, str) or not worker or len(worker) > _MAX_WORKER_LENGTH:
        raise InvalidInput(
            f"invalid outbox worker {worker!r}: expected 1-{_MAX_WORKER_LENGTH} characters"
        )
