"""import_s3_folder: one delivery of one tenant folder, as a Prefect flow.

Thin: the algorithm is `fleet_import.importing.driver.import_batch`, run here through
`PrefectSteps`, which makes each of its steps a Prefect task (retried only on transient
errors, as the step says). This module maps outcomes to Prefect states and the batch to
artifacts a data engineer reads in the UI.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from prefect import Task, flow, get_run_logger, task
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.cache_policies import NO_CACHE
from prefect.futures import PrefectFuture
from prefect.runtime import flow_run
from prefect.states import State

from fleet_import.errors import FleetImportError, InvalidInput, LeaseLost
from fleet_import.explain import explain
from fleet_import.importing import driver as pipeline
from fleet_import.importing.claim import claim
from fleet_import.importing.context import Claimed, Progress
from fleet_import.importing.guards import GuardOverride, record_override
from fleet_import.importing.runtime import Runtime
from fleet_import.intake.admission import admit
from fleet_import.scope import folder_leaf, source_scope
from fleet_import.tenants.binding import DELIVERY_REFUSED_EVENT, Refused
from flows.api_reports import report
from flows.common import (
    TASK_RETRIES,
    TASK_RETRY_DELAYS,
    TASK_RETRY_JITTER,
    freeze_startup_heap,
    holding_load_slots,
    lease_owner,
    load_settings,
    prefect_event_sink,
    retry_if_transient,
    runtime_for_flow,
    tag_flow_run,
)
from flows.late_reports import tell_unreported_runs
from flows.reporting import (
    failed,
    fails_with_one_line,
    foreseen_as_state,
    publish_artifacts,
    refused,
    state_for,
)
from flows.story import tell
from flows.task_runner import SettingsTaskRunner

T = TypeVar("T")
# Task run names: the normalize step's shows the file it reads. "normalise" (and the
# artifact key "normalise-progress") keep the spelling Prefect recorded for earlier runs.
_RUN_NAMES = {"normalise": "normalise/{job.obj.name}"}
_PROGRESS_EVERY_SECONDS = 1.0


def _run_name() -> str:
    parameters = flow_run.get_parameters()
    leaf = folder_leaf(str(parameters.get("folder", "")))
    return f"import/{parameters.get('tenant_id', '?')}/{leaf}"


class PrefectSteps:
    """The driver's steps as Prefect tasks, on the flow's task runner. A step's error
    reaches the driver as the step's exception, as under CoreSteps; `crash` keeps the first
    one that is not a fleet-import error (a bug), so the run's state can say so."""

    def __init__(self) -> None:
        self._tasks: dict[tuple[str, Callable[..., Any]], Task[..., Any]] = {}
        self.crash: BaseException | None = None

    def _task(self, step: pipeline.Step, fn: Callable[..., T]) -> Task[..., T]:
        key = (step.name, fn)
        if key not in self._tasks:
            retries: dict[str, Any] = {}
            if step.retried:
                retries = {
                    "retries": TASK_RETRIES,
                    "retry_delay_seconds": TASK_RETRY_DELAYS,
                    "retry_jitter_factor": TASK_RETRY_JITTER,
                    "retry_condition_fn": retry_if_transient,
                }
            if step.name == "commit-slice":  # one warehouse load slot, one of the tenant's
                fn = holding_load_slots(fn)
            self._tasks[key] = task(
                foreseen_as_state(fn, retried=step.retried),
                name=step.name,
                task_run_name=_RUN_NAMES.get(step.name),
                cache_policy=NO_CACHE,
                **retries,
            )
        return self._tasks[key]

    def run(self, step: pipeline.Step, fn: Callable[..., T], *args: Any) -> T:
        # The state, not the call's value: a task that returned a Failed state would hand
        # back that state; its result() raises the step's exception.
        return self._raised(self._task(step, fn)(*args, return_state=True).result)

    def map(self, step: pipeline.Step, fn: Callable[..., T], args: Sequence[tuple]) -> Iterator[T]:
        """As under CoreSteps, once an item failed the items not yet started never start:
        the run ends when the ones under way do (an S3 that stopped answering costs one
        call's bound, not one per file the task runner still had queued)."""
        if not args:
            return
        columns = [list(column) for column in zip(*args, strict=True)]
        futures = list(self._task(step, fn).map(*columns))
        for future in futures:
            future.add_done_callback(lambda done: _cancel_after_failure(done, futures))
        for future in futures:
            yield self._raised(future.result)

    def _raised(self, result: Callable[[], T]) -> T:
        try:
            return result()
        except FleetImportError:
            raise
        except Exception as exc:
            self.crash = self.crash or exc
            raise


def _cancel_after_failure(done: PrefectFuture[Any], futures: Sequence[PrefectFuture[Any]]) -> None:
    """A done callback: when `done` failed, cancel the futures not yet started. It runs in
    the worker that ran `done`, before that worker takes the next queued item."""
    try:
        outcome = done.result(raise_on_failure=False)
    except BaseException:  # noqa: BLE001 - cancelled: not a failure of its own
        return
    if not isinstance(outcome, BaseException):
        return
    for future in futures:
        wrapped = getattr(future, "wrapped_future", None)
        if wrapped is not None:
            wrapped.cancel()  # a queued item never starts; a running one carries on


