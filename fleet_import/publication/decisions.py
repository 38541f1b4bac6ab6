"""What an approval's or a rollback's batch tells when it publishes (issue #24): the
`fleet.batch.approved` and `fleet.slice.rolled_back` events.

They are told by the batch's own `notify` step, not by the process that started the
approval or rollback: whoever finishes the publication (the run, a rerun, the drain,
`fleet-import resume`) tells them, once per completed step. Each event has an id derived
from the batch, so a step that runs again (its completion was lost) repeats the event,
not the news. The approval itself is recorded with the batch's commit
(`BatchRepository.mark_committed`); this only tells it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from fleet_import.publication.events import event_payload
from fleet_import.store.models import Batch

APPROVED_EVENT = "fleet.batch.approved"
ROLLED_BACK_EVENT = "fleet.slice.rolled_back"
_EVENT_ID_NAMESPACE = uuid.UUID("0c2a8f4e-6d1b-4f3a-b7e9-51a4c3d2e8f0")


def decision_event_id(name: str, batch_id: uuid.UUID) -> uuid.UUID:
    """The same id on every attempt of the step that tells `name` for `batch_id`."""
    return uuid.uuid5(_EVENT_ID_NAMESPACE, f"{name}/{batch_id}")


def decision_events(
    batch: Batch, get_batch: Callable[[uuid.UUID], Batch | None]
) -> list[tuple[str, dict[str, Any]]]:
    """The events `batch` (as re-read before its notify step) tells: approved, when it is
    the batch that decided the held batch it approves; rolled back, when it rolls its
    slice back to an earlier batch. Empty for any other batch."""
    record = batch.record
    row_counts = dict(record.row_counts)
    told: list[tuple[str, dict[str, Any]]] = []
    approves = record.approves
    if approves:
        held = get_batch(uuid.UUID(approves))
        review = held.record.review if held is not None else None
        decided = review is not None and review.decision == "approved"
        if decided and review.batch_id == str(batch.id):
            event_id = str(decision_event_id(APPROVED_EVENT, batch.id))
            payload = event_payload(
                batch.tenant_id,
                batch.source_scope,
                uuid.UUID(approves),
                approved_by=str(batch.id),
                event_id=event_id,
            )
            told.append((APPROVED_EVENT, payload))
    target = record.rolled_back_to
    if target:
        event_id = str(decision_event_id(ROLLED_BACK_EVENT, batch.id))
        payload = event_payload(
            batch.tenant_id,
            batch.source_scope,
            batch.id,
            rolled_back_to=target,
            replaced=record.rollback_replaced,
            row_counts=row_counts,
            event_id=event_id,
        )
        told.append((ROLLED_BACK_EVENT, payload))
    return told
