"""How a leased batch is settled after its load: a commit recovered from the slice stamp,
the batch failed before commit, or -- when the warehouse cannot say -- left for whoever
touches it next. Shared by the import, resume, and the takeover of abandoned batches, so
each rule is written once.

The rule, a status is always true: a failure is pre-commit only when the commit
did not happen. A batch *may have committed* once its slice COMMIT was sent
(`commit_attempted` in its details, set just before) and until it is recorded committed.
For such a batch an unreadable stamp is read back across the outage
(`ImportContext.commit_readback`); if it still cannot be read, the batch stays running with
`commit_unknown` in its details and its lease released (`CommitUnknown`), and the next
reader of its stamp decides. A batch that never sent its COMMIT did not commit: an
unreadable stamp changes nothing for it.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

from fleet_import.errors import FleetImportError, PreCommitError, WarehouseError
from fleet_import.explain import advise, with_next_step
from fleet_import.importing.context import Committed, CommitUnknown, Failed
from fleet_import.importing.leased_batch import LeasedBatch, Stamp
from fleet_import.publication.events import event_payload
from fleet_import.store.details import BatchDetails, FailureKind
from fleet_import.store.models import Batch
from fleet_import.warehouse.base import CommitOutcomeUnknown, WarehouseSession

log = logging.getLogger(__name__)

COMMIT_UNKNOWN_EVENT = "fleet.batch.commit_unknown"


class StampUnreadable(WarehouseError):
    """The slice stamp of a batch that may have committed could not be read back in the
    configured time: its commit outcome stays unknown."""


def mark_commit_attempted(batch: LeasedBatch) -> None:
    """Just before the slice COMMIT is sent: from here on the batch may have committed."""
    batch.update_details(BatchDetails.patch(commit_attempted=True))


def may_have_committed(stored: Batch) -> bool:
    record = stored.record
    return record.commit_attempted or record.commit_unknown is not None


def recover_or_fail(batch: LeasedBatch, exc: BaseException) -> Committed | Failed | CommitUnknown:
    """A load failed. When its COMMIT may have gone through (sent without an answer, or sent
    by an earlier run), the stamp decides: committed after all, not committed (failed before
    commit), or unknown (left for the next run). Anything else fails the batch before commit."""
    if isinstance(exc, StampUnreadable):  # read back already, in vain
        return leave_unsettled(batch, exc)
    stored = batch.read()
    recorded = _recorded(batch, stored)
    if recorded is not None:
        return recorded
    if isinstance(exc, CommitOutcomeUnknown) or may_have_committed(stored):
        stamp = read_back_stamp(batch)
        if stamp is Stamp.UNKNOWN:
            return leave_unsettled(batch, exc)
    else:
        stamp = batch.stamp()
    if stamp is Stamp.STAMPED:
        return _record_recovered(batch, stored)
    return fail_pre_commit(batch, exc, commit_outcome_unknown=stamp is Stamp.UNKNOWN)


def recover_committed(batch: LeasedBatch) -> Committed | None:
    """A batch continued after a death, or met again: committed already, or its slice
    carries its stamp (died between the warehouse and the operational commit: only the
    record is redone). Raises StampUnreadable when it may have committed and its stamp
    cannot be read back."""
    stored = batch.read()
    recorded = _recorded(batch, stored)
    if recorded is not None:
        return recorded
    if not may_have_committed(stored):
        return _record_recovered(batch, stored) if batch.stamp() is Stamp.STAMPED else None
    stamp = read_back_stamp(batch)
    if stamp is Stamp.UNKNOWN:
        raise StampUnreadable(
            f"the slice stamp of batch {batch.batch_id} ({batch.scope}) could not be read "
            "back: whether its COMMIT went through is unknown"
        )
    return _record_recovered(batch, stored) if stamp is Stamp.STAMPED else None


def settle_lost_commit(
    batch: LeasedBatch, exc: CommitOutcomeUnknown
) -> Committed | CommitUnknown | None:
    """The slice COMMIT got no answer: read the stamp back across the outage. Committed
    (recorded now, as if the answer had come), unknown (left for the next run), or None:
    not stamped, so the COMMIT did not go through."""
    log.warning("batch %s: %s; reading the slice stamp back", batch.batch_id, exc)
    try:
        committed = recover_committed(batch)
    except StampUnreadable:
        return leave_unsettled(batch, exc)
    if committed is not None:
        log.warning("batch %s: the slice stamp shows the COMMIT went through", batch.batch_id)
    return committed


def read_back_stamp(batch: LeasedBatch) -> Stamp:
    """The stamp, read again after each backoff of `ctx.commit_readback` while the warehouse
    cannot answer. Before "not stamped" is believed, the session that sent the COMMIT is
    ended (if it is somehow still alive, its COMMIT cannot land later)."""
    backoff = batch.ctx.commit_readback
    for retry in range(backoff.retries + 1):
        stamp = _final_stamp(batch)
        if stamp is not Stamp.UNKNOWN:
            return stamp
        if retry < backoff.retries:
            seconds = backoff.pause(retry)
            log.warning(
                "batch %s: the slice stamp of %s could not be read (attempt %d); again in %.1fs",
                batch.batch_id,
                batch.scope,
                retry + 1,
                seconds,
            )
            time.sleep(seconds)
            batch.check_lease()
    return Stamp.UNKNOWN


def _final_stamp(batch: LeasedBatch) -> Stamp:
    stamp = batch.stamp()
    if stamp is not Stamp.NOT_STAMPED:
        return stamp
    session = WarehouseSession.from_json(batch.read().record.warehouse_session)
    if session is None:
        return stamp
    try:
        batch.ctx.warehouse.end_session(session)
    except FleetImportError as exc:
        log.warning(
            "batch %s: could not end warehouse session %s: %s", batch.batch_id, session, exc
        )
        return Stamp.UNKNOWN
    return batch.stamp()


def leave_unsettled(batch: LeasedBatch, exc: BaseException) -> CommitUnknown:
    """Neither committed nor failed, as far as anyone can tell: the batch stays running with
    `commit_unknown` in its details (its lease is released when the caller lets go), and
    the next reader of its stamp settles it."""
    error = str(exc) if isinstance(exc, FleetImportError) else f"{type(exc).__name__}: {exc}"
    at = datetime.now(UTC).isoformat()
    unknown = {"error": error, "at": at, "owner": batch.owner}
    batch.update_details(BatchDetails.patch(commit_unknown=unknown))
    log.warning(
        "batch %s: whether its slice committed is unknown (%s); it stays running for the next "
        "run, the drain or `fleet-import resume` to settle from the stamp",
        batch.batch_id,
        error,
    )
    batch.ctx.events(
        COMMIT_UNKNOWN_EVENT,
        event_payload(batch.tenant_id, batch.scope, batch.batch_id, error=error),
    )
    advice = advise(exc)
    return CommitUnknown(batch.batch_id, batch.scope, error, advice.next_step if advice else "")


def _recorded(batch: LeasedBatch, stored: Batch) -> Committed | None:
    details = stored.record
    if not details.warehouse_committed:
        return None
    return Committed(batch.batch_id, batch.scope, dict(details.row_counts), details.summary_json)


def _record_recovered(batch: LeasedBatch, stored: Batch) -> Committed:
    return batch.record_commit(
        recovered=True,
        row_counts=batch.ctx.warehouse.slice_counts(batch.tenant_id, batch.scope),
        summary={**stored.record.summary_json, "recovered_from_stamp": True},
    )


def fail_pre_commit(
    batch: LeasedBatch, exc: BaseException, *, commit_outcome_unknown: bool = False
) -> Failed:
    """Terminal for the batch: for one whose slice is not stamped, or one that never sent
    its COMMIT (then an unreadable stamp changes nothing, and the failure record and its
    event say `commit_outcome: unknown`)."""
    error = str(exc) if isinstance(exc, PreCommitError) else f"{type(exc).__name__}: {exc}"
    error = with_next_step(error, exc)  # a bucket, credentials, a warehouse: what to check
    log.warning("batch %s failed before commit: %s", batch.batch_id, error)
    facts = {"commit_outcome": "unknown"} if commit_outcome_unknown else None
    return batch.fail(FailureKind.FAILED_PRE_COMMIT, error, facts)
