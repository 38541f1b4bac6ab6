"""sweep_landing_zone: start imports for complete landing folders nobody loaded yet.

Thin: completeness, fingerprints and the start/skip decision live in fleet_import.intake.sweep.
This flow lists, plans, starts `import-s3-folder` runs through their deployment, and shows
what it did (every row with its tenant, and how long the sweep took) as a table artifact;
the skips an operator may look for are also `fleet.delivery.skipped` events.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any, Literal

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.deployments import run_deployment
from prefect.states import State

from fleet_import.contracts.drift import adds_columns
from fleet_import.contracts.files import contracts_in_force
from fleet_import.importing.drift import effective_contracts
from fleet_import.importing.runtime import build_warehouse
from fleet_import.intake import sweep
from fleet_import.intake.admission import admitted_sweep
from fleet_import.intake.completion import (
    DEFAULT_MARKER,
    DEFAULT_QUIET_SECONDS,
    CompletionRule,
    completion_rule,
)
from fleet_import.intake.landing import DEFAULT_PATTERN, LandingLayout
from fleet_import.intake.shards import Shard, shard_imports
from fleet_import.s3.client import settings_s3_client
from fleet_import.store.sweep_repository import SweepRepository
from fleet_import.tenants.binding import DELIVERY_REFUSED_EVENT
from flows.common import (
    TASK_RETRIES,
    TASK_RETRY_DELAYS,
    TASK_RETRY_JITTER,
    load_settings,
    prefect_event_sink,
    retry_if_transient,
)
from flows.reporting import failed, fails_with_one_line, foreseen_as_state

DEFAULT_IMPORT_DEPLOYMENT = "import-s3-folder/import-s3-folder"
DEFAULT_BULK_DEPLOYMENT = "bulk-import/bulk-import"
# The artifact is for reading: a landing zone of years of daily folders would make a table
# nobody scrolls. The counts are always complete.
_ARTIFACT_MAX_ROWS = 500


@task(
    name="find-ready-folders",
    retries=TASK_RETRIES,
    retry_delay_seconds=TASK_RETRY_DELAYS,
    retry_jitter_factor=TASK_RETRY_JITTER,
    retry_condition_fn=retry_if_transient,
    cache_policy=NO_CACHE,
)
@foreseen_as_state
def find_ready_folders(
    bucket: str, prefix: str, layout: str, rule: CompletionRule, lookback_days: int
) -> sweep.Scan:
    """List the landing zone's folders of the window and fingerprint the complete ones."""
    settings = load_settings()
    s3 = settings_s3_client(settings)
    contracts = contracts_in_force(settings.contracts)
    contracts_of = None
    if any(adds_columns(contract) for contract in contracts.values()):
        # As the imports will read them: with the columns drift added (issue #25).
        warehouse = build_warehouse(settings, s3)
        contracts_of = partial(effective_contracts, contracts, warehouse)
    return sweep.find_ready_folders(
        s3,
        bucket,
        prefix,
        layout=layout,
        completion=rule,
        contracts=contracts,
        lookback_days=lookback_days,
        contracts_of=contracts_of,
    )


@task(
    name="plan-sweep",
    retries=TASK_RETRIES,
    retry_delay_seconds=TASK_RETRY_DELAYS,
    retry_jitter_factor=TASK_RETRY_JITTER,
    retry_condition_fn=retry_if_transient,
    cache_policy=NO_CACHE,
)
def plan_sweep(scan: sweep.Scan) -> sweep.SweepPlan:
    """Skip content already loaded or in hand; key the rest by scope and fingerprint."""
    settings = load_settings()
    return sweep.plan_sweep(
        scan, SweepRepository.from_settings(settings), settings.lease_ttl_seconds
    )


