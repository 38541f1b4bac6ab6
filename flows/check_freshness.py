"""check_freshness: is every tenant's expected delivery loaded? Late ones are told once.

Thin: the SLOs, the comparison with the store and S3, and "what changed" live in
fleet_import.freshness. This flow runs the check with Prefect's event sink, so changes become
`fleet.tenant.late` / `fleet.tenant.fresh-again` events (an automation in prefect.yaml turns
`late` into a notification), and shows every verdict as a table artifact.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.states import State

from fleet_import.checks.settings import FRESHNESS, check_settings
from fleet_import.freshness.check import FreshnessReport
from fleet_import.freshness.runtime import freshness_runtime
from flows.common import (
    TASK_RETRIES,
    TASK_RETRY_DELAYS,
    TASK_RETRY_JITTER,
    load_settings,
    prefect_event_sink,
    retry_if_transient,
)
from flows.reporting import failed, fails_with_one_line, foreseen_as_state


@task(
    name="check-slos",
    retries=TASK_RETRIES,
    retry_delay_seconds=TASK_RETRY_DELAYS,
    retry_jitter_factor=TASK_RETRY_JITTER,
    retry_condition_fn=retry_if_transient,
    cache_policy=NO_CACHE,
)
@foreseen_as_state
def check_slos(now: dt.datetime) -> FreshnessReport:
    """Judge every tenant and dataset, remember the verdicts, tell what changed."""
    settings = check_settings(FRESHNESS, settings=load_settings())
    return freshness_runtime(settings).check(prefect_event_sink, now)


@flow(name="check-freshness", retries=0)
@fails_with_one_line
def check_freshness(now: dt.datetime | None = None) -> dict[str, Any] | State:
    """Compare each tenant's freshness SLOs (FLEET_FRESHNESS, the registry's overrides) with
    the succeeded batches and with what waits in the landing bucket; emit fleet.tenant.late
    and fleet.tenant.fresh-again once per change.

    Args:
        now: The check's clock (UTC). Leave it empty: the current time. A past time judges
            as of then (and is remembered as the latest verdict).
    """
    check_settings(FRESHNESS, settings=load_settings())
    moment = (now or dt.datetime.now(dt.UTC)).astimezone(dt.UTC)
    checked = check_slos(moment, return_state=True)
    if checked.is_failed():
        return failed(f"freshness check failed: {checked.message}")
    report: FreshnessReport = checked.result()
    rows = [
        {
            "tenant": v.tenant_id,
            "dataset": v.dataset,
            "state": v.state,
            "expected by": v.expected_by.isoformat() if v.expected_by else "",
            "last loaded": v.last_loaded.isoformat() if v.last_loaded else "",
            "found": v.found,
        }
        for v in report.verdicts
    ]
    counts = {
        "checked": len(report.verdicts),
        "late": len(report.late),
        "told": len(report.told),
    }
    description = (
        f"freshness at {moment.isoformat()}: {counts['checked']} checked, "
        f"{counts['late']} late, {counts['told']} changes told"
    )
    create_table_artifact(rows, key="freshness", description=description)
    get_run_logger().info(description)
    return counts
