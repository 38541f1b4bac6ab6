"""What every flow that loads a slice (import, approve, rollback) does around the core's
operation, once: the operation itself is composed in the core (`importing.driver.
import_folder`, `importing.review.approve_held`, `importing.rollback.rollback_slice`); the
flow gives it Prefect tasks as its steps and a `FlowHost` that shows it in the UI, then
turns its outcome into the run's state and artifacts."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence

from prefect import get_run_logger
from prefect.runtime import flow_run, task_run
from prefect.states import State

from fleet_import.errors import LeaseLost
from fleet_import.explain import explain
from fleet_import.importing.context import Claimed, ImportOutcome, Progress
from fleet_import.importing.driver import StepRunner
from fleet_import.importing.review import NotApproved
from fleet_import.importing.rollback import NotRolledBack
from fleet_import.importing.runtime import Runtime
from fleet_import.scope import Tenant
from fleet_import.store.details import BatchDetails
from fleet_import.tenants.binding import Refused
from flows.common import tag_flow_run
from flows.late_reports import tell_unreported_runs
from flows.prefect_steps import PrefectSteps
from flows.reporting import failed, publish_artifacts, refused, state_for
from flows.story import tell

Operation = Callable[
    [StepRunner, "FlowHost"], ImportOutcome | Refused | NotApproved | NotRolledBack
]


class FlowHost:
    """The run's view of the operation: tags, the batch's story, progress."""

    def __init__(
        self,
        rt: Runtime,
        *,
        progress: Callable[[str], Progress] | None = None,
        tell_unreported: bool = False,
        tenant_tables: bool = True,
    ) -> None:
        self.rt = rt
        self._progress = progress
        self._tell_unreported = tell_unreported
        self.tenant_tables = tenant_tables
        """False: the caller tells each tenant's table once for many batches (bulk import)."""
        self.told: list[uuid.UUID] = []
        self.headline: str | None = None

    def admitted(self, tenant: Tenant, scope: str) -> None:
        tag_flow_run(f"tenant:{tenant.tenant_id}", f"scope:{scope}")

    def claim_ended(self, tenant: Tenant, scope: str, claim: Claimed | ImportOutcome) -> None:
        if not isinstance(claim, Claimed):
            get_run_logger().info("no work for this delivery: %s", claim)
        if self._tell_unreported:
            tell_unreported_runs(self.rt, tenant.tenant_id, scope)  # runs the API never heard end

    def progress(self, scope: str) -> Progress | None:
        return self._progress(scope) if self._progress is not None else None

    def loading(
        self, claimed: Claimed, told: Sequence[uuid.UUID], headline: str | None = None
    ) -> None:
        self.told, self.headline = list(told), headline
        logger = get_run_logger()  # the run's own log, as the UI shows it
        logger.info("batch %s holds %s (lease %s)", claimed.batch_id, claimed.scope, claimed.owner)
        if len(self.told) > 1:
            logger.info("batch %s approves held batch %s", claimed.batch_id, self.told[1])
        if headline:
            logger.info("batch %s: %s", claimed.batch_id, headline)
        _record_run(self.rt, claimed)
        tell(self.rt, self.told, tenant_tables=self.tenant_tables)


def run_operation(
    host: FlowHost, operation: Operation, steps: StepRunner | None = None
) -> State:
    """Run the core's operation with its steps as Prefect tasks (or `steps`: a bulk import's
    deliveries, each a task run already, run theirs as plain calls); its outcome as the
    run's state, the batch's artifacts and story told whatever the outcome."""
    steps = steps or PrefectSteps()
    try:
        outcome = operation(steps, host)
    except LeaseLost as exc:
        tell(host.rt, host.told, tenant_tables=host.tenant_tables)
        batch = f"batch {host.told[0]}" if host.told else "its batch"
        return failed(f"lost the lease on {batch}: {explain(exc)}")
    if isinstance(outcome, Refused):
        return refused(outcome)
    if isinstance(outcome, NotApproved):
        return failed(outcome.reason, name="NotApproved")
    if isinstance(outcome, NotRolledBack):
        return failed(outcome.reason, name="NotRolledBack")
    if host.told:
        publish_artifacts(host.rt, host.told[0])
        tell(host.rt, host.told, tenant_tables=host.tenant_tables)
    state = state_for(outcome, crash=getattr(steps, "crash", None))
    if host.headline:
        state = state.model_copy(update={"message": f"{host.headline}; {state.message}"})
    return state


def _record_run(rt: Runtime, claimed: Claimed) -> None:
    """The batch keeps the flow run that made it (a UI Retry is the same run; a later run
    continuing a dead one's batch is not the one that made it), for the tenant's table and
    the batch's story; a bulk import's delivery its task run too."""
    run_id, task_id = flow_run.get_id(), task_run.get_id()
    batch = rt.ctx.repo.get(claimed.batch_id)
    if run_id and batch is not None and batch.record.flow_run_id is None:
        patch = BatchDetails.patch(
            flow_run_id=run_id, **({"task_run_id": task_id} if task_id else {})
        )
        rt.ctx.repo.update_details(claimed.batch_id, claimed.owner, patch)
