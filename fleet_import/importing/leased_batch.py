"""The batch a worker holds, and what a step may do to it.

Every step of the import, resume and the takeover works on one `LeasedBatch`: whose batch
(tenant, scope), which one (batch_id), under whose lease (owner, kept alive by heartbeat).
Each operation carries the lease: a worker that lost it cannot write (the store's
transitions are fenced by `execution_lease_id`, and `check_lease` stops it between steps).
"""

from __future__ import annotations

import enum
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from fleet_import import failpoints
from fleet_import.errors import FleetImportError
from fleet_import.importing.context import Committed, Failed, ImportContext, ImportOutcome
from fleet_import.publication.events import (
    BATCH_FAILED_EVENT,
    event_payload,
    expired_publication,
    fail_and_tell,
)
from fleet_import.publication.outcomes import PublicationExpired, PublicationFailed, Published
from fleet_import.scope import Tenant
from fleet_import.store.details import FailureKind
from fleet_import.store.heartbeat import Heartbeat
from fleet_import.store.lineage_outbox import LineageEvent
from fleet_import.store.models import Batch
from fleet_import.warehouse.base import Warehouse

log = logging.getLogger(__name__)


class Stamp(enum.Enum):
    """What the slice registry says of a batch: the proof of a warehouse commit."""

    STAMPED = "stamped"
    """The slice is this batch's: its commit went through."""
    NOT_STAMPED = "not_stamped"
    """Another batch (or none) owns the slice: this batch did not commit it, or lost it."""
    UNKNOWN = "unknown"
    """The warehouse could not be read: whether this batch committed is not known. For a
    batch that sent its COMMIT it is read back, then left to the next run (settle.py)."""


def read_stamp(warehouse: Warehouse, tenant_id: str, scope: str, batch_id: uuid.UUID) -> Stamp:
    """Whether `batch_id` owns the slice of (tenant_id, scope) now, read just now."""
    try:
        owner = warehouse.slice_owner(tenant_id, scope)
    except FleetImportError as exc:
        log.warning("the slice stamp of %s could not be read: %s", scope, exc)
        return Stamp.UNKNOWN
    return Stamp.STAMPED if owner == batch_id else Stamp.NOT_STAMPED


