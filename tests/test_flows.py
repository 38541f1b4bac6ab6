"""The flows under Prefect's test harness: states, artifacts, overlap, resume."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import psycopg
import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    ArtifactFilterKey,
)
from prefect.client.schemas.sorting import ArtifactSort

from fleet_import.sample_data import fleet_delivery, today_folder
from fleet_import.store.models import BatchStatus
from fleet_import.store.repository import BatchRepository
from flows.drain_publications import drain_publications
from flows.import_s3_folder import import_s3_folder
from flows.resume_publication import resume_publication
from tests.helpers import slice_rows, upload
from tests.prefect_reads import batch_events, latest_artifact

pytestmark = pytest.mark.slow


def run(flow, **parameters):
    """Run a flow in-process; return its final state and flow run."""
    state = flow(**parameters, return_state=True)
    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(state.state_details.flow_run_id)
    return state, flow_run


def artifacts_of(flow_run_id: uuid.UUID) -> dict[str, object]:
    """Each artifact's key (or type) and data."""
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    return {a.key or a.type: a.data for a in artifacts}


def task_run_names(flow_run_id: uuid.UUID, expected: set[str]) -> set[str]:
    """The flow run's task run names, once every prefix in `expected` has one or 30 s have
    passed: task runs reach the API through Prefect's event stream, which may lag the flow's
    end on a busy machine."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    deadline = time.monotonic() + 30
    while True:
        with get_client(sync_client=True) as client:
            runs = client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
            )
        names = {run.name for run in runs}
        found = all(any(name.startswith(prefix) for name in names) for prefix in expected)
        if found or time.monotonic() > deadline:
            return names
        time.sleep(0.2)


def row_versions(database_url: str, table: str) -> list[tuple]:
    with psycopg.connect(database_url) as conn:
        return conn.execute(
            f"SELECT xmin::text, ctid::text FROM curated.{table} ORDER BY 1, 2"
        ).fetchall()


def test_import_succeeds_with_visible_state_and_artifacts(
    flow_env: str, s3, landing_bucket: str
) -> None:
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=80, bad_rows=True))
    state, flow_run = run(import_s3_folder, tenant_id="acme", folder=folder)
    assert state.is_completed() and state.name == "Completed", state.message
    assert "succeeded" in state.message
    assert flow_run.name == "import/acme/2026-07-22"
    assert "tenant:acme" in flow_run.tags and f"scope:fleet_s3:{folder}" in flow_run.tags
    artifacts = artifacts_of(flow_run.id)
    assert {"batch-summary", "batch-rejects", "normalise-progress"} <= set(artifacts)
    # Updated as the COPY's reader thread takes each file: it must still reach the API.
    assert artifacts["normalise-progress"] == 100.0
    (batch,) = BatchRepository(flow_env).list()
    assert batch.status == BatchStatus.SUCCEEDED
    assert batch.delivery_key == f"flow-run:{flow_run.id}"
    tasks = task_run_names(
        flow_run.id,
        {"normalise/trips-1.csv", "normalise/vehicles.csv", "discover", "commit-slice", "publish"},
    )
    assert {"normalise/trips-1.csv", "normalise/vehicles.csv"} <= tasks
    assert {name.rsplit("-", 1)[0] for name in tasks} >= {"discover", "commit-slice", "publish"}


def test_invalid_input_fails_without_a_batch(flow_env: str) -> None:
    state, _ = run(import_s3_folder, tenant_id="Acme!", folder="s3://fleet-landing/x/")
    assert state.is_failed() and "invalid tenant id" in state.message
    assert BatchRepository(flow_env).list() == []


def test_pre_commit_failure_is_a_failed_state_with_the_reason(
    flow_env: str, s3, landing_bucket: str
) -> None:
    folder = today_folder(landing_bucket, "acme")
    files = fleet_delivery(trips=20)
    files["trips-1.csv"] = files["trips-1.csv"].replace(b'"status"', b'"state"', 1)
    upload(s3, folder, files)
    state, flow_run = run(import_s3_folder, tenant_id="acme", folder=folder)
    assert state.is_failed()
    assert state.message.startswith("failed_pre_commit") and "trips-1.csv" in state.message
    assert "batch-failure" in artifacts_of(flow_run.id)


def test_a_reject_ratio_failure_shows_its_rejects_on_the_run(
    flow_env: str, s3, landing_bucket: str
) -> None:
    """Rejects are recorded before the ratio is judged: the failed run's state names the
    file and its first lines, and its artifacts list the rejects."""
    folder = today_folder(landing_bucket, "acme")
    files = fleet_delivery(trips=100)
    files["trips-1.csv"] = files["trips-1.csv"].replace(b"completed", b"exploded")
    upload(s3, folder, files)
    state, flow_run = run(import_s3_folder, tenant_id="acme", folder=folder)
    assert state.is_failed() and "rejected" in state.message
    assert f"{folder}trips-1.csv (first lines " in state.message
    artifacts = artifacts_of(flow_run.id)
    assert "batch-failure" in artifacts
    assert "exploded" in str(artifacts["batch-rejects"])


def test_a_business_failure_runs_quietly_under_a_worker(
    flow_env: str, s3, landing_bucket: str
) -> None:
    """What a process worker runs for a deployment's flow run (`python -m prefect.engine`):
    a bad delivery ends Failed with its reason, and neither the process's output nor the
    run's log in the API says "unexpected exception" or shows a traceback."""
    from pathlib import Path

    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.settings import PREFECT_API_URL

    repo_root = Path(__file__).resolve().parent.parent
    folder = today_folder(landing_bucket, "acme")
    files = fleet_delivery(trips=20)
    upload(s3, folder, dict(files, **{"trips-1.csv": files["trips-1.csv"].replace(b"id", b"x")}))
    with get_client(sync_client=True) as client:
        deployment_id = client.create_deployment(
            flow_id=client.create_flow_from_name("import-s3-folder"),
            name="worker-log",
            entrypoint="flows/import_s3_folder.py:import_s3_folder",
        )
        flow_run = client.create_flow_run_from_deployment(
            deployment_id, parameters={"tenant_id": "acme", "folder": folder}
        )
    env = {
        **os.environ,
        "PREFECT_API_URL": PREFECT_API_URL.value(),
        "PREFECT__FLOW_RUN_ID": str(flow_run.id),
    }
    done = subprocess.run(
        [sys.executable, "-m", "prefect.engine"],
        env=env,
        cwd=repo_root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(flow_run.id).state
        logs = client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run.id]))
        )
    assert state.is_failed() and state.message.startswith("failed_pre_commit: "), state
    assert "failed_pre_commit" in output
    logged = "\n".join(log.message for log in logs)
    for text in (output, logged):
        assert "Traceback" not in text and "unexpected exception" not in text, text


