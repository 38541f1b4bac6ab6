"""import_s3_folder: one delivery of one tenant folder, as a Prefect flow.

Thin: the operation is `fleet_import.importing.driver.import_folder` (admission, claim,
the steps), run by `flows.operation` with each step a Prefect task; this module names the
run, shows the normalization's progress and takes the run's parameters.
"""

from __future__ import annotations

import time
import uuid

from prefect import flow
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.runtime import flow_run
from prefect.states import State

from fleet_import.errors import InvalidInput
from fleet_import.importing.context import Progress
from fleet_import.importing.driver import import_folder
from fleet_import.importing.guards import GuardOverride
from fleet_import.intake.admission import admission
from fleet_import.scope import folder_leaf, source_scope
from flows.api_reports import report
from flows.common import freeze_startup_heap, lease_owner, load_settings, runtime_for_flow
from flows.operation import FlowHost, run_operation
from flows.reporting import failed, fails_with_one_line
from flows.task_runner import SettingsTaskRunner

_PROGRESS_EVERY_SECONDS = 1.0


def _run_name() -> str:
    parameters = flow_run.get_parameters()
    leaf = folder_leaf(str(parameters.get("folder", "")))
    return f"import/{parameters.get('tenant_id', '?')}/{leaf}"


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
    no_gate: bool = False,
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
        no_gate: Skip the content gate (dataset checks, drift against the replaced slice's
            profile) for this run; recorded on the batch.
    """
    freeze_startup_heap()  # in a worker's process for this run: imports done, GC spared
    settings = load_settings()
    try:
        guard = GuardOverride.for_run(no_guard, min_rows_ratio, no_gate)
        source_scope(folder)  # invalid input is refused before anything is built
    except InvalidInput as exc:
        return failed(f"invalid input: {exc}")
    rt = runtime_for_flow(settings=settings)
    host = FlowHost(rt, progress=_progress_artifact, tell_unreported=True)
    key = delivery_key or f"flow-run:{flow_run.get_id() or uuid.uuid4()}"
    try:
        return run_operation(
            host,
            lambda steps, host: import_folder(
                rt.ctx,
                tenant_id,
                folder,
                key,
                admission=admission(settings),
                owner=lease_owner(),
                steps=steps,
                force=force,
                guard=guard,
                host=host,
            ),
        )
    except InvalidInput as exc:  # the tenant id, as the registry reads it
        return failed(f"invalid input: {exc}")
