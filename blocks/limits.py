"""The Prefect limits that keep warehouse loads bounded and fair, and the backfill queue.

Correctness never depends on them (one running batch per scope lives in PostgreSQL); they
only throttle:

- global concurrency limit `fleet-warehouse-loads`: slice loads at once on all workers
  (FLEET_WAREHOUSE_LOAD_SLOTS);
- global concurrency limit `fleet-load-tenant-<id>`: slice loads at once of one tenant
  (FLEET_TENANT_LOAD_SLOTS), so one tenant's backfill leaves slots to the others;
- work queue `backfill` of the work pool, priority 10: a worker takes a backfill run only
  when no fresh delivery's run waits in `default` (priority 1).

`ensure_limits` (run by `python -m blocks.register`) creates the global limit and the
queue, and re-sizes the limit to the settings; a tenant's limit is created by its first
load (`ensure_limit`), with the size the loading worker's settings give, and never re-sized
there, so a size set in the UI stays.
"""

from __future__ import annotations

from typing import Any

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

from fleet_import.config import Settings

WAREHOUSE_LOADS_LIMIT = "fleet-warehouse-loads"
TENANT_LIMIT_PREFIX = "fleet-load-tenant-"
WORK_POOL = "fleet-process-pool"
# Fresh deliveries run from the pool's `default` queue (priority 1); backfills from this
# one, which a worker serves only when no fresh run waits (lower number = served first).
BACKFILL_QUEUE = "backfill"
BACKFILL_QUEUE_PRIORITY = 10


def tenant_limit(tenant_id: str) -> str:
    return f"{TENANT_LIMIT_PREFIX}{tenant_id}"


def ensure_limit(name: str, size: int, client: Any | None = None) -> bool:
    """Create the global concurrency limit `name` with `size` slots unless it exists; True
    if this call created it. Two workers racing to create it both succeed."""
    if client is None:
        with get_client(sync_client=True) as own:
            return ensure_limit(name, size, own)
    try:
        client.read_global_concurrency_limit_by_name(name)
        return False
    except ObjectNotFound:
        pass
    try:
        client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=size))
    except ObjectAlreadyExists:
        return False
    return True


def ensure_limits(settings: Settings, work_pool: str = WORK_POOL) -> list[str]:
    """Create or re-size the global load limit, and create or re-prioritise the backfill
    queue when the work pool exists. Returns what it did, one line each."""
    done = []
    with get_client(sync_client=True) as client:
        client.upsert_global_concurrency_limit_by_name(
            WAREHOUSE_LOADS_LIMIT, settings.warehouse_load_slots
        )
        done.append(
            f"concurrency limit {WAREHOUSE_LOADS_LIMIT}: {settings.warehouse_load_slots} slots"
        )
        try:
            client.read_work_pool(work_pool)
        except ObjectNotFound:
            done.append(f"work pool {work_pool} not found: no {BACKFILL_QUEUE} queue made")
            return done
        try:
            queue = client.read_work_queue_by_name(BACKFILL_QUEUE, work_pool_name=work_pool)
        except ObjectNotFound:
            client.create_work_queue(
                BACKFILL_QUEUE, work_pool_name=work_pool, priority=BACKFILL_QUEUE_PRIORITY
            )
        else:
            if queue.priority != BACKFILL_QUEUE_PRIORITY:
                client.update_work_queue(queue.id, priority=BACKFILL_QUEUE_PRIORITY)
        done.append(
            f"work queue {work_pool}/{BACKFILL_QUEUE}: priority {BACKFILL_QUEUE_PRIORITY}"
        )
    return done
