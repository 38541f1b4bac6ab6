"""resume_publication: finish a batch whose slice committed but whose publication did not."""

from __future__ import annotations

import uuid

from prefect import flow, get_run_logger
from prefect.states import State

from fleet_import.importing.context import Failed
from fleet_import.importing.resume import resume_batch
from fleet_import.intake.admission import admission
from fleet_import.store.models import NotResumable
from fleet_import.tenants.binding import Refused
from flows.common import lease_owner, load_settings, runtime_for_flow
from flows.reporting import failed, fails_with_one_line, publish_artifacts, refused, state_for
from flows.story import tell


@flow(name="resume-publication", flow_run_name="resume/{batch_id}", retries=0)
@fails_with_one_line
def resume_publication(batch_id: str) -> State:
    """Resume a failed publication (or a batch that died after its warehouse commit)
    without copying a row. NotResumable when a newer batch owns the slice; Refused when
    the tenant registry no longer admits its tenant (or its folder no longer binds).

    Args:
        batch_id: The batch to resume (see `fleet-import batches list --status failed`).
    """
    try:
        parsed = uuid.UUID(batch_id)
    except ValueError:
        return failed(f"{batch_id!r} is not a batch id")
    rt = runtime_for_flow(settings=load_settings())
    outcome = resume_batch(
        rt.ctx, rt.outbox, parsed, owner=lease_owner(), admission=admission(rt.settings)
    )
    if isinstance(outcome, Refused):  # the tenant is offboarded: nothing published
        return refused(outcome)
    get_run_logger().info("resume of %s: %s", batch_id, type(outcome).__name__)
    if isinstance(outcome, NotResumable):
        return failed(outcome.reason, name="NotResumable")
    publish_artifacts(rt, parsed)
    tell(rt, [parsed])
    if isinstance(outcome, Failed) and outcome.expired:
        # Found only after the batch was running (it died after its commit, or a newer
        # batch committed during the resume): refused all the same.
        return failed(outcome.error, name="NotResumable")
    return state_for(outcome)
