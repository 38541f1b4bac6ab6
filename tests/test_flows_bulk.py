"""The bulk import (issue 50) under Prefect's test harness: one flow run imports many
deliveries, each a task run of its own whose state is its outcome; one failing or held never
fails its siblings; a shard and a per-folder run of one folder never load it twice at once."""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterTaskRunId,
    FlowRunFilter,
    FlowRunFilterId,
)

from fleet_import import failpoints
from fleet_import.sample_data import csv_bytes, fleet_delivery, today_folder, trips_table
from fleet_import.store.models import BatchStatus
from fleet_import.store.repository import BatchRepository
from flows.bulk_import import bulk_import
from flows.import_s3_folder import import_s3_folder
from tests.helpers import slice_rows, upload
from tests.importing.guard_helpers import redeliver

pytestmark = pytest.mark.slow


def _delivery(tenant: str, folder: str, key: str | None = None) -> dict[str, str]:
    return {"tenant_id": tenant, "folder": folder, "delivery_key": key or f"test:{uuid.uuid4()}"}


def _task_runs(flow_run_id: uuid.UUID, count: int) -> dict[str, object]:
    """The shard's delivery task runs by name, once `count` of them reached the API (task
    runs arrive through Prefect's event stream, which may lag the flow's end)."""
    deadline = time.monotonic() + 30
    while True:
        with get_client(sync_client=True) as client:
            runs = client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
            )
        ended = {r.name: r for r in runs if r.name.startswith("import/") and r.state.is_final()}
        if len(ended) >= count or time.monotonic() > deadline:
            return ended
        time.sleep(0.2)


def _artifact_keys(task_run_id: uuid.UUID) -> set[str]:
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(task_run_id=ArtifactFilterTaskRunId(any_=[task_run_id]))
        )
    return {a.key for a in artifacts if a.key}


def test_a_shard_with_a_failing_and_a_held_delivery_publishes_its_siblings(
    flow_env: str, s3, landing_bucket: str
) -> None:
    good = [today_folder(landing_bucket, tenant) for tenant in ("acme", "umbrella")]
    for folder in good:
        upload(s3, folder, fleet_delivery(trips=40))
    broken = today_folder(landing_bucket, "globex")
    files = fleet_delivery(trips=20)
    files["trips-1.csv"] = files["trips-1.csv"].replace(b'"status"', b'"state"', 1)
    upload(s3, broken, files)
    held = today_folder(landing_bucket, "initech")
    upload(s3, held, fleet_delivery(trips=400))
    first = import_s3_folder(tenant_id="initech", folder=held, return_state=True)
    assert first.name == "Completed", first.message
    redeliver(s3, held, {"trips-1.csv": csv_bytes(trips_table(10))})  # 400 -> 10 rows: held

    deliveries = [
        _delivery("acme", good[0]),
        _delivery("globex", broken),
        _delivery("initech", held),
        _delivery("umbrella", good[1]),
    ]
    state = bulk_import(deliveries=deliveries, return_state=True)
    assert state.is_completed(), state.message
    assert state.result() == {"deliveries": 4, "Completed": 2, "Failed": 1, "Held": 1}

    runs = _task_runs(state.state_details.flow_run_id, 4)
    by_name = {name: run.state for name, run in runs.items()}
    assert set(by_name) == {
        "import/acme/2026-07-22",
        "import/globex/2026-07-22",
        "import/initech/2026-07-22",
        "import/umbrella/2026-07-22",
    }
    assert by_name["import/acme/2026-07-22"].name == "Completed"
    assert by_name["import/umbrella/2026-07-22"].name == "Completed"
    assert by_name["import/initech/2026-07-22"].name == "Held"
    assert by_name["import/globex/2026-07-22"].is_failed()
    assert "failed_pre_commit" in by_name["import/globex/2026-07-22"].message
    # Each delivery's batch artifact and story are on its own task run.
    for name, run in runs.items():
        keys = _artifact_keys(run.id)
        assert "batch-summary" in keys and any(k.startswith("batch-") for k in keys), (name, keys)
    assert "batch-failure" in _artifact_keys(runs["import/globex/2026-07-22"].id)

    repo = BatchRepository(flow_env)
    assert repo.list(status=BatchStatus.RUNNING) == []
    for tenant, folder in (("acme", good[0]), ("umbrella", good[1])):
        [(stamp, rows)] = slice_rows(flow_env, "fleet_trips", tenant, folder)
        (batch,) = repo.list(tenant=tenant)
        assert batch.status == BatchStatus.SUCCEEDED and batch.id == stamp and rows == 40
        assert batch.details["flow_run_id"] == str(state.state_details.flow_run_id)
    # The held delivery left the slice as it was.
    assert [rows for _, rows in slice_rows(flow_env, "fleet_trips", "initech", held)] == [400]