# Retrying is safe: the idempotency key makes a repeated request return the same run.
@task(
    name="start-import",
    task_run_name="start-import/{planned.tenant_id}",
    retries=TASK_RETRIES,
    retry_delay_seconds=TASK_RETRY_DELAYS,
    retry_jitter_factor=TASK_RETRY_JITTER,
    cache_policy=NO_CACHE,
)
def start_import(deployment: str, planned: sweep.PlannedImport) -> dict[str, Any]:
    """Create (or find) the import run of one delivery."""
    flow_run = run_deployment(
        name=deployment,
        parameters=planned.parameters,
        idempotency_key=planned.idempotency_key,
        timeout=0,
        # Not a subflow: an import must outlive (and not be cancelled with) the sweep.
        as_subflow=False,
        tags=[f"tenant:{planned.tenant_id}"],
    )
    return _started_run(flow_run)


# Retrying is safe: the shard's key names its deliveries, so a repeat returns the same run.
@task(
    name="start-bulk-import",
    task_run_name="start-bulk-import/{index}",
    retries=TASK_RETRIES,
    retry_delay_seconds=TASK_RETRY_DELAYS,
    retry_jitter_factor=TASK_RETRY_JITTER,
    cache_policy=NO_CACHE,
)
def start_shard(deployment: str, index: int, shard: Shard) -> dict[str, Any]:
    """Create (or find) the bulk-import run of one shard of deliveries."""
    flow_run = run_deployment(
        name=deployment,
        parameters={"deliveries": shard.deliveries},
        idempotency_key=shard.idempotency_key,
        timeout=0,
        as_subflow=False,  # as start_import: the imports outlive the sweep
        tags=sorted({f"tenant:{planned.tenant_id}" for planned in shard.imports})[:20],
    )
    return _started_run(flow_run)


def _started_run(flow_run: Any) -> dict[str, Any]:
    """What the sweep's artifact says of a run it started (or found)."""
    return {
        "flow_run_id": str(flow_run.id),
        "flow_run_name": flow_run.name,
        "state": flow_run.state.name if flow_run.state else "unknown",
    }


def _started(
    admitted: list[sweep.PlannedImport], deployment: str, shards: int, bulk_deployment: str
) -> list[tuple[sweep.PlannedImport, dict[str, Any]]]:
    """Each admitted delivery with the run that imports it: its own, or its shard's."""
    if shards <= 0:
        return [(planned, start_import(deployment, planned)) for planned in admitted]
    started = []
    for index, shard in enumerate(shard_imports(admitted, shards)):
        run = start_shard(bulk_deployment, index, shard)
        started += [(planned, run) for planned in shard.imports]
    return started


