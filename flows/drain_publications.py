"""drain_publications: finish publication of committed batches nobody is executing."""

from __future__ import annotations

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact

from fleet_import.importing.claim import settle_abandoned_batches
from fleet_import.intake.admission import admission
from flows.common import lease_owner, runtime_for_flow
from flows.reporting import fails_with_one_line
from flows.story import tell


@flow(name="drain-publications", retries=0)
@fails_with_one_line
def drain_publications(limit: int = 50) -> dict[str, int]:
    """Settle abandoned batches (their executor died or froze before commit: failed as
    abandoned, or recorded and published when their slice is stamped), then run the pending
    outbox steps of committed batches nobody is executing, in order, each step claimed by
    exactly one drain. Failed publications wait for an explicit resume. A batch whose
    tenant the registry no longer enables (or whose folder no longer binds) publishes
    nothing: it ends failed_publication, counted as PublicationRefused, with a
    `fleet.delivery.refused` event (fleet_import.publication.refusal). Last, OpenLineage
    events still pending (FLEET_OPENLINEAGE) are delivered, counted as LineageDelivered.

    Args:
        limit: At most this many batches per run.
    """
    rt = runtime_for_flow()
    owner = lease_owner()
    admitted = admission(rt.settings)
    outcomes: list = settle_abandoned_batches(rt.ctx, owner, limit, admission=admitted)
    outcomes += rt.publisher.drain(
        owner, lease_ttl=rt.ctx.lease_ttl, limit=limit, admission=admitted
    )
    counts: dict[str, int] = {}
    for outcome in outcomes:
        counts[type(outcome).__name__] = counts.get(type(outcome).__name__, 0) + 1
    if rt.ctx.lineage is not None:  # OpenLineage events the runs could not deliver
        delivered = rt.ctx.lineage.delivery.deliver_quietly(owner)
        counts["LineageDelivered"] = delivered.sent
    get_run_logger().info("drained %d batches: %s", len(outcomes), counts)
    if outcomes:
        create_table_artifact(
            [{"batch": str(o.batch_id), "outcome": type(o).__name__} for o in outcomes],
            key="drain-outcomes",
        )
        tell(rt, [o.batch_id for o in outcomes])
    return counts
