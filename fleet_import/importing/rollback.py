"""Rollback of a slice (issue #24): load an earlier succeeded batch's content again, as a
new batch stamped, registered and published like any other.

The content is the earlier batch's manifest, pinned on the new batch (importing.pinned), so
the folder's current files do not matter; its files come from the normalized-file cache,
which the retention kept (publication.retention). Refused, with the reason, when that batch
is not an earlier success of the scope, its contracts changed since, or its files are gone.
By default the target is the newest earlier success whose content the slice does not show
now and no rollback removed: a second rollback goes further back, never forward again to
what the first one took out (only `to` names such a batch).
The guards are waived: an operator asked for exactly this slice. A rollback is a delivery
of its own (`rollback:{target}:{replaced}`): run again after a death it continues its batch.
`fleet.slice.rolled_back` is told by the batch's own publication (publication.decisions),
so whoever finishes it (this run, a rerun, the drain, `fleet-import resume`) tells it, once.
First of all the tenant and folder are judged by the tenant rule in force (the `Admission`
the caller hands in): a rollback for a disabled tenant is `Refused`, nothing written.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from fleet_import.errors import FleetImportError
from fleet_import.importing.claim import claim, new_owner
from fleet_import.importing.context import UNWATCHED, Claimed, Host, ImportContext, ImportOutcome
from fleet_import.importing.drift import effective_contracts
from fleet_import.importing.driver import CoreSteps, StepRunner, import_batch
from fleet_import.importing.guards import GuardOverride, record_override
from fleet_import.importing.pinned import pin_manifest
from fleet_import.publication.refusal import tell_refusal
from fleet_import.s3.delivery import DeliveryIdentity
from fleet_import.s3.sources import Manifest
from fleet_import.scope import Tenant, source_scope, split_folder
from fleet_import.store.details import BatchDetails
from fleet_import.store.models import Batch, BatchStatus
from fleet_import.store.review_repository import ReviewRepository
from fleet_import.tenants.binding import Admission, Refused

ROLLBACK = "rollback-slice"  # a refusal's `source`, as the flow is named


@dataclass(frozen=True)
class NotRolledBack:
    """The rollback was refused; nothing was loaded."""

    reason: str


@dataclass(frozen=True)
class RollbackPlan:
    tenant: Tenant
    scope: str
    target: Batch
    manifest: Manifest
    replaced: uuid.UUID | None
    """The batch whose slice the rollback replaces (the slice's owner now)."""
    by_default: bool = False
    """The target was chosen (not named): the newest earlier success no rollback removed."""

    @property
    def chosen(self) -> str:
        """Which batch the rollback loads, and why that one: what its outcome says first."""
        # "by default": the newest earlier success no rollback removed (`slices rollback
        # --help`, docs/operating.md); the line stays short enough to read.
        if not self.by_default:
            return f"rolled back to batch {self.target.id}"
        return f"rolled back to batch {self.target.id} (by default)"

    @property
    def delivery_key(self) -> str:
        return f"rollback:{self.target.id}:{self.replaced}"


def plan_rollback(
    ctx: ImportContext,
    reviews: ReviewRepository,
    tenant_id: str,
    folder: str,
    to: uuid.UUID | None = None,
    *,
    admission: Admission,
) -> RollbackPlan | NotRolledBack | Refused:
    """Which batch to roll back to (`to`, else the newest earlier success whose content the
    slice does not show and no rollback removed) and its manifest, or why not (Refused, and
    told: the tenant or folder is not admitted now). Invalid ids and folders raise
    InvalidInput. A warehouse or database that does not answer is no refusal: its error is
    raised, and told as one line with the next step."""
    scope = source_scope(folder)
    tenant = admission(tenant_id, folder)
    if isinstance(tenant, Refused):
        return tell_refusal(ctx.events, tenant, ROLLBACK)
    owner = ctx.warehouse.slice_owner(tenant.tenant_id, scope)
    unfinished = _unfinished_rollback(ctx, owner)
    by_default = to is None
    if unfinished is not None and to in (None, unfinished[0]):
        to, owner = unfinished  # it died after its commit: the same rollback continues
        by_default = False
    if to is None:
        earlier = reviews.rollback_candidates(tenant.tenant_id, scope, owner, limit=1)
        if not earlier:
            return NotRolledBack(
                f"{scope} has no earlier succeeded batch to roll back to (not counting the "
                "content it shows and what a rollback removed: name one with --to)"
            )
        target = earlier[0]
    else:
        found = ctx.repo.get(to)
        if found is None:
            return NotRolledBack(f"no batch {to}")
        target = found
    refusal = _refusal(ctx, tenant, scope, target, owner)
    if isinstance(refusal, NotRolledBack):
        return refusal
    return RollbackPlan(tenant, scope, target, refusal, owner, by_default)


def _unfinished_rollback(
    ctx: ImportContext, owner: uuid.UUID | None
) -> tuple[uuid.UUID, uuid.UUID | None] | None:
    """(target, replaced) of the rollback whose stamp the slice carries while it has not
    succeeded yet (its executor died after the warehouse commit)."""
    batch = ctx.repo.get(owner) if owner is not None else None
    if batch is None or batch.status != BatchStatus.RUNNING:
        return None
    target = batch.record.rolled_back_to
    if not target:
        return None
    replaced = batch.record.rollback_replaced
    return uuid.UUID(target), uuid.UUID(replaced) if replaced else None


def _refusal(
    ctx: ImportContext, tenant: Tenant, scope: str, target: Batch, owner: uuid.UUID | None
) -> NotRolledBack | Manifest:
    """The target's manifest, if its content can be loaded again; else why not."""
    if target.tenant_id != tenant.tenant_id or target.source_scope != scope:
        return NotRolledBack(f"batch {target.id} is not a batch of {tenant.tenant_id}'s {scope}")
    if target.status != BatchStatus.SUCCEEDED:
        return NotRolledBack(f"batch {target.id} did not succeed (it is {target.status})")
    if target.id == owner:
        return NotRolledBack(f"batch {target.id} owns the slice already: nothing to roll back")
    raw = target.record.manifest
    if raw is None:
        return NotRolledBack(f"batch {target.id} records no manifest")
    try:
        manifest = Manifest.from_json(raw)
    except FleetImportError as exc:
        return NotRolledBack(f"batch {target.id}: {exc}")
    try:
        # As the rollback will read them: with the columns drift added (importing.drift).
        contracts = effective_contracts(ctx.contracts, ctx.warehouse, tenant.tenant_id)
        versions = DeliveryIdentity.of(manifest, contracts).versions
    except KeyError as exc:
        return NotRolledBack(f"batch {target.id} loaded dataset {exc} that no contract defines now")
    if versions != target.record.contract_versions:
        return NotRolledBack(
            f"the contracts changed since batch {target.id} was loaded: its normalized files "
            "do not fit the curated tables now; import the folder anew instead"
        )
    bucket, _ = split_folder(manifest.folder)
    gone = [
        obj.key
        for obj in manifest.objects
        if ctx.repo.cached_file(f"s3://{bucket}/{obj.key}", obj.etag, versions[obj.dataset]) is None
    ]
    if gone:
        return NotRolledBack(
            f"the normalized files of batch {target.id} are gone (retention expired, see "
            f"FLEET_RETAIN_DAYS): {', '.join(gone[:5])}{', ...' if len(gone) > 5 else ''}"
        )
    return manifest


def claim_rollback(ctx: ImportContext, plan: RollbackPlan, owner: str) -> ImportOutcome | Claimed:
    """Reserve the scope for the rollback's own delivery, pin the target's content and
    waive the guards."""
    claimed = claim(ctx, plan.tenant, plan.scope, plan.delivery_key, owner, force=True)
    if isinstance(claimed, Claimed):
        reason = f"rollback to batch {plan.target.id}"
        record_override(ctx, claimed, GuardOverride(waived=True, reason=reason, gate_waived=True))
        pin_manifest(ctx, claimed.batch_id, owner, plan.manifest)
        ctx.repo.update_details(
            claimed.batch_id,
            owner,
            BatchDetails.patch(
                rolled_back_to=str(plan.target.id),
                rollback_replaced=str(plan.replaced) if plan.replaced else None,
            ),
        )
    return claimed


def rollback_slice(
    ctx: ImportContext,
    reviews: ReviewRepository,
    tenant_id: str,
    folder: str,
    to: uuid.UUID | None = None,
    *,
    admission: Admission,
    owner: str | None = None,
    steps: StepRunner | None = None,
    host: Host = UNWATCHED,
) -> ImportOutcome | NotRolledBack | Refused:
    """Plan, claim and load a rollback: the rollback flow runs this with its steps as
    tasks. The outcome's line starts with which batch it loads, and why that one."""
    plan = plan_rollback(ctx, reviews, tenant_id, folder, to, admission=admission)
    if isinstance(plan, NotRolledBack | Refused):
        return plan
    host.admitted(plan.tenant, plan.scope)
    claimed = claim_rollback(ctx, plan, owner or new_owner())
    host.claim_ended(plan.tenant, plan.scope, claimed)
    if not isinstance(claimed, Claimed):
        return claimed
    host.loading(claimed, [claimed.batch_id], headline=plan.chosen)
    return import_batch(ctx, plan.tenant, claimed, steps or CoreSteps(ctx.normalize_workers))
