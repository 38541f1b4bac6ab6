"""Review of held batches (issue #24): approve loads exactly the held content as a new
batch with the slice guards waived; reject closes the batch. A batch held by its new
columns (`on_new_columns: review`, issue #25) has them added to its tables first.

Exactly the held content: the folder must still hold the files the held batch listed
(manifest fingerprint) read with the same contract versions; the approval's waiver names
that content, so a folder that changes between this check and the load is refused by the
guard check itself (guards.ApprovedContentChanged). The files are not parsed again: the
held batch's normalized files are still staged and cached by (key, etag, contract version).
An approval is a delivery of its own (`approve:{held batch}`): run again after a death it
continues its batch, and once it succeeded it loads nothing. The decision is recorded with
the approval batch's commit (`BatchRepository.mark_committed`) and told by its publication
(publication.decisions), so whoever finishes that batch — this run, a rerun, the drain,
`fleet-import resume` — settles the held batch, once. Before anything, the held batch's
tenant and folder are judged by the tenant rule in force (the `Admission` the caller hands
in): a disabled tenant's held batch is `Refused`.
"""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass

from fleet_import.errors import FleetImportError
from fleet_import.importing.claim import claim, new_owner, slice_owner_batch
from fleet_import.importing.context import (
    UNWATCHED,
    Claimed,
    Host,
    ImportContext,
    ImportOutcome,
)
from fleet_import.importing.drift import (
    DRIFT_EVENT,
    apply_held_drift,
    held_drift,
    held_drift_misfit,
    would_evolve,
)
from fleet_import.importing.driver import CoreSteps, StepRunner, import_batch
from fleet_import.importing.guards import GuardOverride, content_of, record_override
from fleet_import.publication.events import event_payload
from fleet_import.publication.refusal import tell_refusal
from fleet_import.s3.delivery import DeliveryIdentity
from fleet_import.s3.sources import discover
from fleet_import.scope import Tenant, folder_of_scope
from fleet_import.store.batch_state import held_content, is_held
from fleet_import.store.details import BatchDetails
from fleet_import.store.models import (
    Batch,
    BatchStatus,
)
from fleet_import.store.review_repository import ReviewRepository
from fleet_import.tenants.binding import Admission, Refused

REJECTED_EVENT = "fleet.batch.rejected"
APPROVAL_KEY_PREFIX = "approve:"
APPROVE = "approve-held-batch"  # a refusal's `source`, as the flow is named


@dataclass(frozen=True)
class NotApproved:
    """The approval (or rejection) was refused; nothing was loaded."""

    batch_id: uuid.UUID
    reason: str


@dataclass(frozen=True)
class Approval:
    """What an approval will load: the held batch, its tenant and scope, its content."""

    held: Batch
    tenant: Tenant
    scope: str
    content: dict


def approval_key(held_id: uuid.UUID) -> str:
    return f"{APPROVAL_KEY_PREFIX}{held_id}"


def check_approval(
    ctx: ImportContext, held_id: uuid.UUID, *, admission: Admission
) -> Approval | NotApproved | Refused:
    """The held batch and its content, or why it cannot be approved now (Refused, and told:
    its tenant or folder is not admitted now). An approval whose batch committed (deciding
    the held batch) but never finished is continued."""
    held = ctx.repo.get(held_id)
    admitted = (
        admission(held.tenant_id, folder_of_scope(held.source_scope))
        if held is not None and held.source_scope is not None
        else None
    )
    if isinstance(admitted, Refused):
        return tell_refusal(ctx.events, admitted, APPROVE, batch_id=str(held_id))
    unfinished = _unfinished_approval(ctx, held)
    if unfinished is not None:
        return unfinished
    refusal = _review_refusal(held, held_id)
    if refusal is not None:
        return NotApproved(held_id, refusal)
    assert held is not None and held.source_scope is not None and admitted is not None
    content = held_content(held)
    if not content:
        return NotApproved(held_id, f"batch {held_id} records no held content")
    try:
        # Read as the approval will: the tables' evolved columns, plus those it would add
        # for a batch held by its new columns (importing.drift).
        contracts = would_evolve(ctx, admitted.tenant_id, held_drift(held))
        listing = discover(ctx.s3, folder_of_scope(held.source_scope), contracts)
    except FleetImportError as exc:
        return NotApproved(held_id, f"the folder cannot be listed: {exc}")
    now = content_of(dataclasses.replace(ctx, contracts=contracts), listing)
    if now != content:
        what = "files" if now["fingerprint"] != content["fingerprint"] else "contract versions"
        return NotApproved(
            held_id,
            f"the content changed since batch {held_id} was held (its {what} differ): "
            "an approval loads only what was reviewed; import the folder anew instead",
        )
    overtaken = _overtaken_by(ctx, held, admitted)
    if overtaken is not None:
        return NotApproved(
            held_id,
            f"batch {held_id} was overtaken: batch {overtaken} loaded this content since; "
            "nothing to approve",
        )
    try:
        drift = held_drift(held)
        misfit = held_drift_misfit(ctx, held_id, admitted.tenant_id, listing, contracts, drift)
    except FleetImportError as exc:
        return NotApproved(held_id, f"the staged rows cannot be read: {exc}")
    if misfit is not None:
        return NotApproved(held_id, misfit)
    return Approval(held, admitted, held.source_scope, dict(content))


