"""A flow run whose end never reached the Prefect API (the API gone past its client's
retries as the run ended, issue #26) stays Running in the UI, although its batch ended. The
next import of the same folder, with the API back, tells that run how its batch ended: the
UI then says what the operational database knows.

Only a run whose batch ended (succeeded or failed) at least a lease TTL ago is told: a run
still sending its own end is left to do so.
"""

from __future__ import annotations

import datetime as dt
import logging

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterId,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import StateType
from prefect.runtime import flow_run
from prefect.states import Completed, Failed, State

from fleet_import.importing.runtime import Runtime
from fleet_import.store.models import Batch, BatchStatus
from flows.api_reports import report
from flows.story import made_by

log = logging.getLogger(__name__)

_RECENT_BATCHES = 20
"""How many of the folder's newest batches are looked at: its last few runs, however many
other folders the tenant delivered since."""


def tell_unreported_runs(rt: Runtime, tenant_id: str, scope: str) -> None:
    """Give each Running flow run of this folder's ended batches the state its batch ended
    in. Never fails the import: an API gone again is a report dropped (api_reports)."""
    try:
        report(f"the late ends of earlier runs of {scope}", lambda: _tell(rt, tenant_id, scope))
    except Exception as exc:  # noqa: BLE001 - a view of earlier runs never fails this one
        log.warning("could not tell earlier runs of %s how they ended: %s", scope, exc)


def _tell(rt: Runtime, tenant_id: str, scope: str) -> None:
    ended_before = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=rt.ctx.lease_ttl)
    this_run = flow_run.get_id()
    ended = {
        run: batch
        for batch in rt.ctx.repo.list(tenant=tenant_id, scope=scope, limit=_RECENT_BATCHES)
        if batch.status in (BatchStatus.SUCCEEDED, BatchStatus.FAILED)
        and batch.updated_at < ended_before
        and (run := made_by(batch)) is not None
        and str(run) != this_run
    }
    if not ended:
        return
    with get_client(sync_client=True) as client:
        running = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                id=FlowRunFilterId(any_=list(ended)),
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.RUNNING])),
            )
        )
        for run in running:
            batch = ended[run.id]
            client.set_flow_run_state(run.id, _ended_state(batch, this_run), force=True)
            log.warning(
                "flow run %s of batch %s never reported its end; now %s, as its batch",
                run.id,
                batch.id,
                batch.status,
            )


def _ended_state(batch: Batch, told_by: str | None) -> State:
    told = f" (told by flow run {told_by}: this run's own end never reached the Prefect API)"
    if batch.status is BatchStatus.SUCCEEDED:
        return Completed(message=f"batch {batch.id} succeeded{told}")
    failure = batch.record.failure
    kind, error = (failure.kind, failure.error) if failure is not None else ("failed", "")
    return Failed(message=f"{kind}: {error}{told}")