@dataclass(frozen=True)
class LeasedBatch:
    """A batch whose execution lease `owner` holds. `heartbeat` is None only outside the
    lease's `leased` block (nothing may then be written)."""

    ctx: ImportContext
    tenant: Tenant
    batch_id: uuid.UUID
    scope: str
    owner: str
    heartbeat: Heartbeat | None = None

    @classmethod
    def of(cls, ctx: ImportContext, batch: Batch, owner: str) -> LeasedBatch:
        """A stored batch this worker has just leased (a takeover, a resume)."""
        assert batch.source_scope is not None
        tenant = Tenant(batch.tenant_id, batch.company_id, batch.tenant_database)
        return cls(ctx, tenant, batch.id, batch.source_scope, owner)

    def holding(self, heartbeat: Heartbeat) -> LeasedBatch:
        """This batch with the heartbeat keeping its lease alive."""
        return replace(self, heartbeat=heartbeat)

    @property
    def tenant_id(self) -> str:
        return self.tenant.tenant_id

    # -- the lease ------------------------------------------------------------------------

    def check_lease(self) -> None:
        """Raise LeaseLost once the heartbeat found the lease taken, or LeaseUnconfirmed
        once it may have expired unconfirmed (the fence): stop before writing."""
        if self.heartbeat is not None:
            self.heartbeat.check()

    def renew_lease_now(self) -> None:
        """Renew synchronously: the last check before an irreversible step."""
        if self.heartbeat is not None:
            self.heartbeat.renew_now()

    # -- reading and writing the batch -------------------------------------------------------

    def read(self) -> Batch:
        batch = self.ctx.repo.get(self.batch_id)
        assert batch is not None, f"batch {self.batch_id} vanished"
        return batch

    def update_details(self, patch: Mapping[str, Any]) -> Batch:
        return self.ctx.repo.update_details(self.batch_id, self.owner, patch)

    def stamp(self) -> Stamp:
        return read_stamp(self.ctx.warehouse, self.tenant_id, self.scope, self.batch_id)

    def record_commit(
        self, *, recovered: bool, row_counts: dict[str, int], summary: dict[str, Any]
    ) -> Committed:
        """Step 6: the warehouse commit recorded and the outbox enqueued, in one operational
        transaction. If this fails, the batch stays running and a rerun finds the stamp and
        redoes only this. With OpenLineage on, the batch's RunEvents are enqueued in that
        transaction too."""
        batch = self.ctx.repo.mark_committed(
            self.batch_id,
            self.owner,
            row_counts=row_counts,
            publication_steps=self.ctx.publication_steps(),
            patch={"summary": summary},
            lineage=self._lineage_events(row_counts, summary),
        )
        failpoints.hit("after_operational_commit")
        self.ctx.events(
            "fleet.batch.committed",
            event_payload(
                batch.tenant_id,
                batch.source_scope,
                batch.id,
                row_counts=row_counts,
                recovered=recovered,
            ),
        )
        return Committed(self.batch_id, self.scope, row_counts, summary, recovered)

    def _lineage_events(
        self, row_counts: dict[str, int], summary: dict[str, Any]
    ) -> list[LineageEvent]:
        """The commit's OpenLineage events; none (logged) if they cannot be built: lineage
        never stands between a slice and its commit record."""
        if self.ctx.lineage is None:
            return []
        from fleet_import.publication.lineage import committed_events

        try:
            return committed_events(
                self.read(), row_counts, summary, self.ctx.contracts, self.ctx.lineage.naming
            )
        except Exception as exc:  # noqa: BLE001 - see the docstring
            log.warning("the OpenLineage events of batch %s were not built: %s", self.batch_id, exc)
            return []

    def fail(
        self,
        kind: FailureKind,
        error: str,
        facts: Mapping[str, Any] | None = None,
        *,
        event: str = BATCH_FAILED_EVENT,
        told: Mapping[str, Any] | None = None,
    ) -> Failed:
        """Fail the batch as `kind` (facts kept in its failure record), and tell it as
        `event` with `told` (by default the facts). A batch whose slice reached the
        warehouse gets its OpenLineage FAIL events."""
        lineage = self._failed_lineage(kind, error)
        fail_and_tell(
            self.ctx.events,
            lambda: self.ctx.repo.mark_failed(
                self.batch_id, self.owner, kind, error, facts, lineage=lineage
            ),
            kind,
            error,
            event=event,
            **dict((facts if told is None else told) or {}),
        )
        if lineage and self.ctx.lineage is not None:
            self.ctx.lineage.delivery.deliver_quietly(self.owner, self.batch_id)
        return Failed(self.batch_id, kind, error)

    def _failed_lineage(self, kind: FailureKind, error: str) -> list[LineageEvent]:
        """FAIL events for a batch that opened its slice in the warehouse (a session was
        recorded) and failed before committing; none for one that never got that far."""
        if self.ctx.lineage is None or kind != FailureKind.FAILED_PRE_COMMIT:
            return []
        from fleet_import.publication.lineage import failed_events

        try:
            batch = self.read()
            if "warehouse_session" not in batch.details:
                return []
            return failed_events(batch, error, self.ctx.contracts, self.ctx.lineage.naming)
        except Exception as exc:  # noqa: BLE001 - lineage never stands between a batch and its end
            log.warning("the OpenLineage events of batch %s were not built: %s", self.batch_id, exc)
            return []

    def publish(self, committed: Committed) -> ImportOutcome:
        """Steps 7-8: drain the batch's outbox, then succeed it (the Publisher does); then
        deliver its lineage, whatever came of publication and whether or not the endpoint
        answers (undelivered events wait in the lineage outbox for the drain)."""
        outcome = self._publish(committed)
        if self.ctx.lineage is not None:
            self.ctx.lineage.delivery.deliver_quietly(self.owner, self.batch_id)
        return outcome

    def _publish(self, committed: Committed) -> ImportOutcome:
        ctx = self.ctx
        if ctx.publisher is None:
            failpoints.hit("before_mark_succeeded")
            ctx.repo.mark_succeeded(self.batch_id, self.owner)
            return replace(committed, published=True)
        outcome = ctx.publisher.publish_batch(self.batch_id, self.owner, heartbeat=self.heartbeat)
        if isinstance(outcome, Published):
            return replace(committed, published=True)
        if isinstance(outcome, PublicationFailed):
            ctx.publisher.mark_failed_publication(self.batch_id, self.owner, outcome)
            failure = self.read().record.failure
            error = failure.error if failure is not None else outcome.error
            return Failed(self.batch_id, FailureKind.FAILED_PUBLICATION, error, resumable=True)
        if isinstance(outcome, PublicationExpired):
            error = expired_publication(self.batch_id, self.scope, outcome.slice_owner)
            return Failed(self.batch_id, FailureKind.FAILED_PUBLICATION, error or "", expired=True)
        return committed  # busy or deferred: a drain finishes it