_RUN_IN_CHILD = """
import sys
from flows.import_s3_folder import import_s3_folder
state = import_s3_folder(tenant_id=sys.argv[1], folder=sys.argv[2], return_state=True)
print(f"STATE {state.name}: {state.message}", flush=True)
"""


def test_two_concurrent_runs_on_one_scope(flow_env: str, s3, landing_bucket: str, tmp_path) -> None:
    """Run A (its own process) is held inside its lease until run B has been decided."""
    from prefect.settings import PREFECT_API_URL

    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=200))
    release = tmp_path / "release"
    env = {
        **os.environ,
        "PREFECT_API_URL": PREFECT_API_URL.value(),
        "FLEET_FAILPOINTS": f"after_lease=wait:{release}",
    }
    first = subprocess.Popen(
        [sys.executable, "-c", _RUN_IN_CHILD, "acme", folder],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    repo = BatchRepository(flow_env)
    deadline = time.monotonic() + 120
    while not [b for b in repo.list(status="running") if b.execution_lease_id]:
        assert time.monotonic() < deadline and first.poll() is None, first.communicate()
        time.sleep(0.1)
    (holder,) = repo.list(status="running")

    second, _ = run(import_s3_folder, tenant_id="acme", folder=folder)
    release.touch()
    out, err = first.communicate(timeout=300)
    assert second.name == "Skipped" and str(holder.id) in second.message
    assert f"STATE Completed: batch {holder.id} succeeded" in out, err[-2000:]
    (batch,) = repo.list()
    assert batch.id == holder.id and batch.status == BatchStatus.SUCCEEDED


def test_the_same_delivery_twice_is_one_batch(flow_env: str, s3, landing_bucket: str) -> None:
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=20))
    first, _ = run(import_s3_folder, tenant_id="acme", folder=folder, delivery_key="evt-1")
    assert first.name == "Completed"
    again, _ = run(import_s3_folder, tenant_id="acme", folder=folder, delivery_key="evt-1")
    assert again.name == "Skipped" and "already succeeded" in again.message
    assert len(BatchRepository(flow_env).list()) == 1


