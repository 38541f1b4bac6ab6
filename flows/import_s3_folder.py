"""import_s3_folder: one delivery of one tenant folder, as a Prefect flow.

Thin: every rule lives in fleet_import.pipeline; this module maps its steps to tasks
(retried only on transient errors), its outcomes to Prefect states, and its summary to
artifacts a data engineer reads in the UI.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

from prefect import flow, get_run_logger, task, unmapped
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run
from prefect.states import Failed, State
from prefect.task_runners import ThreadPoolTaskRunner

from fleet_import import failpoints, pipeline
from fleet_import.config import DEFAULT_NORMALIZE_WORKERS
from fleet_import.errors import InvalidInput, LeaseLost
from fleet_import.heartbeat import Heartbeat
from fleet_import.runtime import Runtime
from fleet_import.scope import Tenant, canonical_folder, source_scope, split_folder
from fleet_import.sources import Manifest, SourceObject
from flows.common import (
    TASK_RETRIES,
    TASK_RETRY_DELAYS,
    TASK_RETRY_JITTER,
    lease_owner,
    retry_if_transient,
    runtime_for_flow,
    tag_flow_run,
)
from flows.reporting import publish_artifacts, state_for

_TASK_OPTIONS: dict[str, Any] = {
    "retries": TASK_RETRIES,
    "retry_delay_seconds": TASK_RETRY_DELAYS,
    "retry_jitter_factor": TASK_RETRY_JITTER,
    "retry_condition_fn": retry_if_transient,
    "cache_policy": NO_CACHE,
}


def _run_name() -> str:
    parameters = flow_run.get_parameters()
    folder = str(parameters.get("folder", ""))
    leaf = folder.rstrip("/").rsplit("/", 1)[-1] or folder
    return f"import/{parameters.get('tenant_id', '?')}/{leaf}"


@task(name="discover", **_TASK_OPTIONS)
def discover(rt: Runtime, batch_id: uuid.UUID, scope: str, owner: str) -> Manifest:
    """List the folder and store the manifest on the batch."""
    return pipeline.discover_step(rt.ctx, batch_id, scope, owner)


@task(name="normalise", task_run_name="normalise/{obj.name}", **_TASK_OPTIONS)
def normalise(
    rt: Runtime, batch_id: uuid.UUID, bucket: str, obj: SourceObject
) -> pipeline.NormalizedEntry:
    """One source file to typed Parquet, or its cached output."""
    workdir = rt.ctx.workdir / str(batch_id)
    workdir.mkdir(parents=True, exist_ok=True)
    contract = rt.ctx.contracts[obj.dataset]
    return pipeline.normalize_object(rt.ctx, batch_id, bucket, obj, contract, workdir)


@task(name="commit-slice", cache_policy=NO_CACHE)
def commit_slice(
    rt: Runtime,
    tenant: Tenant,
    batch_id: uuid.UUID,
    scope: str,
    owner: str,
    manifest: Manifest,
    entries: Iterator[pipeline.NormalizedEntry],
    heartbeat: Heartbeat,
) -> pipeline.Committed:
    """Load each normalised file into one open slice transaction as soon as it is ready,
    drop duplicate keys, commit, record the commit. Not retried: a half-consumed stream
    cannot be replayed, and a rerun of the delivery reuses every normalised file."""
    return pipeline.load_step(rt.ctx, tenant, batch_id, scope, owner, manifest, entries, heartbeat)


@task(name="publish", cache_policy=NO_CACHE)
def publish(
    rt: Runtime, committed: pipeline.Committed, owner: str, heartbeat: Heartbeat
) -> pipeline.ImportOutcome:
    """Drain the batch's outbox in order, then succeed it."""
    return pipeline.publish_step(rt.ctx, committed, owner, heartbeat)


@flow(
    name="import-s3-folder",
    flow_run_name=_run_name,
    retries=0,
    task_runner=ThreadPoolTaskRunner(max_workers=DEFAULT_NORMALIZE_WORKERS),
)
def import_s3_folder(tenant_id: str, folder: str, delivery_key: str | None = None) -> State:
    """Import one S3 folder of a tenant into its curated slices.

    Args:
        tenant_id: The tenant's slug, e.g. acme.
        folder: The delivery folder, e.g. s3://fleet-landing/acme/fleet/2026-07-22/.
        delivery_key: Identifies this request; a duplicate with the same key continues its
            batch (or does nothing if it finished). Defaults to the flow run id, so a UI
            rerun is a new delivery.
    """
    logger = get_run_logger()
    try:
        tenant = Tenant.named(tenant_id)
        scope = source_scope(folder)
    except InvalidInput as exc:
        return Failed(message=f"invalid input: {exc}")
    tag_flow_run(f"tenant:{tenant.tenant_id}", f"scope:{scope}")
    rt = runtime_for_flow()
    key = delivery_key or f"flow-run:{flow_run.get_id() or uuid.uuid4()}"
    claimed = pipeline.claim(rt.ctx, tenant, scope, key, lease_owner())
    if not isinstance(claimed, pipeline.Claimed):
        logger.info("no work for this delivery: %s", claimed)
        return state_for(claimed)
    batch_id, owner = claimed.batch_id, claimed.owner
    logger.info("batch %s holds %s (lease %s)", batch_id, scope, owner)
    try:
        with Heartbeat(rt.ctx.repo, batch_id, owner, rt.ctx.lease_ttl) as heartbeat:
            outcome = _run(rt, tenant, batch_id, scope, owner, heartbeat)
            if isinstance(outcome, pipeline.Committed):
                outcome = publish(rt, outcome, owner, heartbeat)
    except LeaseLost as exc:
        return Failed(message=f"lost the lease on batch {batch_id}: {exc}")
    finally:
        failpoints.hit("before_lease_release")
        pipeline.release_lease_quietly(rt.ctx.repo, batch_id, owner)
    publish_artifacts(rt, batch_id)
    return state_for(outcome)


def _run(
    rt: Runtime, tenant: Tenant, batch_id: uuid.UUID, scope: str, owner: str, heartbeat: Heartbeat
) -> pipeline.ImportOutcome:
    recovered = pipeline.recover_committed(rt.ctx, tenant, batch_id, scope, owner)
    if recovered is not None:
        return recovered
    try:
        manifest = discover(rt, batch_id, scope, owner)
        bucket, _ = split_folder(canonical_folder(manifest.folder))
        progress_id = create_progress_artifact(
            0.0, key="normalise-progress", description=f"normalising {scope}"
        )
        futures = normalise.map(
            unmapped(rt), unmapped(batch_id), unmapped(bucket), list(manifest.load_order())
        )

        def entries() -> Iterator[pipeline.NormalizedEntry]:
            # In load order, each as soon as its task is done: the slice's COPY takes one
            # file (on its reader thread, in this task's context) while the task runner
            # normalises the next.
            for done, future in enumerate(futures, start=1):
                yield future.result()
                update_progress_artifact(progress_id, 100.0 * done / len(futures))

        return commit_slice(rt, tenant, batch_id, scope, owner, manifest, entries(), heartbeat)
    except LeaseLost:
        raise
    except Exception as exc:  # noqa: BLE001 - the pipeline decides what a failure means
        return pipeline.settle_failure(rt.ctx, tenant, batch_id, scope, owner, exc)