def _overtaken_by(ctx: ImportContext, held: Batch, tenant: Tenant) -> uuid.UUID | None:
    """The later success that owns the slice with the held content (a redelivery of the
    same files, loaded with a guard waived another way): approving would load it again."""
    assert held.source_scope is not None
    owner = slice_owner_batch(ctx, tenant, held.source_scope)
    if not isinstance(owner, Batch) or owner.status != BatchStatus.SUCCEEDED:
        return None
    if owner.created_at <= held.created_at:
        return None
    recorded = DeliveryIdentity.recorded(owner.record.manifest, owner.record.contract_versions)
    content = held_content(held)
    if recorded is None or recorded.fingerprint != content.get("fingerprint"):
        return None
    return owner.id if recorded.versions == content.get("contract_versions") else None


def approve_held(
    ctx: ImportContext,
    held_id: uuid.UUID,
    *,
    admission: Admission,
    owner: str | None = None,
    steps: StepRunner | None = None,
    host: Host = UNWATCHED,
) -> ImportOutcome | NotApproved | Refused:
    """Load the held batch's content as a new batch, its guards waived for that content:
    the approve flow runs this with its steps as tasks."""
    approval = check_approval(ctx, held_id, admission=admission)
    if isinstance(approval, NotApproved | Refused):
        return approval
    host.admitted(approval.tenant, approval.scope)
    claimed = claim_approval(ctx, approval, owner or new_owner())
    host.claim_ended(approval.tenant, approval.scope, claimed)
    if not isinstance(claimed, Claimed):
        return claimed
    host.loading(claimed, [claimed.batch_id, held_id])
    return import_batch(ctx, approval.tenant, claimed, steps or CoreSteps(ctx.normalize_workers))


def claim_approval(ctx: ImportContext, approval: Approval, owner: str) -> ImportOutcome | Claimed:
    """Reserve the scope for the approval's own delivery and waive its guards."""
    held_id = approval.held.id
    # A batch held by its new columns: they are added first, as `evolve` would add them;
    # the approval then reads its content with them (cached by the held batch).
    apply_held_drift(ctx, approval.tenant.tenant_id, held_drift(approval.held))
    claimed = claim(ctx, approval.tenant, approval.scope, approval_key(held_id), owner, force=True)
    if isinstance(claimed, Claimed):
        waiver = GuardOverride(
            waived=True,
            content=approval.content,
            reason=f"approval of held batch {held_id}",
            gate_waived=True,
        )
        record_override(ctx, claimed, waiver)
        ctx.repo.update_details(claimed.batch_id, owner, BatchDetails.patch(approves=str(held_id)))
        drift = held_drift(approval.held)
        if drift:  # the columns this approval added (issue #25)
            report = {
                dataset: {"policy": "review", "columns": columns, "approved": str(held_id)}
                for dataset, columns in drift.items()
            }
            ctx.repo.update_details(claimed.batch_id, owner, BatchDetails.patch(drift=report))
            ctx.events(
                DRIFT_EVENT,
                event_payload(
                    approval.tenant.tenant_id, approval.scope, claimed.batch_id, datasets=report
                ),
            )
    return claimed


def reject_held(
    ctx: ImportContext, reviews: ReviewRepository, held_id: uuid.UUID, note: str = ""
) -> Batch | NotApproved:
    """Close a held batch without loading it."""
    refusal = _review_refusal(ctx.repo.get(held_id), held_id)
    if refusal is not None:
        return NotApproved(held_id, refusal)
    batch = reviews.record_review(held_id, "rejected", facts={"note": note} if note else None)
    if batch is None:
        return NotApproved(held_id, f"batch {held_id} was reviewed meanwhile")
    ctx.events(REJECTED_EVENT, event_payload(batch.tenant_id, batch.source_scope, held_id))
    return batch


def _unfinished_approval(ctx: ImportContext, held: Batch | None) -> Approval | None:
    """The approval of `held` whose batch recorded its commit (and so the decision) and
    still runs (its executor died before it published): the same approval continues it,
    the content check behind it (the slice holds that content already)."""
    review = held.record.review if held is not None else None
    if held is None or review is None or review.decision != "approved" or not review.batch_id:
        return None
    approver = ctx.repo.get(uuid.UUID(review.batch_id))
    if approver is None or approver.status != BatchStatus.RUNNING:
        return None
    assert held.source_scope is not None
    content = held_content(held)
    tenant = Tenant(held.tenant_id, held.company_id, held.tenant_database)
    return Approval(held, tenant, held.source_scope, dict(content))


def _review_refusal(batch: Batch | None, batch_id: uuid.UUID) -> str | None:
    if batch is None:
        return f"no batch {batch_id}"
    if not is_held(batch):
        return f"batch {batch_id} is not held for review (it is {batch.status})"
    review = batch.record.review
    if review is not None:
        by = f" by batch {review.batch_id}" if review.batch_id else ""
        return f"batch {batch_id} was already {review.decision}{by}"
    return None