def test_publication_failure_then_resume_copies_nothing(
    flow_env: str, s3, landing_bucket: str, monkeypatch
) -> None:
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=30))
    monkeypatch.setenv("FLEET_REFRESH_SQL", '["SELECT 1/0"]')
    state, _ = run(import_s3_folder, tenant_id="acme", folder=folder)
    assert state.is_failed() and state.message.startswith("failed_publication (resumable")
    (batch,) = BatchRepository(flow_env).list()
    assert batch.status == BatchStatus.FAILED
    before = row_versions(flow_env, "fleet_trips")

    monkeypatch.setenv("FLEET_REFRESH_SQL", "[]")
    resumed, _ = run(resume_publication, batch_id=str(batch.id))
    assert resumed.name == "Completed", resumed.message
    assert BatchRepository(flow_env).get(batch.id).status == BatchStatus.SUCCEEDED
    assert row_versions(flow_env, "fleet_trips") == before  # not a row rewritten
    assert slice_rows(flow_env, "fleet_trips", "acme", folder) == [(batch.id, 30)]


def test_a_batch_story_follows_it_from_import_to_resume(
    flow_env: str, s3, landing_bucket: str, monkeypatch
) -> None:
    """`batch-<id>` is the batch's truth whichever run changed it last, and the import
    run's page shows the resume that finished it; the tenant's table lists the batch."""
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=80, bad_rows=True))
    monkeypatch.setenv("FLEET_REFRESH_SQL", '["SELECT 1/0"]')
    failed, import_run = run(import_s3_folder, tenant_id="acme", folder=folder)
    assert failed.is_failed()
    (batch,) = BatchRepository(flow_env).list()
    key = f"batch-{batch.id}"
    assert batch.details["flow_run_id"] == str(import_run.id)
    story = str(latest_artifact(key))
    assert f"# batch {batch.id}: failed (failed\\_publication)" in story
    assert f"[import/acme/2026-07-22](/runs/flow-run/{import_run.id})" in story
    assert "division by zero" in story

    monkeypatch.setenv("FLEET_REFRESH_SQL", "[]")
    resumed, resume_run = run(resume_publication, batch_id=str(batch.id))
    assert resumed.name == "Completed", resumed.message
    story = str(latest_artifact(key))
    assert f"# batch {batch.id}: succeeded (resumed)" in story
    assert f"(/runs/flow-run/{resume_run.id})" in story  # the run that finished it
    assert "failure before the resume" in story and "division by zero" in story
    # The import run's own page shows the news: a version of the story is attached to it.
    with get_client(sync_client=True) as client:
        on_import_run = client.read_artifacts(
            artifact_filter=ArtifactFilter(
                flow_run_id=ArtifactFilterFlowRunId(any_=[import_run.id]),
                key=ArtifactFilterKey(any_=[key]),
            ),
            sort=ArtifactSort.CREATED_DESC,
        )
    assert "succeeded (resumed)" in on_import_run[0].data

    (row,) = latest_artifact("tenant-acme-batches")
    assert row["batch"] == str(batch.id) and row["status"] == "succeeded (resumed)"
    assert row["rows"] == sum(batch.details["row_counts"].values()) > 0
    assert row["rejects"] == batch.details["rejects"]["count"] > 0
    assert row["owns slice"] == "yes" and str(import_run.id) in row["run"]

    events = batch_events(batch.id, expected=3)  # running, failed, succeeded (resumed)
    assert {e.payload["status"] for e in events} >= {
        "failed (failed_publication)",
        "succeeded (resumed)",
    }
    for event in events:
        assert f"prefect.flow-run.{import_run.id}" in {r.id for r in event.related}


