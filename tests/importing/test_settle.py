"""Settling a leased batch when the warehouse cannot say whether it committed: the stamp
answers *unknown*, never a silent "not stamped"."""

from __future__ import annotations

import dataclasses

from fleet_import.errors import PreCommitError
from fleet_import.importing.context import Failed, ImportContext
from fleet_import.importing.leased_batch import LeasedBatch, Stamp, read_stamp
from fleet_import.importing.settle import recover_or_fail
from fleet_import.scope import Tenant, source_scope
from fleet_import.store.details import FailureKind
from fleet_import.store.models import (
    BatchStatus,
    LeaseAcquired,
)
from fleet_import.warehouse.postgres.warehouse import PostgresWarehouse

# Nothing listens on port 1: every read of this warehouse fails as a dropped connection.
UNREACHABLE = "postgresql://postgres@127.0.0.1:1/nowhere?connect_timeout=2"


def test_an_unreadable_stamp_is_unknown_and_a_failure_on_it_says_so(
    import_ctx: ImportContext, acme: Tenant
) -> None:
    scope = source_scope("s3://fleet-landing/acme/fleet/2026-07-22/")
    ctx = dataclasses.replace(import_ctx, warehouse=PostgresWarehouse(UNREACHABLE))
    batch_id = ctx.repo.reserve(acme, scope, "delivery-1").batch.id
    assert read_stamp(ctx.warehouse, acme.tenant_id, scope, batch_id) is Stamp.UNKNOWN
    assert read_stamp(import_ctx.warehouse, acme.tenant_id, scope, batch_id) is Stamp.NOT_STAMPED
    assert isinstance(ctx.repo.acquire_lease(batch_id, "worker-1", 30), LeaseAcquired)

    outcome = recover_or_fail(
        LeasedBatch(ctx, acme, batch_id, scope, "worker-1"), PreCommitError("trips.csv: bad")
    )

    # Today's decision (issue #26 revisits it): taken as not stamped, so failed before
    # commit; but the record and the event name the unknown outcome.
    assert isinstance(outcome, Failed) and outcome.kind == FailureKind.FAILED_PRE_COMMIT
    batch = ctx.repo.get(batch_id)
    assert batch is not None and batch.status == BatchStatus.FAILED
    assert batch.details["failure"]["commit_outcome"] == "unknown"
    [failed] = [
        payload for name, payload in import_ctx.recorded_events if name == "fleet.batch.failed"
    ]
    assert failed["commit_outcome"] == "unknown" and failed["kind"] == "failed_pre_commit"
