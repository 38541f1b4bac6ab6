"""approve_held_batch: load a held batch's content as a new batch, its guards waived.

Thin: the operation is `fleet_import.importing.review.approve_held` (what may be approved,
the waiver, the load), run by `flows.operation` with each step a Prefect task. The decision
is recorded with the new batch's commit and told by its publication, whoever finishes it
(this flow, the drain, resume).
"""

from __future__ import annotations

import uuid

from prefect import flow
from prefect.states import State

from fleet_import.importing.review import approve_held
from fleet_import.intake.admission import admission
from flows.common import lease_owner, runtime_for_flow
from flows.operation import FlowHost, run_operation
from flows.reporting import failed, fails_with_one_line


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
    return run_operation(
        FlowHost(rt),
        lambda steps, host: approve_held(
            rt.ctx,
            held_id,
            admission=admission(rt.settings),
            owner=lease_owner(),
            steps=steps,
            host=host,
        ),
    )