def test_resume_is_refused_when_a_newer_batch_owns_the_slice(
    flow_env: str, s3, landing_bucket: str, monkeypatch
) -> None:
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=30))
    monkeypatch.setenv("FLEET_REFRESH_SQL", '["SELECT 1/0"]')
    failed, _ = run(import_s3_folder, tenant_id="acme", folder=folder)
    assert failed.is_failed()
    (old,) = BatchRepository(flow_env).list()
    newer_failed, _ = run(import_s3_folder, tenant_id="acme", folder=folder)
    assert newer_failed.is_failed()  # it owns the slice, yet retired nothing
    newer = next(b for b in BatchRepository(flow_env).list() if b.id != old.id)

    refused, _ = run(resume_publication, batch_id=str(old.id))
    assert refused.is_failed() and refused.name == "NotResumable", refused
    assert "expired" in refused.message and str(newer.id) in refused.message
    assert BatchRepository(flow_env).get(old.id) == old  # status, failure, resumes: untouched
    assert "division by zero" in old.details["failure"]["error"]

    monkeypatch.setenv("FLEET_REFRESH_SQL", "[]")
    resumed, _ = run(resume_publication, batch_id=str(newer.id))
    assert resumed.name == "Completed", resumed.message
    superseded = BatchRepository(flow_env).get(old.id)
    assert superseded is not None and superseded.details["superseded_by"] == str(newer.id)
    assert superseded.details["failure"] == old.details["failure"]
    refused, _ = run(resume_publication, batch_id=str(old.id))
    assert refused.name == "NotResumable" and "superseded" in refused.message
    assert BatchRepository(flow_env).get(old.id) == superseded
    # The resume that superseded it told the old batch's story too.
    assert str(latest_artifact(f"batch-{old.id}")).startswith(f"# batch {old.id}: superseded")
    statuses = {r["batch"]: r["status"] for r in latest_artifact("tenant-acme-batches")}
    assert statuses == {str(old.id): "superseded", str(newer.id): "succeeded (resumed)"}


def test_an_expiry_found_while_resuming_ends_not_resumable(flow_env: str, monkeypatch) -> None:
    """A batch that died after its commit is still running, so its stamp is read only once
    it is leased; a newer owner found then refuses the resume like any other."""
    from fleet_import.importing.context import Failed
    from fleet_import.store.details import FailureKind

    batch_id = uuid.uuid4()
    expired = Failed(batch_id, FailureKind.FAILED_PUBLICATION, "publication expired", expired=True)
    monkeypatch.setattr("flows.resume_publication.resume_batch", lambda *a, **k: expired)
    state, _ = run(resume_publication, batch_id=str(batch_id))
    assert state.is_failed() and state.name == "NotResumable"
    assert state.message == "publication expired"


def test_drain_finishes_committed_batches(flow_env: str, s3, landing_bucket: str) -> None:
    state = drain_publications(limit=10, return_state=True)
    assert state.is_completed()
    assert state.result() == {}


