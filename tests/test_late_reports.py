"""flows.late_reports: the next import of a folder tells an earlier run of it, whose end the
Prefect API never heard, how its batch ended (issue #26), under Prefect's test harness."""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any, cast

from prefect import flow
from prefect.client.orchestration import get_client
from prefect.states import Running

from fleet_import.importing.runtime import Runtime
from fleet_import.store.models import Reserved
from flows.late_reports import tell_unreported_runs
from tests.contract.batches import ACME, SCOPE, TTL
from tests.fakes.state import MemoryStore
from tests.fakes.store import MemoryBatchRepository

OTHER_FOLDERS = 25
"""More of the tenant's folders delivered since than the folder's runs looked at (20)."""


def _succeeded(repo: MemoryBatchRepository, scope: str, key: str, **details: Any) -> uuid.UUID:
    outcome = repo.reserve(ACME, scope, key)
    assert isinstance(outcome, Reserved), outcome
    batch_id = outcome.batch.id
    repo.acquire_lease(batch_id, "w1", TTL)
    repo.mark_committed(batch_id, "w1", row_counts={"trips": 3}, patch=details)
    repo.mark_succeeded(batch_id, "w1")
    return batch_id


@flow(name="import-s3-folder")
def _earlier_run() -> None:
    """Stands for the earlier run: only its flow run, left Running, is made."""


def test_an_unreported_run_is_told_however_many_folders_came_since(prefect_api: None) -> None:
    """Before, only the tenant's 20 newest batches were looked at: a tenant delivering more
    than 20 other folders between two runs of one folder left its run Running for good."""
    memory = MemoryStore()
    memory.clock.advance(-2 * TTL)  # every batch ended over a lease TTL ago
    repo = MemoryBatchRepository(memory)
    with get_client(sync_client=True) as client:
        unreported = client.create_flow_run(_earlier_run, state=Running())
        batch_id = _succeeded(repo, SCOPE, "d1", flow_run_id=str(unreported.id))
        for number in range(OTHER_FOLDERS):
            scope = f"fleet_s3:s3://fleet-landing/acme/fleet/2026-08-{number + 1:02d}/"
            _succeeded(repo, scope, f"other-{number}")
        rt = cast(Runtime, SimpleNamespace(ctx=SimpleNamespace(repo=repo, lease_ttl=TTL)))
        tell_unreported_runs(rt, ACME.tenant_id, SCOPE)
        state = client.read_flow_run(unreported.id).state
    assert state is not None
    assert (state.type.value, state.message) == (
        "COMPLETED",
        f"batch {batch_id} succeeded (told by flow run None: this run's own end never "
        "reached the Prefect API)",
    )
