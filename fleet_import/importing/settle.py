"""How a leased batch is settled: a commit recorded (or recovered from the slice stamp),
its publication run, or the batch failed. Shared by the import, resume, and the takeover
of abandoned batches, so each rule is written once."""

from __future__ import annotations

import logging
import uuid
from dataclasses import replace
from typing import Any

from fleet_import import failpoints
from fleet_import.errors import FleetImportError, PreCommitError
from fleet_import.importing.context import Committed, Failed, ImportContext, ImportOutcome
from fleet_import.publication.outcomes import PublicationExpired, PublicationFailed, Published
from fleet_import.publication.publisher import event_payload
from fleet_import.scope import Tenant
from fleet_import.store.heartbeat import Heartbeat
from fleet_import.store.models import FailureKind

log = logging.getLogger(__name__)


def settle_failure(
    ctx: ImportContext,
    tenant: Tenant,
    batch_id: uuid.UUID,
    scope: str,
    owner: str,
    exc: BaseException,
) -> ImportOutcome:
    """A load failed. A lost COMMIT acknowledgement is the one ambiguous case, and the stamp
    decides it; anything else fails the batch before commit."""
    recovered = recover_committed(ctx, tenant, batch_id, scope, owner)
    if recovered is not None:
        return recovered
    return fail_pre_commit(ctx, tenant, batch_id, scope, owner, exc)


def recover_committed(
    ctx: ImportContext, tenant: Tenant, batch_id: uuid.UUID, scope: str, owner: str
) -> Committed | None:
    """A batch continued after a death: committed already, or its slice carries its stamp
    (died between the warehouse and the operational commit: only the record is redone)."""
    batch = ctx.repo.get(batch_id)
    assert batch is not None
    details = batch.parsed_details
    if details.redshift_committed:
        summary = batch.details.get("summary", {})
        return Committed(batch_id, scope, dict(details.row_counts), summary)
    if not stamped(ctx, tenant.tenant_id, scope, batch_id):
        return None
    return record_commit(
        ctx,
        batch_id,
        scope,
        owner,
        recovered=True,
        row_counts=ctx.warehouse.slice_counts(tenant.tenant_id, scope),
        summary={**batch.details.get("summary", {}), "recovered_from_stamp": True},
    )


def stamped(ctx: ImportContext, tenant_id: str, scope: str, batch_id: uuid.UUID) -> bool:
    try:
        return ctx.warehouse.slice_owner(tenant_id, scope) == batch_id
    except FleetImportError:
        return False


def record_commit(
    ctx: ImportContext,
    batch_id: uuid.UUID,
    scope: str,
    owner: str,
    *,
    recovered: bool,
    row_counts: dict[str, int],
    summary: dict[str, Any],
) -> Committed:
    """Step 6: `redshift_committed` and the outbox in one operational transaction. If this
    fails, the batch stays running and a rerun finds the stamp and redoes only this."""
    batch = ctx.repo.mark_committed(
        batch_id,
        owner,
        row_counts=row_counts,
        publication_steps=ctx.publication_steps(),
        patch={"summary": summary},
    )
    failpoints.hit("after_operational_commit")
    ctx.events(
        "fleet.batch.committed",
        event_payload(
            batch.tenant_id,
            batch.source_scope,
            batch.id,
            row_counts=row_counts,
            recovered=recovered,
        ),
    )
    return Committed(batch_id, scope, row_counts, summary, recovered)


def publish_step(
    ctx: ImportContext, committed: Committed, owner: str, heartbeat: Heartbeat | None
) -> ImportOutcome:
    """Step 7-8: drain the batch's outbox, then succeed it (the Publisher does)."""
    if ctx.publisher is None:
        failpoints.hit("before_mark_succeeded")
        ctx.repo.mark_succeeded(committed.batch_id, owner)
        return replace(committed, published=True)
    outcome = ctx.publisher.publish_batch(committed.batch_id, owner, owner, heartbeat=heartbeat)
    if isinstance(outcome, Published):
        return replace(committed, published=True)
    if isinstance(outcome, PublicationFailed):
        ctx.publisher.mark_failed_publication(committed.batch_id, owner, outcome)
        batch = ctx.repo.get(committed.batch_id)
        error = batch.details["failure"]["error"] if batch else outcome.error
        return Failed(committed.batch_id, FailureKind.FAILED_PUBLICATION, error, resumable=True)
    if isinstance(outcome, PublicationExpired):
        return Failed(
            committed.batch_id,
            FailureKind.FAILED_PUBLICATION,
            f"publication expired: batch {outcome.slice_owner} owns the slice now",
            expired=True,
        )
    return committed  # busy or deferred: a drain finishes it


def fail_pre_commit(
    ctx: ImportContext,
    tenant: Tenant,
    batch_id: uuid.UUID,
    scope: str,
    owner: str,
    exc: BaseException,
) -> Failed:
    """Only for a batch whose slice is not stamped (settle_failure checked): terminal."""
    error = str(exc) if isinstance(exc, PreCommitError) else f"{type(exc).__name__}: {exc}"
    log.warning("batch %s failed before commit: %s", batch_id, error)
    ctx.repo.mark_failed(batch_id, owner, FailureKind.FAILED_PRE_COMMIT, error)
    ctx.events(
        "fleet.batch.failed",
        event_payload(tenant.tenant_id, scope, batch_id, kind="failed_pre_commit", error=error),
    )
    return Failed(batch_id, FailureKind.FAILED_PRE_COMMIT, error)
