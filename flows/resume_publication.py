"""resume_publication: finish a batch whose slice committed but whose publication did not."""

from __future__ import annotations

import uuid

from prefect import flow, get_run_logger
from prefect.states import State

from fleet_import.importing import driver as pipeline
from fleet_import.importing.resume import resume_batch
from fleet_import.intake.admission import admit_scope
from fleet_import.store.models import NotResumable
from fleet_import.tenants.binding import DELIVERY_REFUSED_EVENT, Refused
from flows.common import lease_owner, load_settings, prefect_event_sink, runtime_for_flow
from flows.reporting import failed, fails_with_one_line, publish_artifacts, refused, state_for
from flows.story import tell


@flow(name="resume-publication", flow_run_name="resume/{batch_id}", retries=0)
@fails_with_one_line
def resume_publication(batch_id: str) -> State:
    """Resume a failed publication (or a batch that died after its warehouse commit)
    without copying a row. Refused when a newer batch owns the slice.

    Args:
        batch_id: The batch to resume (see `fleet-import batches list --status failed`).
    """
    try:
        parsed = uuid.UUID(batch_id)
    except ValueError:
        return failed(f"{batch_id!r} is not a batch id")
    settings = load_settings()
    rt = runtime_for_flow(settings=settings)
    batch = rt.ctx.repo.get(parsed)
    if batch is not None and batch.source_scope is not None:
        admitted = admit_scope(settings, batch.tenant_id, batch.source_scope)
        if isinstance(admitted, Refused):  # an offboarded tenant's batch publishes nothing
            payload = admitted.payload("resume-publication", batch_id=batch_id)
            prefect_event_sink(DELIVERY_REFUSED_EVENT, payload)
            return refused(admitted)
    outcome = resume_batch(rt.ctx, rt.outbox, parsed, owner=lease_owner())
    get_run_logger().info("resume of %s: %s", batch_id, type(outcome).__name__)
    if isinstance(outcome, NotResumable):
        return failed(outcome.reason, name="NotResumable")
    publish_artifacts(rt, parsed)
    tell(rt, [parsed])
    if isinstance(outcome, pipeline.Failed) and outcome.expired:
        # Found only after the batch was running (it died after its commit, or a newer
        # batch committed during the resume): refused all the same.
        return failed(outcome.error, name="NotResumable")
    return state_for(outcome)
