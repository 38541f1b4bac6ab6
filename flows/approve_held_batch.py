"""approve_held_batch: load a held batch's content as a new batch, its guards waived.

Thin: the rules live in `fleet_import.importing.review` (what may be approved, the waiver);
the decision is recorded with the new batch's commit and told by its publication, whoever
finishes it (this flow, the drain, resume); the load is the import's own steps as Prefect
tasks (`PrefectSteps`).
"""

from __future__ import annotations

import uuid

from prefect import flow, get_run_logger
from prefect.states import State

from fleet_import.errors import LeaseLost
from fleet_import.explain import explain
from fleet_import.importing import driver as pipeline
from fleet_import.importing.context import Claimed
from fleet_import.importing.review import NotApproved, check_approval, claim_approval
from fleet_import.intake.admission import admission
from fleet_import.tenants.binding import Refused
from flows.common import lease_owner, runtime_for_flow, tag_flow_run
from flows.import_s3_folder import PrefectSteps
from flows.reporting import failed, fails_with_one_line, publish_artifacts, refused, state_for
from flows.story import tell


@flow(name="approve-held-batch", flow_run_name="approve/{batch_id}", retries=0)
@fails_with_one_line
def approve_held_batch(batch_id: str) -> State:
    """Approve a batch a slice guard held for review: load exactly its content (same files,
    same contract versions) as a new batch, from its staged normalized files. NotApproved
    when the folder's content changed since it was held; Refused (nothing written) when the
    tenant registry no longer admits its tenant or folder.

    Args:
        batch_id: The held batch (see `fleet-import batches list --status held`).
    """
    try:
        held_id = uuid.UUID(batch_id)
    except ValueError:
        return failed(f"{batch_id!r} is not a batch id")
    rt = runtime_for_flow()
    approval = check_approval(rt.ctx, held_id, admission=admission(rt.settings))
    if isinstance(approval, Refused):
        return refused(approval)
    if isinstance(approval, NotApproved):
        return failed(approval.reason, name="NotApproved")
    tag_flow_run(f"tenant:{approval.tenant.tenant_id}", f"scope:{approval.scope}")
    claimed = claim_approval(rt.ctx, approval, lease_owner())
    if not isinstance(claimed, Claimed):
        return state_for(claimed)
    get_run_logger().info("batch %s approves held batch %s", claimed.batch_id, held_id)
    steps = PrefectSteps()
    try:
        outcome = pipeline.import_batch(rt.ctx, approval.tenant, claimed, steps)
    except LeaseLost as exc:
        tell(rt, [claimed.batch_id, held_id])
        return failed(f"lost the lease on batch {claimed.batch_id}: {explain(exc)}")
    publish_artifacts(rt, claimed.batch_id)
    tell(rt, [claimed.batch_id, held_id])
    return state_for(outcome, crash=steps.crash)
