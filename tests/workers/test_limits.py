"""The Prefect limits on warehouse loads (issue 16, item 2), under Prefect's test harness:
setup creates and sizes them, a load holds a slot of each while its slice commits, and a
missing one is created by the first load that needs it."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

import pytest
from prefect.client.orchestration import get_client
from prefect.exceptions import ObjectNotFound

from blocks.limits import (
    BACKFILL_QUEUE,
    BACKFILL_QUEUE_PRIORITY,
    WAREHOUSE_LOADS_LIMIT,
    ensure_limits,
    tenant_limit,
)
from fleet_import import failpoints
from fleet_import.config import Settings
from fleet_import.sample_data import fleet_delivery, today_folder
from flows.import_s3_folder import import_s3_folder
from tests.helpers import upload

pytestmark = pytest.mark.slow

_WAIT_SECONDS = 60.0


def _limit(name: str):
    with get_client(sync_client=True) as client:
        try:
            return client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            return None


def _delete(name: str) -> None:
    with get_client(sync_client=True) as client, contextlib.suppress(ObjectNotFound):
        client.delete_global_concurrency_limit_by_name(name)


def _until(predicate, what: str) -> None:
    deadline = time.monotonic() + _WAIT_SECONDS
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_setup_creates_and_resizes_the_load_limit_and_the_backfill_queue(prefect_api) -> None:
    pool = "fleet-limits-test-pool"
    with get_client(sync_client=True) as client:
        from prefect.client.schemas.actions import WorkPoolCreate

        client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
    _delete(WAREHOUSE_LOADS_LIMIT)

    done = ensure_limits(Settings(warehouse_load_slots=3), work_pool=pool)

    assert _limit(WAREHOUSE_LOADS_LIMIT).limit == 3
    assert f"work queue {pool}/{BACKFILL_QUEUE}: priority {BACKFILL_QUEUE_PRIORITY}" in done
    ensure_limits(Settings(warehouse_load_slots=5), work_pool=pool)  # re-run: re-sized
    assert _limit(WAREHOUSE_LOADS_LIMIT).limit == 5
    with get_client(sync_client=True) as client:
        queue = client.read_work_queue_by_name(BACKFILL_QUEUE, work_pool_name=pool)
        default = client.read_work_queue_by_name("default", work_pool_name=pool)
    assert queue.priority == BACKFILL_QUEUE_PRIORITY > default.priority
    assert "not found" in ensure_limits(Settings(), work_pool="no-such-pool")[-1]


def test_a_load_holds_a_slot_of_each_limit_while_it_commits(
    flow_env: str, s3, landing_bucket: str, tmp_path: Path, monkeypatch
) -> None:
    """The import waits at `before_warehouse_commit` (its slice loaded, not committed): both
    limits then show the slot it holds; once it commits, the slots are free again. The
    tenant's limit did not exist before: the load created it, sized by the settings."""
    tenant = "limits-acme"
    _delete(tenant_limit(tenant))
    monkeypatch.setenv("FLEET_WAREHOUSE_LOAD_SLOTS", "3")
    monkeypatch.setenv("FLEET_TENANT_LOAD_SLOTS", "1")
    release = tmp_path / "release"
    monkeypatch.setattr(failpoints, "_ACTIVE", {"before_warehouse_commit": f"wait:{release}"})
    folder = today_folder(landing_bucket, tenant)
    upload(s3, folder, fleet_delivery(trips=20))
    _delete(WAREHOUSE_LOADS_LIMIT)  # missing too: created with FLEET_WAREHOUSE_LOAD_SLOTS

    states = []
    run = threading.Thread(
        target=lambda: states.append(
            import_s3_folder(tenant_id=tenant, folder=folder, return_state=True)
        )
    )
    run.start()
    try:
        _until(
            lambda: (
                (_limit(tenant_limit(tenant)) or _limit(WAREHOUSE_LOADS_LIMIT)) is not None
                and all(
                    (limit := _limit(name)) is not None and limit.active_slots == 1
                    for name in (WAREHOUSE_LOADS_LIMIT, tenant_limit(tenant))
                )
            ),
            "the load to hold both slots",
        )
        assert _limit(tenant_limit(tenant)).limit == 1
        assert _limit(WAREHOUSE_LOADS_LIMIT).limit == 3
        assert run.is_alive()
    finally:
        release.touch()
        run.join(timeout=_WAIT_SECONDS)
    [state] = states
    assert state.is_completed(), state.message
    assert _limit(WAREHOUSE_LOADS_LIMIT).active_slots == 0
    assert _limit(tenant_limit(tenant)).active_slots == 0


def test_a_tenant_with_its_slots_taken_waits_without_taking_a_global_slot(
    flow_env: str, s3, landing_bucket: str, monkeypatch
) -> None:
    """Fairness: while the tenant's one slot is held (its backfill), the tenant's next
    load waits, and waits holding no slot of the global limit, which stays free for the
    other tenants; once the slot frees, the load goes on."""
    from prefect.concurrency.sync import concurrency

    from blocks.limits import ensure_limit

    tenant = "limits-busy"
    monkeypatch.setenv("FLEET_WAREHOUSE_LOAD_SLOTS", "4")
    monkeypatch.setenv("FLEET_TENANT_LOAD_SLOTS", "1")
    _delete(tenant_limit(tenant))
    ensure_limit(tenant_limit(tenant), 1)
    ensure_limit(WAREHOUSE_LOADS_LIMIT, 4)
    folder = today_folder(landing_bucket, tenant)
    upload(s3, folder, fleet_delivery(trips=20))
    states = []
    with concurrency(tenant_limit(tenant), occupy=1, strict=True):
        run = threading.Thread(
            target=lambda: states.append(
                import_s3_folder(tenant_id=tenant, folder=folder, return_state=True)
            )
        )
        run.start()
        time.sleep(8)  # time enough to claim, discover and ask for the slots
        assert run.is_alive() and not states
        assert _limit(WAREHOUSE_LOADS_LIMIT).active_slots == 0
        assert _limit(tenant_limit(tenant)).active_slots == 1  # ours, not the load's
    run.join(timeout=_WAIT_SECONDS)
    [state] = states
    assert state.is_completed(), state.message
