"""What a batch is, as every view says it: decided once, here, and read by `batches list`,
`batches show`, the held list, the Prefect artifacts and the demo.

A held batch is a failed batch whose failure kind is `held`; what an operator asks of it is
its review state:
- awaiting review: nothing decided, its content still the folder's; `batches approve` loads it;
- approved (by the batch that loaded it) or rejected (with the operator's note);
- overtaken: a later delivery of its folder loaded the same content; nothing to do;
- stale: a later delivery of its folder saw other files; the held content is gone from the
  folder, so an approval could only fail: reject it, or import the folder anew.
Overtaken and stale are read from the scope's later batches (`HeldSince`, one query for a
whole list), never from S3.

`committed` is yes, no, or unknown until settled: a running batch that reached its slice
load may have committed without recording it (a kill between the warehouse COMMIT and the
operational record); the stamp decides, read by whoever next settles it (a rerun, the drain,
`fleet-import resume`).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from fleet_import.store.details import HeldFacts
from fleet_import.store.models import Batch, BatchStatus

# Phases at or after which a running batch may have sent its slice COMMIT ("normalised" as
# stored, store.models.Phase; "normalized" read too).
_MAY_HAVE_COMMITTED = frozenset({"normalised", "normalized", "committed", "publishing"})
COMMITTED_UNKNOWN = "unknown until settled"


class ReviewState(StrEnum):
    AWAITING = "awaiting review"
    APPROVED = "approved"
    REJECTED = "rejected"
    OVERTAKEN = "overtaken"
    STALE = "stale"


@dataclass(frozen=True)
class HeldSince:
    """The newest later batch of a held batch's folder that listed it: its id, and whether
    it saw the held content and loaded it."""

    later_id: uuid.UUID
    same_content: bool
    succeeded: bool


def hold_of(batch: Batch) -> HeldFacts | None:
    """What holds a held batch (breaches, content, new columns); None for any other."""
    return batch.record.held if batch.status is BatchStatus.FAILED else None


def held_content(batch: Batch) -> dict[str, Any]:
    """The delivery identity a held batch holds (what an approval loads); empty otherwise."""
    hold = hold_of(batch)
    return dict(hold.content or {}) if hold is not None else {}


def is_held(batch: Batch) -> bool:
    return hold_of(batch) is not None


def review_state(batch: Batch, since: HeldSince | None = None) -> ReviewState | None:
    """None for a batch that was never held."""
    if not is_held(batch):
        return None
    review = batch.record.review
    decision = review.decision if review is not None else None
    if decision == "approved":
        return ReviewState.APPROVED
    if decision == "rejected":
        return ReviewState.REJECTED
    if since is not None and since.same_content and since.succeeded:
        return ReviewState.OVERTAKEN
    if since is not None and not since.same_content:
        return ReviewState.STALE
    return ReviewState.AWAITING


def review_line(batch: Batch, since: HeldSince | None = None) -> str | None:
    """The review state in words, with who decided it or what overtook it, and what to do."""
    state = review_state(batch, since)
    review = batch.record.review
    if state is ReviewState.APPROVED:
        by = review.batch_id if review is not None else None
        return "approved" + (f", loaded by batch {by}" if by else "")
    if state is ReviewState.REJECTED:
        note = review.note if review is not None else None
        return "rejected" + (f": {note}" if note else "")
    if state is ReviewState.OVERTAKEN:
        assert since is not None
        return f"overtaken: batch {since.later_id} loaded this content since; nothing to do"
    if state is ReviewState.STALE:
        assert since is not None
        return (
            f"stale: the folder changed since (batch {since.later_id} saw other files); "
            f"reject it (fleet-import batches reject {batch.id}) or import the folder anew"
        )
    if state is ReviewState.AWAITING:
        return f"awaiting review: fleet-import batches approve {batch.id}"
    return None


def shown_status(batch: Batch, since: HeldSince | None = None) -> str:
    """The status an operator sees: held batches by their review state, superseded or
    expired publications by name, a commit recorded but not published as `committed`."""
    record = batch.record
    resumed = " (resumed)" if record.resumes else ""
    if batch.status is BatchStatus.FAILED:
        if record.superseded_by:
            return "superseded"
        if record.publication_expired:
            return "expired"
        state = review_state(batch, since)
        if state is not None:
            return f"held ({state})"
        return f"failed ({record.failure.kind})" if record.failure else "failed"
    if batch.status is BatchStatus.SUCCEEDED:
        return "succeeded" + resumed
    return ("committed" if record.warehouse_committed else "running") + resumed


def committed_answer(batch: Batch) -> str:
    """yes, no, or unknown until settled: never `no` for a batch that may have committed."""
    record = batch.record
    if record.warehouse_committed:
        return "yes"
    if batch.status is BatchStatus.RUNNING and record.phase in _MAY_HAVE_COMMITTED:
        return COMMITTED_UNKNOWN
    return "no"


def awaiting_review(batch: Batch, since: HeldSince | None = None) -> bool:
    return review_state(batch, since) is ReviewState.AWAITING
