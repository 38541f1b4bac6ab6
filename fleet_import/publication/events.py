"""What a batch's transitions are told as: the `fleet.batch.*` events, their payload, and
the one way a batch is failed and told (`fail_and_tell`).

Free of Prefect: events go to a sink passed in; the flows pass one that emits Prefect events.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from fleet_import.store.details import FailureKind
from fleet_import.store.models import Batch

log = logging.getLogger(__name__)

BATCH_FAILED_EVENT = "fleet.batch.failed"

EventSink = Callable[[str, Mapping[str, Any]], None]


def event_payload(
    tenant_id: str, scope: str | None, batch_id: uuid.UUID, **extra: Any
) -> dict[str, Any]:
    """What every fleet.batch.* / fleet.slice.* event carries: whose batch, of which scope."""
    return {"tenant_id": tenant_id, "source_scope": scope, "batch_id": str(batch_id), **extra}


def emit_quietly(events: EventSink, name: str, payload: Mapping[str, Any]) -> None:
    """Events about a transition already committed must not undo or mask it."""
    try:
        events(name, payload)
    except Exception as exc:  # noqa: BLE001
        log.warning("event %s could not be emitted: %s: %s", name, type(exc).__name__, exc)


def fail_and_tell(
    events: EventSink,
    mark: Callable[[], Batch],
    kind: FailureKind,
    error: str,
    *,
    event: str = BATCH_FAILED_EVENT,
    **told: Any,
) -> Batch:
    """Fail a batch, then emit `event` (`fleet.batch.failed`, or `fleet.batch.held` for a
    batch held for review) with `kind`, `error` and `told`.

    `mark` commits the transition (`BatchRepository.mark_failed`, or
    `OutboxRepository.mark_publication_expired`); it raises (LeaseLost) when it cannot, and
    then nothing is told. The event follows the commit and a failed emit is logged, never
    raised: the store already says the batch failed, and an error escaping here would make
    the caller treat a settled batch as one that failed to settle (and mask the failure it
    records). Every path that fails a batch (pre-commit, held, abandoned, failed or expired
    publication) goes through here, so all of them tell alike."""
    failed = mark()
    payload = event_payload(
        failed.tenant_id, failed.source_scope, failed.id, kind=str(kind), error=error, **told
    )
    emit_quietly(events, event, payload)
    return failed


def expired_publication(
    batch_id: uuid.UUID, scope: str | None, stamp: uuid.UUID | None
) -> str | None:
    """The one check of "the slice is stamped by another batch, so this batch's publication
    is expired", with its one message: None while `stamp` (the slice's owner, read just
    now) is `batch_id`. Used by publication before each step, by resume, and by settle."""
    if stamp == batch_id:
        return None
    holder = "no batch" if stamp is None else f"batch {stamp}"
    return (
        f"publication expired: the slice of {scope} is stamped with {holder}, "
        f"not with batch {batch_id}"
    )
