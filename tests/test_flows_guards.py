"""Slice guards and review under Prefect's test harness (issue #24): a held import ends in
the `Held` state (exit code 6), the approve-held-batch flow loads the held content, and a
changed folder is not approved."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import pytest

from fleet_import.importing.guards import HELD_EVENT
from fleet_import.publication.decisions import ROLLED_BACK_EVENT
from fleet_import.sample_data import csv_bytes, fleet_delivery, today_folder, trips_table
from fleet_import.store.models import BatchStatus
from fleet_import.store.repository import BatchRepository
from flows.approve_held_batch import approve_held_batch
from flows.import_s3_folder import import_s3_folder
from flows.reporting import ExitCode, exit_code_for
from flows.rollback_slice import rollback_slice
from flows.story import held_facts, story_key, tenant_key
from tests.helpers import slice_rows, upload
from tests.importing.guard_helpers import redeliver, slice_snapshot
from tests.prefect_reads import batch_events, latest_artifact
from tests.warehouse_helpers import REDSHIFT_IN_E2E

pytestmark = pytest.mark.slow


@contextlib.contextmanager
def errors_logged(*logger_names: str) -> Iterator[list[str]]:
    """What these loggers log at ERROR or above meanwhile (Prefect's loggers do not
    propagate to pytest's capture)."""
    messages: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(f"{record.name}: {record.getMessage()}")

    handler = Collect(level=logging.ERROR)
    loggers = [logging.getLogger(name) for name in logger_names]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield messages
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


@pytest.mark.parametrize("warehouse", REDSHIFT_IN_E2E, indirect=True)
def test_a_held_import_then_its_approval_under_prefect(
    flow_env: str, s3, landing_bucket: str
) -> None:
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=400))
    first = import_s3_folder(tenant_id="acme", folder=folder, return_state=True)
    assert first.name == "Completed", first.message
    before = slice_snapshot(flow_env, folder)

    redeliver(s3, folder, {"trips-1.csv": csv_bytes(trips_table(10))})
    with errors_logged("prefect.task_runs", "prefect.flow_runs") as errors:
        held = import_s3_folder(tenant_id="acme", folder=folder, return_state=True)
    assert held.name == "Held" and held.is_failed(), held.message
    assert errors == []  # a hold is no error: no task run logs one
    assert exit_code_for(held) == ExitCode.HELD == 6
    assert "trips would go from 400 rows to 10" in held.message
    assert "min_rows_ratio 0.5" in held.message
    repo = BatchRepository(flow_env)
    assert repo.list(status="running") == []
    (held_batch,) = repo.list(status="failed")
    assert f"batches approve {held_batch.id}" in held.message
    assert slice_snapshot(flow_env, folder) == before
    facts = dict(held_facts(held_batch))
    assert "trips would go from 400 rows to 10 (min\\_rows\\_ratio 0.5)" in facts["held: trips"]
    assert f"batches approve {held_batch.id}" in facts["approve"]
    # Told: the batch's story and the tenant's table show both counts and the command, a
    # fleet.batch.held event carries them.
    approve = f"fleet-import batches approve {held_batch.id}"
    story = str(latest_artifact(story_key(held_batch.id)))
    assert story.startswith(f"# batch {held_batch.id}: held (awaiting review)"), story
    assert "**held: trips**: trips would go from 400 rows to 10" in story
    assert f"`{approve}`" in story
    rows = {r["batch"]: r for r in latest_artifact(tenant_key("acme"))}
    held_text = "trips would go from 400 rows to 10 (min_rows_ratio 0.5)"
    assert rows[str(held_batch.id)]["held"] == held_text
    assert rows[str(held_batch.id)]["to approve"] == approve
    assert rows[str(held_batch.id)]["status"] == "held (awaiting review)"
    (event,) = batch_events(held_batch.id, expected=1, name=HELD_EVENT)
    assert event.payload["approve"] == approve
    assert event.payload["breaches"] == [
        {"dataset": "trips", "current_rows": 400, "new_rows": 10, "rule": "min_rows_ratio 0.5"}
    ]

    # A per-run override lets the same content through, as the UI's parameters would.
    lowered = import_s3_folder(
        tenant_id="acme", folder=folder, min_rows_ratio=0.01, return_state=True
    )
    assert lowered.name == "Completed", lowered.message
    rows = slice_rows(flow_env, "fleet_trips", "acme", folder)
    assert rows[0][1] == 10


