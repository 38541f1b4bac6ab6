"""rollback_slice: load an earlier succeeded batch's content into its slice again.

Thin: the rules live in `fleet_import.importing.rollback` (which batch, whether its files
are still retained, the pinned manifest); the load is the import's own steps as Prefect
tasks (`PrefectSteps`).
"""

from __future__ import annotations

import uuid

from prefect import flow, get_run_logger
from prefect.states import State

from fleet_import.errors import InvalidInput, LeaseLost
from fleet_import.explain import explain
from fleet_import.importing import driver as pipeline
from fleet_import.importing.context import Claimed
from fleet_import.importing.rollback import NotRolledBack, claim_rollback, plan_rollback
from fleet_import.intake.admission import admission
from fleet_import.store.review_repository import ReviewRepository
from fleet_import.tenants.binding import Refused
from flows.common import lease_owner, runtime_for_flow, tag_flow_run
from flows.import_s3_folder import PrefectSteps
from flows.reporting import failed, fails_with_one_line, publish_artifacts, refused, state_for
from flows.story import tell


@flow(name="rollback-slice", flow_run_name="rollback/{tenant_id}", retries=0)
@fails_with_one_line
def rollback_slice(tenant_id: str, folder: str, to_batch_id: str | None = None) -> State:
    """Roll a slice back: load an earlier succeeded batch's content again as a new batch,
    from its retained normalized files. NotRolledBack, with the reason, when they are gone;
    Refused (nothing written) when the tenant registry does not admit the tenant or folder.

    Args:
        tenant_id: The tenant's slug, e.g. acme.
        folder: The slice's delivery folder, e.g. s3://fleet-landing/acme/fleet/2026-07-22/.
        to_batch_id: The batch whose content to load; by default the newest earlier success
            of the scope whose content the slice does not show and no rollback removed.
    """
    try:
        target = uuid.UUID(to_batch_id) if to_batch_id else None
    except ValueError as exc:
        return failed(f"invalid input: {exc}")
    rt = runtime_for_flow()
    reviews = ReviewRepository.from_settings(rt.settings)
    try:
        plan = plan_rollback(
            rt.ctx, reviews, tenant_id, folder, target, admission=admission(rt.settings)
        )
    except InvalidInput as exc:
        return failed(f"invalid input: {exc}")
    if isinstance(plan, Refused):
        return refused(plan)
    if isinstance(plan, NotRolledBack):
        return failed(plan.reason, name="NotRolledBack")
    tenant = plan.tenant
    tag_flow_run(f"tenant:{tenant.tenant_id}", f"scope:{plan.scope}")
    claimed = claim_rollback(rt.ctx, plan, lease_owner())
    if not isinstance(claimed, Claimed):
        return state_for(claimed)
    get_run_logger().info(
        "batch %s rolls %s back to %s", claimed.batch_id, plan.scope, plan.target.id
    )
    steps = PrefectSteps()
    try:
        outcome = pipeline.import_batch(rt.ctx, tenant, claimed, steps)
    except LeaseLost as exc:
        tell(rt, [claimed.batch_id])
        return failed(f"lost the lease on batch {claimed.batch_id}: {explain(exc)}")
    publish_artifacts(rt, claimed.batch_id)
    tell(rt, [claimed.batch_id])
    return _saying(state_for(outcome, crash=steps.crash), plan.chosen)


def _saying(state: State, chosen: str) -> State:
    """The outcome's one line, after which batch was loaded (and why that one, by default):
    the operator sees what the slice holds now without looking it up."""
    return state.model_copy(update={"message": f"{chosen}; {state.message}"})