def test_a_drain_tells_the_story_of_the_batch_it_published(
    flow_env: str, s3, landing_bucket: str
) -> None:
    """An import dies right after its commit (its own process, killed by a failpoint); the
    drain that publishes the batch updates `batch-<id>` and links itself from it."""
    from prefect.settings import PREFECT_API_URL

    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=20))
    env = {
        **os.environ,
        "PREFECT_API_URL": PREFECT_API_URL.value(),
        "FLEET_FAILPOINTS": "after_operational_commit",
        "FLEET_LEASE_TTL_SECONDS": "1",  # free for the drain a second after the death
    }
    died = subprocess.run(
        [sys.executable, "-c", _RUN_IN_CHILD, "acme", folder],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert died.returncode == 86, died.stdout + died.stderr[-2000:]
    (batch,) = BatchRepository(flow_env).list()
    assert batch.status == BatchStatus.RUNNING and batch.details["warehouse_committed"]
    time.sleep(1.5)  # its lease expires

    state, drain_run = run(drain_publications, limit=10)
    assert state.is_completed() and sum(state.result().values()) == 1, state.result()
    story = str(latest_artifact(f"batch-{batch.id}"))
    assert story.startswith(f"# batch {batch.id}: succeeded\n")
    assert f"(/runs/flow-run/{drain_run.id})" in story
    assert f"(/runs/flow-run/{batch.details['flow_run_id']})" in story  # made by the import


def test_rerun_of_a_failed_delivery_starts_a_fresh_batch(
    flow_env: str, s3, landing_bucket: str
) -> None:
    """A UI rerun keeps the flow run (so the delivery key); after a failure it must load."""
    folder = today_folder(landing_bucket, "acme")
    files = fleet_delivery(trips=20)
    broken = dict(files, **{"trips-1.csv": files["trips-1.csv"].replace(b'"status"', b'"x"', 1)})
    upload(s3, folder, broken)
    failed, _ = run(import_s3_folder, tenant_id="acme", folder=folder, delivery_key="run-1")
    assert failed.is_failed()
    upload(s3, folder, files)
    rerun, _ = run(import_s3_folder, tenant_id="acme", folder=folder, delivery_key="run-1")
    assert rerun.name == "Completed", rerun.message
    statuses = sorted(b.status.value for b in BatchRepository(flow_env).list())
    assert statuses == ["failed", "succeeded"]


def test_a_retry_that_replaces_a_failed_publication_tells_both_stories(
    flow_env: str, s3, landing_bucket: str, monkeypatch
) -> None:
    """The UI's Retry (same delivery key) loads a new batch after a failed publication: the
    old batch's story says it is superseded, and by which batch; the tenant's table shows
    which of the two owns the slice."""
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=20))
    monkeypatch.setenv("FLEET_REFRESH_SQL", '["SELECT 1/0"]')
    failed, _ = run(import_s3_folder, tenant_id="acme", folder=folder, delivery_key="run-1")
    assert failed.is_failed()
    (old,) = BatchRepository(flow_env).list()
    monkeypatch.setenv("FLEET_REFRESH_SQL", "[]")
    retried, _ = run(import_s3_folder, tenant_id="acme", folder=folder, delivery_key="run-1")
    assert retried.name == "Completed", retried.message
    new = next(b for b in BatchRepository(flow_env).list() if b.id != old.id)
    story = str(latest_artifact(f"batch-{old.id}"))
    assert story.startswith(f"# batch {old.id}: superseded\n")
    assert f"superseded by**: batch {new.id}" in story and "division by zero" in story
    owners = {r["batch"]: r["owns slice"] for r in latest_artifact("tenant-acme-batches")}
    assert owners == {str(new.id): "yes", str(old.id): f"no: batch {str(new.id)[:8]}"}


def test_the_event_sink_hands_prefect_the_payloads_event_id(prefect_api, monkeypatch) -> None:
    """A repeated notify step repeats `fleet.slice.published` with the same id, which
    Prefect stores once; events without one get Prefect's random id. Prefect's own
    recording events client stands in for its event stream."""
    from prefect.events.clients import AssertingEventsClient
    from prefect.events.worker import EventsWorker

    from fleet_import.publication.publisher import published_event_id
    from flows.common import prefect_event_sink

    worker = EventsWorker.instance(AssertingEventsClient)
    monkeypatch.setattr(EventsWorker, "instance", lambda *_: worker)
    batch_id = uuid.uuid4()
    event_id = published_event_id(batch_id)
    payload = {"tenant_id": "acme", "batch_id": str(batch_id), "event_id": str(event_id)}
    # One at a time, as repeats come (from another attempt): Prefect's events worker keys
    # what it holds in flight by event id.
    for name, sent in (
        ("fleet.slice.published", payload),
        ("fleet.slice.published", payload),
        ("fleet.batch.published", {"batch_id": str(batch_id)}),
    ):
        prefect_event_sink(name, sent)
        worker.wait_until_empty()
    worker.drain()
    events = [e for e in AssertingEventsClient.last.events if e.event.startswith("fleet.")]
    assert [e.event for e in events] == ["fleet.slice.published"] * 2 + ["fleet.batch.published"]
    assert events[0].id == events[1].id == event_id
    assert events[2].id != event_id
    assert events[0].resource.id == f"fleet.batch.{batch_id}"
