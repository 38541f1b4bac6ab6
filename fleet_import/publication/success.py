"""A batch's success whose answer was lost: read back across the outage, so that the run
reports what happened (issue #26: a batch that did succeed is never told as a store error)."""

from __future__ import annotations

import logging
import uuid
from typing import Any

from fleet_import.errors import OperationalStoreError, is_transient
from fleet_import.retry import Backoff
from fleet_import.store.models import Batch, BatchStatus
from fleet_import.store.repository import BatchRepository

log = logging.getLogger(__name__)

READBACK = Backoff((0.5, 1.0, 2.0, 4.0), jitter=0.0)
"""How long a lost answer is read back across an outage: 7.5 s, then the store's error."""


def _transient_store_error(exc: Exception) -> bool:
    return isinstance(exc, OperationalStoreError) and is_transient(exc)


def succeed_across_outage(
    repo: BatchRepository, batch_id: uuid.UUID, owner: str, patch: dict[str, Any]
) -> Batch:
    """Succeed the batch. When the answer is lost (the connection cut after the COMMIT), the
    batch is read back, bounded: one that did succeed is returned as succeeded; one that is
    still running is succeeded again (a lease lost meanwhile raises as usual)."""
    try:
        return repo.mark_succeeded(batch_id, owner, patch)
    except OperationalStoreError as exc:
        if not is_transient(exc):
            raise
        log.warning("the success of batch %s got no answer (%s); reading it back", batch_id, exc)

    def settle() -> Batch:
        batch = repo.get(batch_id)
        if batch is not None and batch.status == BatchStatus.SUCCEEDED:
            return batch
        return repo.mark_succeeded(batch_id, owner, patch)

    return READBACK.call(
        settle, retryable=_transient_store_error, what=f"batch {batch_id}'s read-back", log=log
    )