@pytest.mark.parametrize("first", ["event", "bulk"])
def test_a_shard_and_an_event_run_of_one_folder_never_load_it_twice_at_once(
    first: str, flow_env: str, s3, landing_bucket: str, tmp_path: Path, monkeypatch
) -> None:
    """The S3 trigger's run (its event key) and a shard's delivery (the sweep's key) of the
    same folder: whichever reserves the scope first loads it while the other finds it busy
    (Skipped), and once loaded the other finds it loaded. One batch, one slice."""
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=30))
    event_key, sweep_key = f"s3-event:{uuid.uuid4()}", f"sweep:{uuid.uuid4().hex}"

    def event_run():
        return import_s3_folder(
            tenant_id="acme", folder=folder, delivery_key=event_key, return_state=True
        )

    def bulk_run():
        state = bulk_import(deliveries=[_delivery("acme", folder, sweep_key)], return_state=True)
        [run] = _task_runs(state.state_details.flow_run_id, 1).values()
        return run.state

    runs = {"event": event_run, "bulk": bulk_run}
    second = "bulk" if first == "event" else "event"
    release = tmp_path / "release"
    monkeypatch.setattr(failpoints, "_ACTIVE", {"after_reserve": f"wait:{release}"})
    repo = BatchRepository(flow_env)
    with ThreadPoolExecutor(max_workers=1) as pool:
        holder = pool.submit(runs[first])
        deadline = time.monotonic() + 60
        while not repo.list(tenant="acme", status=BatchStatus.RUNNING):
            assert time.monotonic() < deadline, f"the {first} run never reserved the scope"
            time.sleep(0.05)
        busy = runs[second]()
        assert busy.name == "Skipped", busy.message
        release.touch()
        loaded = holder.result(timeout=180)
    assert loaded.name == "Completed", loaded.message
    again = runs[second]()
    assert again.name == "AlreadyLoaded", again.message

    [batch] = repo.list(tenant="acme")
    assert batch.status == BatchStatus.SUCCEEDED
    assert batch.delivery_key == (event_key if first == "event" else sweep_key)
    assert slice_rows(flow_env, "fleet_trips", "acme", folder) == [(batch.id, 30)]


def test_a_sharded_sweep_starts_at_most_n_bulk_runs_once_however_often_it_runs(
    flow_env: str, s3, landing_bucket: str
) -> None:
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    from flows.sweep_landing_zone import sweep_landing_zone

    name = f"bulk-{uuid.uuid4().hex[:8]}"
    deployment_id = bulk_import.to_deployment(name=name).apply()
    folders = {
        tenant: today_folder(landing_bucket, tenant) for tenant in ("acme", "globex", "initech")
    }
    for folder in folders.values():
        upload(s3, folder, {**fleet_delivery(trips=10), "_SUCCESS": b""})
    parameters = {
        "bucket": landing_bucket,
        "lookback_days": 0,
        "shards": 2,
        "bulk_deployment": f"bulk-import/{name}",
    }
    # No worker runs the shards: the second sweep plans the same deliveries again, as a
    # sweep overlapping a slow shard would, and must find the same two runs.
    for _ in range(2):
        state = sweep_landing_zone(**parameters, return_state=True)
        assert state.is_completed(), state.message
        assert state.result() == {"ready": 3, "started": 3, "skipped": 0, "shards": 2}
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id]))
        )
    assert len(runs) == 2
    deliveries = [d for run in runs for d in run.parameters["deliveries"]]
    assert sorted((d["tenant_id"], d["folder"]) for d in deliveries) == sorted(folders.items())
    assert all(d["delivery_key"].startswith("sweep:") for d in deliveries)
    for run in runs:
        assert run.idempotency_key.startswith("bulk:")
        assert run.parent_task_run_id is None  # not a subflow: outlives the sweep


def test_a_load_limit_deleted_after_this_process_saw_it_is_made_again(prefect_api) -> None:
    """A bulk import's loads ask whether the limits exist once per process, not per load;
    a limit deleted since is made again, and the load still takes its slot."""
    from prefect.exceptions import ObjectNotFound

    from blocks.limits import tenant_limit
    from fleet_import.config import Settings
    from flows.common import warehouse_load_slots

    tenant = f"t{uuid.uuid4().hex[:8]}"
    settings = Settings(warehouse_load_slots=0, tenant_load_slots=1)
    with warehouse_load_slots(tenant, settings):
        pass
    with get_client(sync_client=True) as client:
        client.delete_global_concurrency_limit_by_name(tenant_limit(tenant))
        with pytest.raises(ObjectNotFound):
            client.read_global_concurrency_limit_by_name(tenant_limit(tenant))
    with warehouse_load_slots(tenant, settings):
        with get_client(sync_client=True) as client:
            limit = client.read_global_concurrency_limit_by_name(tenant_limit(tenant))
        assert limit.limit == 1 and limit.active_slots == 1
