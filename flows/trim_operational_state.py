"""trim_operational_state: the operational store's own rows trimmed on a schedule (issue 50).

Thin: what is trimmed, and what is never, is `fleet_import.store.state_retention`'s rule.
Prefect's own flow runs, logs and artifacts are trimmed by the Prefect server's vacuum
service (docs/operating.md, "State that does not pile up"), not here.
"""

from __future__ import annotations

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact

from fleet_import.store.state_retention import StateRetention
from flows.common import load_settings
from flows.reporting import fails_with_one_line

SECONDS_PER_DAY = 24 * 3600


@flow(name="trim-operational-state", retries=0)
@fails_with_one_line
def trim_operational_state(older_than_days: float | None = None) -> dict[str, int]:
    """Delete the outbox steps of batches that succeeded, and delivered lineage events of
    finished batches, older than the retention; compact those succeeded batches' details
    (their per-file summary and rejects sample). What a resume, rollback, review or the
    freshness check reads is kept.

    Args:
        older_than_days: Trim what ended this many days ago or earlier. Unset: the
            FLEET_STATE_RETAIN_DAYS setting (30).
    """
    settings = load_settings()
    days = settings.state_retain_days if older_than_days is None else older_than_days
    store = StateRetention.from_settings(settings)
    before = store.table_bytes()
    trimmed = store.trim(days * SECONDS_PER_DAY)
    after = store.table_bytes()
    counts = {
        "outbox_rows": trimmed.outbox_rows,
        "lineage_rows": trimmed.lineage_rows,
        "compacted_batches": trimmed.compacted_batches,
    }
    description = f"trimmed what ended {days:g} days ago or earlier: " + ", ".join(
        f"{n} {what}" for what, n in counts.items()
    )
    create_table_artifact(
        [
            {"table": name, "bytes before": before.get(name, 0), "bytes after": after.get(name, 0)}
            for name in sorted(before)
        ],
        key="operational-state-size",
        description=description + " (sizes on disk: space is reused, not returned to the OS)",
    )
    get_run_logger().info(description)
    return counts
