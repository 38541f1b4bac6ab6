"""What the operational store holds and what its operations answer.

Outcomes are values, not exceptions: a caller must handle ScopeBusy or LeaseHeld as a normal
result, so each operation returns one of a small closed set of dataclasses.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property
from typing import Any

from fleet_import.errors import DetailsInvalid
from fleet_import.store.details import BatchDetails


class SourceType(StrEnum):
    """Append-only: existing serialised values never change."""

    BRINK_POS = "brink_pos"
    KDS_CDC = "kds_cdc"
    MANUAL_UPLOAD = "manual_upload"
    FLEET_S3 = "fleet_s3"
    TENANT_PURGE = "tenant_purge"  # an offboarding, recorded (fleet_import.store.purges)


class BatchStatus(StrEnum):
    RUNNING = "running"
    FAILED = "failed"
    SUCCEEDED = "succeeded"


FLEET_MODE = "file_upload"
FLEET_PIPELINE_STAGE = "fleet_s3_direct_to_curated"


@dataclass(frozen=True)
class Batch:
    id: uuid.UUID
    tenant_id: str
    company_id: str
    tenant_database: str
    mode: str
    source_type: str
    business_date: dt.date | None
    pipeline_stage: str
    source_scope: str | None
    delivery_key: str | None
    status: BatchStatus
    details: dict[str, Any]
    execution_lease_id: str | None
    execution_lease_expires_at: dt.datetime | None
    is_current: bool
    created_at: dt.datetime
    updated_at: dt.datetime

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Batch:
        return cls(**{**row, "status": BatchStatus(row["status"])})

    @cached_property
    def record(self) -> BatchDetails:
        """The details, typed: what every view and step reads of them."""
        return BatchDetails.parse(self.details)


# reserve
@dataclass(frozen=True)
class Reserved:
    batch: Batch


@dataclass(frozen=True)
class ContinueExisting:
    """This delivery reserved a batch of this scope before: continue it if it still runs;
    if it succeeded, the delivery does no work (a duplicate never reloads)."""

    batch: Batch


@dataclass(frozen=True)
class ScopeBusy:
    """Another running batch holds the scope; nothing was written."""

    holder_batch_id: uuid.UUID
    holder_delivery_key: str | None = None


ReserveOutcome = Reserved | ContinueExisting | ScopeBusy


# leases
@dataclass(frozen=True)
class LeaseAcquired:
    owner: str
    expires_at: dt.datetime
    previous_owner: str | None = None
    """The owner whose lease this acquisition ended (taken over after its expiry)."""


@dataclass(frozen=True)
class LeaseHeld:
    owner: str | None
    expires_at: dt.datetime | None


@dataclass(frozen=True)
class BatchNotRunning:
    status: BatchStatus | None  # None: no such batch


LeaseOutcome = LeaseAcquired | LeaseHeld | BatchNotRunning


# resume
@dataclass(frozen=True)
class Resumed:
    batch: Batch


@dataclass(frozen=True)
class NotResumable:
    reason: str


ResumeOutcome = Resumed | NotResumable | ScopeBusy


@dataclass(frozen=True)
class FileInUse:
    """A source file a batch was loaded from, as cache entries name it; None where unknown."""

    source_key: str
    etag: str | None
    contract_version: str | None


@dataclass(frozen=True)
class CachedFile:
    """A normalized source file: `(source_key, etag, contract_version)` -> staged output."""

    source_key: str
    etag: str
    contract_version: str
    dataset: str
    output_uri: str
    row_count: int
    reject_count: int
    details: dict[str, Any]


def resume_refusal(batch: Batch, source_type: str, scope: str) -> str | None:
    """Why `resume_publication` would refuse this batch as read, or None. A caller checks it
    before its own costlier proofs (the warehouse stamp); the resume checks it again under
    the row lock."""
    if batch.source_type != source_type:
        return f"batch {batch.id} is a {batch.source_type} batch, not {source_type}"
    if batch.source_scope != scope:
        return f"batch {batch.id} imports {batch.source_scope!r}, not {scope!r}"
    if batch.status == BatchStatus.SUCCEEDED:
        return f"batch {batch.id} already succeeded"
    if batch.status == BatchStatus.RUNNING:
        return f"batch {batch.id} is still running; its executor continues it"
    try:
        details = batch.record
    except DetailsInvalid as exc:
        return str(exc)
    if not details.warehouse_committed:
        return f"batch {batch.id} never committed its slice; recovery is a new batch"
    if details.phase == "published":
        return f"batch {batch.id} already finished its publication"
    if details.superseded_by:
        return f"batch {batch.id} was superseded by {details.superseded_by}"
    if details.publication_expired:
        return f"batch {batch.id}'s publication expired: a newer batch owns its slice"
    return None
