"""Finish a batch whose slice committed but whose publication did not: a failed publication
(explicit resume) or a worker that died after the warehouse commit. Never reloads a row.
A batch whose tenant the tenant rule in force refuses (the `Admission` handed in) is
`Refused` before anything changes, as the drain refuses it (publication.refusal)."""

from __future__ import annotations

import uuid

from fleet_import.errors import WarehouseError
from fleet_import.importing.claim import new_owner
from fleet_import.importing.context import (
    Failed,
    ImportContext,
    ImportOutcome,
    NotClaimed,
    NothingToDo,
    Skipped,
)
from fleet_import.importing.leased_batch import LeasedBatch
from fleet_import.importing.settle import fail_pre_commit, may_have_committed, recover_committed
from fleet_import.publication.events import expired_publication, fail_and_tell
from fleet_import.publication.refusal import refusal_of, tell_refusal
from fleet_import.store.details import FailureKind
from fleet_import.store.heartbeat import leased
from fleet_import.store.models import (
    Batch,
    BatchNotRunning,
    BatchStatus,
    LeaseHeld,
    NotResumable,
    ScopeBusy,
    SourceType,
    resume_refusal,
)
from fleet_import.store.outbox import OutboxRepository
from fleet_import.tenants.binding import Admission, Refused

RESUME = "resume-publication"  # a refusal's `source`, as the flow is named


def resume_batch(
    ctx: ImportContext,
    outbox: OutboxRepository,
    batch_id: uuid.UUID,
    *,
    owner: str | None = None,
    admission: Admission | None = None,
) -> ImportOutcome | NotResumable | Refused:
    """`admission` None: no tenant rule (core tests); every entry point hands in
    `intake.admission.admission(settings)`."""
    batch = ctx.repo.get(batch_id)
    if batch is None or batch.source_scope is None:
        return NotResumable(f"batch {batch_id} does not exist or is not a fleet batch")
    refused = refusal_of(batch, admission)
    if refused is not None:  # an offboarded tenant's batch publishes nothing
        return tell_refusal(ctx.events, refused, RESUME, batch_id=str(batch_id))
    scope = batch.source_scope
    if batch.status != BatchStatus.RUNNING:
        refused = _refusal(ctx, batch, scope)
        if refused is not None:
            return refused
        resumed = ctx.repo.resume_publication(batch_id, SourceType.FLEET_S3, scope)
        if isinstance(resumed, ScopeBusy):
            return Skipped(scope, resumed.holder_batch_id)
        if isinstance(resumed, NotResumable):
            return resumed
    owner = owner or new_owner()
    lease = ctx.repo.acquire_lease(batch_id, owner, ctx.lease_ttl)
    if isinstance(lease, LeaseHeld):
        return NotClaimed(batch_id, lease.owner, lease.expires_at)
    if isinstance(lease, BatchNotRunning):
        return NothingToDo(batch_id, str(lease.status))
    with leased(ctx.repo, batch_id, owner, ctx.lease_ttl) as heartbeat:
        return _finish(outbox, LeasedBatch.of(ctx, batch, owner).holding(heartbeat))


def _refusal(ctx: ImportContext, batch: Batch, scope: str) -> NotResumable | None:
    """Refuse a terminal batch before its row changes: once resumed it would be running, and
    a refusal found only then would overwrite the failure it ended with. So the store's
    rules, then the slice stamp, are checked first; the resume checks the rules again."""
    reason = resume_refusal(batch, SourceType.FLEET_S3, scope)
    if reason is None:
        stamp = ctx.warehouse.slice_owner(batch.tenant_id, scope)
        reason = expired_publication(batch.id, scope, stamp)
    return None if reason is None else NotResumable(reason)


def _finish(outbox: OutboxRepository, batch: LeasedBatch) -> ImportOutcome | NotResumable:
    ctx, batch_id = batch.ctx, batch.batch_id
    stored = batch.read()
    details = stored.record
    if not details.warehouse_committed and may_have_committed(stored):
        # Its COMMIT got no answer (issue #26): the stamp, read back, settles it either way.
        committed = recover_committed(batch)
        if committed is None:
            error = WarehouseError("its slice COMMIT did not go through: the slice is not stamped")
            return fail_pre_commit(batch, error)
        return batch.publish(committed)
    stamp = ctx.warehouse.slice_owner(batch.tenant_id, batch.scope)
    expired = expired_publication(batch_id, batch.scope, stamp)
    if expired is not None:
        if not details.warehouse_committed:
            return NotResumable(
                f"batch {batch_id} never committed its slice; rerun the import instead"
            )
        fail_and_tell(
            ctx.events,
            lambda: outbox.mark_publication_expired(batch_id, batch.owner, expired),
            FailureKind.FAILED_PUBLICATION,
            expired,
            publication_expired=True,
        )
        return Failed(batch_id, FailureKind.FAILED_PUBLICATION, expired, expired=True)
    if details.warehouse_committed:
        outbox.reopen_dead_steps(batch_id)  # an explicit resume gives dead steps new attempts
    committed = recover_committed(batch)
    assert committed is not None  # stamped with this batch, checked above
    return batch.publish(committed)