@pytest.mark.parametrize("warehouse", REDSHIFT_IN_E2E, indirect=True)
def test_the_approve_flow_loads_the_held_content_or_refuses_changed_content(
    flow_env: str, s3, landing_bucket: str
) -> None:
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=400))
    assert import_s3_folder(tenant_id="acme", folder=folder, return_state=True).is_completed()
    redeliver(s3, folder, {"trips-1.csv": csv_bytes(trips_table(10))})
    held = import_s3_folder(tenant_id="acme", folder=folder, return_state=True)
    assert held.name == "Held", held.message
    repo = BatchRepository(flow_env)
    (held_batch,) = repo.list(status="failed")

    approved = approve_held_batch(batch_id=str(held_batch.id), return_state=True)
    assert approved.name == "Completed", approved.message
    (owner,) = slice_rows(flow_env, "fleet_trips", "acme", folder)
    assert owner[1] == 10 and owner[0] != held_batch.id
    batch = repo.get(owner[0])
    assert batch.status == BatchStatus.SUCCEEDED
    assert batch.details["summary"]["cache_hits"] == len(batch.details["summary"]["files"])
    assert repo.get(held_batch.id).details["review"]["decision"] == "approved"
    held_story = str(latest_artifact(story_key(held_batch.id)))
    assert held_story.startswith(f"# batch {held_batch.id}: held (approved)"), held_story
    assert f"**review**: approved, loaded by batch {owner[0]}" in held_story
    assert "**approve**" not in held_story  # nothing waits any more
    assert "batches approve" not in held_story  # nor does its failure text say the command
    assert f"**approves**: held batch {held_batch.id}" in str(latest_artifact(story_key(owner[0])))
    rows = {r["batch"]: r for r in latest_artifact(tenant_key("acme"))}
    assert rows[str(held_batch.id)]["to approve"] == ""
    assert rows[str(owner[0])]["owns slice"] == "yes"
    again = approve_held_batch(batch_id=str(held_batch.id), return_state=True)
    assert again.name == "NotApproved" and "already approved" in again.message

    # Held again, then the folder changes before the approval: refused, nothing loaded.
    redeliver(s3, folder, {"trips-1.csv": csv_bytes(trips_table(2))})
    held_again = import_s3_folder(tenant_id="acme", folder=folder, return_state=True)
    assert held_again.name == "Held", held_again.message
    (second,) = [b for b in repo.list(status="failed") if "review" not in b.details]
    before = slice_snapshot(flow_env, folder)
    upload(s3, folder, {"trips-1.csv": csv_bytes(trips_table(3))})
    refused = approve_held_batch(batch_id=str(second.id), return_state=True)
    assert refused.name == "NotApproved" and "content changed" in refused.message
    assert exit_code_for(refused) == ExitCode.FAILED
    assert slice_snapshot(flow_env, folder) == before


@pytest.mark.parametrize("warehouse", REDSHIFT_IN_E2E, indirect=True)
def test_the_rollback_flow_restores_the_previous_slice(
    flow_env: str, s3, landing_bucket: str
) -> None:
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=400))
    assert import_s3_folder(tenant_id="acme", folder=folder, return_state=True).is_completed()
    good = slice_snapshot(flow_env, folder)
    (good_batch,) = BatchRepository(flow_env).list(status="succeeded")
    redeliver(s3, folder, {"trips-1.csv": csv_bytes(trips_table(30, start=7000))})
    bad = import_s3_folder(tenant_id="acme", folder=folder, no_guard=True, return_state=True)
    assert bad.name == "Completed", bad.message

    restored = rollback_slice(tenant_id="acme", folder=folder, return_state=True)
    assert restored.name == "Completed", restored.message
    after = slice_snapshot(flow_env, folder)
    assert {t: [r[:-1] for r in rows] for t, rows in after.items()} == {
        t: [r[:-1] for r in rows] for t, rows in good.items()
    }
    (owner,) = slice_rows(flow_env, "fleet_trips", "acme", folder)
    batch = BatchRepository(flow_env).get(owner[0])
    assert batch.details["rolled_back_to"] == str(good_batch.id) and owner[1] == 400
    (event,) = batch_events(owner[0], expected=1, name=ROLLED_BACK_EVENT)
    assert event.payload["rolled_back_to"] == str(good_batch.id)
    assert event.payload["row_counts"]["trips"] == 400
    story = str(latest_artifact(story_key(owner[0])))
    assert f"**rolled back to**: batch {good_batch.id}" in story
    assert BatchRepository(flow_env).list(status="running") == []

    unknown = rollback_slice(
        tenant_id="acme", folder=folder, to_batch_id=str(owner[0]), return_state=True
    )
    assert unknown.name == "NotRolledBack" and "owns the slice already" in unknown.message
    assert exit_code_for(unknown) == ExitCode.FAILED
