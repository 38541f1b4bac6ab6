"""How a leased batch is settled after its load: a commit recovered from the slice stamp,
or the batch failed before commit. Shared by the import, resume, and the takeover of
abandoned batches, so each rule is written once."""

from __future__ import annotations

import logging

from fleet_import.errors import PreCommitError
from fleet_import.explain import with_next_step
from fleet_import.importing.context import Committed, Failed
from fleet_import.importing.leased_batch import LeasedBatch, Stamp
from fleet_import.store.models import Batch, FailureKind

log = logging.getLogger(__name__)


def recover_or_fail(batch: LeasedBatch, exc: BaseException) -> Committed | Failed:
    """A load failed. A lost COMMIT acknowledgement is the one ambiguous case, and the stamp
    decides it (the batch then committed after all); anything else fails the batch before
    commit."""
    stored = batch.read()
    recorded = _recorded(batch, stored)
    if recorded is not None:
        return recorded
    stamp = batch.stamp()
    unknown = stamp is Stamp.UNKNOWN
    if unknown:
        stamp = unknown_stamp(batch)
    if stamp is Stamp.STAMPED:
        return _record_recovered(batch, stored)
    return fail_pre_commit(batch, exc, commit_outcome_unknown=unknown)


def recover_committed(batch: LeasedBatch) -> Committed | None:
    """A batch continued after a death: committed already, or its slice carries its stamp
    (died between the warehouse and the operational commit: only the record is redone)."""
    stored = batch.read()
    recorded = _recorded(batch, stored)
    if recorded is not None:
        return recorded
    stamp = batch.stamp()
    if stamp is Stamp.UNKNOWN:
        stamp = unknown_stamp(batch)
    return _record_recovered(batch, stored) if stamp is Stamp.STAMPED else None


def _recorded(batch: LeasedBatch, stored: Batch) -> Committed | None:
    details = stored.parsed_details
    if not details.warehouse_committed:
        return None
    summary = stored.details.get("summary", {})
    return Committed(batch.batch_id, batch.scope, dict(details.row_counts), summary)


def _record_recovered(batch: LeasedBatch, stored: Batch) -> Committed:
    return batch.record_commit(
        recovered=True,
        row_counts=batch.ctx.warehouse.slice_counts(batch.tenant_id, batch.scope),
        summary={**stored.details.get("summary", {}), "recovered_from_stamp": True},
    )


def unknown_stamp(batch: LeasedBatch) -> Stamp:
    """The hook for a stamp the warehouse could not answer (issue #26 decides what an
    unknown commit outcome does: read it back across the outage, or leave the batch to
    whoever next touches it). Until then it is taken as not stamped, as before, and said
    so; a failure recorded on top of it carries `commit_outcome: unknown`."""
    log.warning(
        "batch %s: the slice stamp of %s could not be read; taken as not stamped",
        batch.batch_id,
        batch.scope,
    )
    return Stamp.NOT_STAMPED


def fail_pre_commit(
    batch: LeasedBatch, exc: BaseException, *, commit_outcome_unknown: bool = False
) -> Failed:
    """Terminal for the batch: for one whose slice is not stamped. When the stamp could not
    be read (`unknown_stamp` took it as not stamped), the failure record and its event say
    `commit_outcome: unknown`, so it is never a plain pre-commit failure."""
    error = str(exc) if isinstance(exc, PreCommitError) else f"{type(exc).__name__}: {exc}"
    error = with_next_step(error, exc)  # a bucket, credentials, a warehouse: what to check
    log.warning("batch %s failed before commit: %s", batch.batch_id, error)
    facts = {"commit_outcome": "unknown"} if commit_outcome_unknown else None
    return batch.fail(FailureKind.FAILED_PRE_COMMIT, error, facts)