@flow(name="sweep-landing-zone", retries=0)
@fails_with_one_line
def sweep_landing_zone(
    bucket: str,
    prefix: str = "",
    completion: Literal["marker", "quiet", "manifest"] = "marker",
    marker: str = DEFAULT_MARKER,
    quiet_seconds: int = DEFAULT_QUIET_SECONDS,
    marker_grace_seconds: int = 0,
    layout: str = DEFAULT_PATTERN,
    deployment: str = DEFAULT_IMPORT_DEPLOYMENT,
    lookback_days: int | None = None,
    shards: int = 0,
    bulk_deployment: str = DEFAULT_BULK_DEPLOYMENT,
) -> dict[str, int] | State:
    """Start an import for every complete landing folder whose current content has not
    been loaded, at most one run per delivery however many sweeps and events overlap.

    Args:
        bucket: The landing bucket, e.g. fleet-landing.
        prefix: Key prefix above the tenant folders, e.g. landing/ (empty for the bucket root).
        completion: "marker": a folder is complete once it holds the marker object;
            "quiet": once its newest object is quiet_seconds old; "manifest": once its
            _manifest.json is there and every mandatory entry arrived at its size.
        marker: The marker object's name, for the "marker" rule.
        quiet_seconds: How long a folder must not change, for the "quiet" rule.
        marker_grace_seconds: For the "marker" rule: leave a marker younger than this to
            the S3 event trigger (set it above the trigger's schedule_after), so the sweep
            only catches deliveries whose event was lost.
        layout: Where delivery folders are below the prefix, with {tenant}, {yyyy-mm-dd}
            and * placeholders (fleet_import.intake.landing describes them).
        deployment: The import deployment to start, as flow-name/deployment-name.
        lookback_days: Only folders dated from this many days ago through tomorrow, by the
            layout's {yyyy-mm-dd}; older folders are never listed. Unset: the
            FLEET_SWEEP_LOOKBACK_DAYS setting (3). 0: every folder (a one-off catch-up).
        shards: 0: one import-s3-folder run per delivery. N > 0: the deliveries split into
            at most N bulk-import runs, each importing its share one task run per delivery
            (a thousand deliveries in a few flow runs; benchmarks/README.md, fleet_scale).
        bulk_deployment: The bulk-import deployment the shards run on.
    """
    started_at = time.monotonic()
    logger = get_run_logger()
    if lookback_days is None:
        lookback_days = load_settings().sweep_lookback_days
    rule = completion_rule(
        completion,
        marker=marker,
        quiet_seconds=quiet_seconds,
        marker_grace_seconds=marker_grace_seconds,
    )
    scanned = find_ready_folders(bucket, prefix, layout, rule, lookback_days, return_state=True)
    if scanned.is_failed():  # e.g. no such bucket: the run says so, without a traceback
        return failed(f"sweep of s3://{bucket}/{prefix} failed: {scanned.message}")
    scan = scanned.result()
    if lookback_days and scan.window is None:
        logger.warning("layout %r names no date: the lookback window cannot apply", layout)
    plan = plan_sweep(scan)
    # The key names the tenant; the registry may still refuse it (unknown, disabled).
    plan, refusals = admitted_sweep(
        load_settings(), plan, layout=LandingLayout(prefix=prefix, pattern=layout)
    )
    admitted = plan.start
    for refusal in refusals:
        prefect_event_sink(DELIVERY_REFUSED_EVENT, refusal.payload("sweep"))
    started = _started(admitted, deployment, shards, bulk_deployment)
    rows = [
        {
            "action": "start",
            "tenant": planned.tenant_id,
            "folder": planned.folder,
            "detail": f"flow run {run['flow_run_name']} ({run['state']})",
            "fingerprint": planned.fingerprint[:12],
        }
        for planned, run in started
    ]
    rows += [
        {
            "action": "skip",
            "tenant": skip.tenant_id or "",
            "folder": skip.folder,
            "detail": f"{skip.kind}: {skip.reason}",
            "fingerprint": "",
        }
        for skip in plan.skip
    ]
    rows += [
        {
            "action": "refuse",
            "tenant": refusal.tenant_id,
            "folder": refusal.folder,
            "detail": f"{refusal.kind}: {refusal.reason}",
            "fingerprint": "",
        }
        for refusal in refusals
    ]
    sweep.announce_skips(plan.skip, prefect_event_sink)
    counts = {
        "ready": len(scan.ready),
        "started": len(admitted),
        "skipped": len(plan.skip),
    }
    if refusals:
        counts["refused"] = len(refusals)
    if shards > 0 and started:
        counts["shards"] = len({run["flow_run_id"] for _, run in started})
    window = f"folders dated {scan.window[0]}..{scan.window[1]}" if scan.window else "every folder"
    description = (
        f"sweep of s3://{bucket}/{prefix} ({window}): "
        + ", ".join(f"{n} {what}" for what, n in counts.items())
        + f"; {scan.listings} listings in {scan.seconds:.1f} s,"
        f" whole sweep {time.monotonic() - started_at:.1f} s"
    )
    if len(rows) > _ARTIFACT_MAX_ROWS:
        description += f" (first {_ARTIFACT_MAX_ROWS} of {len(rows)} rows)"
    create_table_artifact(rows[:_ARTIFACT_MAX_ROWS], key="sweep-plan", description=description)
    logger.info(description)
    return counts
