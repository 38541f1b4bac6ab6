"""rollback_slice: load an earlier succeeded batch's content into its slice again.

Thin: the operation is `fleet_import.importing.rollback.rollback_slice` (which batch,
whether its files are still retained, the pinned manifest, the load), run by
`flows.operation` with each step a Prefect task.
"""

from __future__ import annotations

import uuid

from prefect import flow
from prefect.states import State

from fleet_import.errors import InvalidInput
from fleet_import.importing import rollback
from fleet_import.intake.admission import admission
from fleet_import.store.review_repository import ReviewRepository
from flows.common import lease_owner, runtime_for_flow
from flows.operation import FlowHost, run_operation
from flows.reporting import failed, fails_with_one_line


@flow(name="rollback-slice", flow_run_name="rollback/{tenant_id}", retries=0)
@fails_with_one_line
def rollback_slice(tenant_id: str, folder: str, to_batch_id: str | None = None) -> State:
    """Roll a slice back: load an earlier succeeded batch's content again as a new batch,
    from its retained normalized files. NotRolledBack, with the reason, when they are gone;
    Refused (nothing written) when the tenant registry does not admit the tenant or folder.
    The final line starts with which batch was loaded (and why that one, by default).

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
        return run_operation(
            FlowHost(rt),
            lambda steps, host: rollback.rollback_slice(
                rt.ctx,
                reviews,
                tenant_id,
                folder,
                target,
                admission=admission(rt.settings),
                owner=lease_owner(),
                steps=steps,
                host=host,
            ),
        )
    except InvalidInput as exc:
        return failed(f"invalid input: {exc}")