def _progress_artifact(scope: str) -> Progress:
    """ctx.progress for the flow: the normalization's fraction done as a progress artifact
    (called on the COPY's reader thread, which runs in the commit task's copied context)."""
    artifact_id = report(
        "the normalization's progress",
        lambda: create_progress_artifact(
            0.0, key="normalise-progress", description=f"normalizing {scope}"
        ),
    )
    sent = [time.monotonic()]

    def progress(message: str, fraction: float | None) -> None:
        # At most one update a _PROGRESS_EVERY_SECONDS, and always the last (100%): a
        # delivery of small files costs one API call, not one per file.
        now = time.monotonic()
        if artifact_id is None or fraction is None:
            return
        if fraction >= 1.0 or now - sent[0] >= _PROGRESS_EVERY_SECONDS:
            sent[0] = now
            # Never raises for the API: it is called from inside the slice load.
            report(
                "the normalization's progress",
                lambda: update_progress_artifact(artifact_id, 100.0 * fraction),
            )

    return progress


@flow(
    name="import-s3-folder",
    flow_run_name=_run_name,
    retries=0,
    task_runner=SettingsTaskRunner(),  # threads, or Dask: the run's settings decide
)
@fails_with_one_line
def import_s3_folder(
    tenant_id: str,
    folder: str,
    delivery_key: str | None = None,
    force: bool = False,
    no_guard: bool = False,
    min_rows_ratio: float | None = None,
) -> State:
    """Import one S3 folder of a tenant into its curated slices. A folder that is not in
    the tenant's landing area, or a tenant the registry does not enable, ends Refused with
    nothing written (fleet_import.tenants.binding).

    Args:
        tenant_id: The tenant's slug, e.g. acme.
        folder: The delivery folder, e.g. s3://fleet-landing/acme/fleet/2026-07-22/.
        delivery_key: Identifies this request; a duplicate with the same key continues its
            batch while it runs, does nothing once it succeeded, and starts a fresh batch
            after it failed. Defaults to the flow run id. The UI's Retry runs the same flow
            run again, so it keeps the key: it continues the batch that is still running
            (its executor died) or starts a fresh batch after a failure. A new run of the
            deployment is a new delivery.
        force: Load even when the slice already holds exactly this content (by default
            such a delivery ends AlreadyLoaded, naming the batch that loaded it).
        no_guard: Load even a slice the contracts' guards would hold for review (one that
            empties a dataset or shrinks it below `min_rows_ratio` of the current slice).
        min_rows_ratio: For this run, every dataset's `min_rows_ratio` (0..1) instead of
            its contract's.
    """
    freeze_startup_heap()  # in a worker's process for this run: imports done, GC spared
    logger = get_run_logger()
    settings = load_settings()
    try:
        scope = source_scope(folder)
        admitted = admit(settings, tenant_id, folder)
        guard = GuardOverride.for_run(no_guard, min_rows_ratio)
    except InvalidInput as exc:
        return failed(f"invalid input: {exc}")
    if isinstance(admitted, Refused):  # before the scope is reserved: nothing is written
        prefect_event_sink(DELIVERY_REFUSED_EVENT, admitted.payload("import-s3-folder"))
        return refused(admitted)
    tenant = admitted
    tag_flow_run(f"tenant:{tenant.tenant_id}", f"scope:{scope}")
    key = delivery_key or f"flow-run:{flow_run.get_id() or uuid.uuid4()}"
    rt = runtime_for_flow(settings=settings)
    claimed = claim(rt.ctx, tenant, scope, key, lease_owner(), force=force)
    tell_unreported_runs(rt, tenant.tenant_id, scope)  # runs the API never heard end
    if not isinstance(claimed, Claimed):
        logger.info("no work for this delivery: %s", claimed)
        return state_for(claimed)
    logger.info("batch %s holds %s (lease %s)", claimed.batch_id, scope, claimed.owner)
    record_override(rt.ctx, claimed, guard)  # slice guards' override (issue #24)
    rt.ctx.progress = _progress_artifact(scope)
    steps = PrefectSteps()
    try:
        _record_run(rt, claimed)
        tell(rt, [claimed.batch_id])
        outcome = pipeline.import_batch(rt.ctx, tenant, claimed, steps)
    except LeaseLost as exc:
        tell(rt, [claimed.batch_id])
        return failed(f"lost the lease on batch {claimed.batch_id}: {explain(exc)}")
    publish_artifacts(rt, claimed.batch_id)
    tell(rt, [claimed.batch_id])
    return state_for(outcome, crash=steps.crash)


def _record_run(rt: Runtime, claimed: Claimed) -> None:
    """The batch keeps the flow run that made it (a UI Retry is the same run; a later run
    continuing a dead one's batch is not the one that made it), for the tenant's table and
    the batch's story."""
    run_id = flow_run.get_id()
    batch = rt.ctx.repo.get(claimed.batch_id)
    if run_id and batch is not None and "flow_run_id" not in batch.details:
        rt.ctx.repo.update_details(claimed.batch_id, claimed.owner, {"flow_run_id": run_id})
