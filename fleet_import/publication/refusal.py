"""A committed batch whose tenant is refused now (unknown or disabled in the registry, or
its folder no longer binds) publishes nothing: the same rule as an import's, asked of the
`Admission` in force (`fleet_import.intake.admission.admission`) before any step runs.

What is true then: the slice committed and readers see it; no step of its publication ran.
So the batch ends failed_publication with the refusal as its error. Not left running: a
running batch would block the tenant's purge and be refused again by every drain. Not lost:
once the tenant is admitted again, `fleet-import resume BATCH` publishes it; or
`fleet-import tenants purge TENANT --confirm` removes its slice with the rest.
"""

from __future__ import annotations

import logging
import uuid

from fleet_import.publication.events import EventSink, emit_quietly, fail_and_tell
from fleet_import.publication.outcomes import PublicationRefused
from fleet_import.scope import folder_of_scope
from fleet_import.store.details import FailureKind
from fleet_import.store.models import Batch
from fleet_import.store.repository import BatchRepository
from fleet_import.tenants.binding import DELIVERY_REFUSED_EVENT, Admission, Refused

log = logging.getLogger(__name__)


def refusal_of(batch: Batch | None, admission: Admission | None) -> Refused | None:
    """Why `batch`'s tenant may not publish it now, or None (no admission: no rule)."""
    if batch is None or batch.source_scope is None or admission is None:
        return None
    admitted = admission(batch.tenant_id, folder_of_scope(batch.source_scope))
    return admitted if isinstance(admitted, Refused) else None


def refuse_publication(
    repo: BatchRepository,
    events: EventSink,
    batch_id: uuid.UUID,
    owner: str,
    refusal: Refused,
    source: str,
) -> PublicationRefused:
    """Fail the batch (`owner` holds its lease) as failed_publication with the refusal, and
    tell: `fleet.batch.failed` and DELIVERY_REFUSED_EVENT (its `source` the entry point)."""
    error = (
        f"publication refused: {refusal.reason}; the committed slice stays as it is "
        f"(admit the tenant again and resume batch {batch_id}, or purge the tenant)"
    )
    kind = FailureKind.FAILED_PUBLICATION
    fail_and_tell(
        events,
        lambda: repo.mark_failed(batch_id, owner, kind, error, {"refused": refusal.kind}),
        kind,
        error,
        refused=refusal.kind,
    )
    tell_refusal(events, refusal, source, batch_id=str(batch_id))
    log.warning("batch %s publishes nothing: %s", batch_id, refusal.reason)
    return PublicationRefused(batch_id, refusal.kind, refusal.reason)


def tell_refusal(events: EventSink, refusal: Refused, source: str, **more: str) -> Refused:
    """Announce `refusal` as DELIVERY_REFUSED_EVENT from entry point `source`; return it."""
    emit_quietly(events, DELIVERY_REFUSED_EVENT, refusal.payload(source, **more))
    return refusal
