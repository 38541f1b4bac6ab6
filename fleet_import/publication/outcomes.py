"""What one publication attempt ended in (`Publisher.publish_batch`, `Publisher.drain`)."""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass


@dataclass(frozen=True)
class Published:
    """Every step is done and the batch succeeded."""

    batch_id: uuid.UUID
    steps: tuple[str, ...]


@dataclass(frozen=True)
class PublicationFailed:
    """A step failed. Not dead: it is retried after its backoff. Dead: it is not retried until
    an explicit resume, and the caller marks the batch failed_publication."""

    batch_id: uuid.UUID
    step: str
    error: str
    attempts: int
    dead: bool


@dataclass(frozen=True)
class PublicationExpired:
    """Another batch owns the slice: this batch is failed with publication_expired."""

    batch_id: uuid.UUID
    step: str
    slice_owner: uuid.UUID | None


@dataclass(frozen=True)
class PublicationBusy:
    """Another drain holds the claim on the batch's next step."""

    batch_id: uuid.UUID
    step: str
    claimed_by: str | None


@dataclass(frozen=True)
class PublicationDeferred:
    """The next step waits out its backoff; a later drain runs it (we never sleep for it)."""

    batch_id: uuid.UUID
    step: str
    available_at: dt.datetime


@dataclass(frozen=True)
class PublicationRefused:
    """The batch's tenant may not publish now (`fleet_import.tenants.binding.Refused`: unknown
    or disabled in the registry, or its folder no longer binds): nothing of its publication
    ran; the batch is failed_publication, its committed slice as it was. Recovered by
    re-admitting the tenant and resuming the batch, or by purging the tenant."""

    batch_id: uuid.UUID
    kind: str
    reason: str


PublishOutcome = (
    Published
    | PublicationFailed
    | PublicationExpired
    | PublicationBusy
    | PublicationDeferred
    | PublicationRefused
)
