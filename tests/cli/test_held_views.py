"""Every view of a held batch answers from one place (fleet_import.store.batch_state):
awaiting review, approved (by which batch), rejected (with its note), overtaken (its content
loaded since: nothing offered) or stale (its folder changed: reject or rerun), the same in
`batches list`, `batches list --status held`, `batches show`, their `--json` and the
approval itself; a batch in the crash window is `committed: unknown until settled`."""

from __future__ import annotations

import json
import uuid

import pytest

from fleet_import.sample_data import csv_bytes, fleet_delivery, today_folder, trips_table
from fleet_import.store.models import BatchStatus
from fleet_import.store.repository import BatchRepository
from flows.approve_held_batch import approve_held_batch
from flows.import_s3_folder import import_s3_folder
from tests.cli.run_cli import invoke_with_test_settings
from tests.helpers import upload
from tests.importing.guard_helpers import redeliver

pytestmark = pytest.mark.slow


def _held(flow_env: str, s3, landing_bucket: str) -> tuple[str, uuid.UUID]:
    """A good delivery of 400 trips loaded, then a truncated one held: (folder, held id)."""
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=400))
    assert import_s3_folder(tenant_id="acme", folder=folder, return_state=True).is_completed()
    redeliver(s3, folder, {"trips-1.csv": csv_bytes(trips_table(10))})
    held = import_s3_folder(tenant_id="acme", folder=folder, return_state=True)
    assert held.name == "Held", held.message
    (batch,) = BatchRepository(flow_env).list(status="failed")
    return folder, batch.id


def _listed(*args: str) -> dict[str, dict]:
    ran = invoke_with_test_settings("batches", "list", *args, "--json")
    assert ran.returncode == 0, ran.stderr
    return {row["id"]: row for row in json.loads(ran.stdout)}


def _shown(batch_id: uuid.UUID) -> tuple[dict, str]:
    as_json = invoke_with_test_settings("batches", "show", str(batch_id), "--json")
    text = invoke_with_test_settings("batches", "show", str(batch_id))
    assert as_json.returncode == 0 and text.returncode == 0, as_json.stderr + text.stderr
    return json.loads(as_json.stdout), text.stdout


def test_a_held_batch_overtaken_by_the_same_content_offers_nothing(
    flow_env: str, s3, landing_bucket: str
) -> None:
    folder, held_id = _held(flow_env, s3, landing_bucket)
    record, text = _shown(held_id)
    assert record["review_state"] == "awaiting review"
    assert f"fleet-import batches approve {held_id}" in text

    # The same content loaded another way (the guard lowered for one run).
    lowered = import_s3_folder(
        tenant_id="acme", folder=folder, min_rows_ratio=0.01, return_state=True
    )
    assert lowered.name == "Completed", lowered.message
    loader = BatchRepository(flow_env).list(status="succeeded")[0]  # newest first

    record, text = _shown(held_id)
    assert record["shown_status"] == "held (overtaken)"
    assert record["review"].startswith(f"overtaken: batch {loader.id} loaded this content since")
    assert "batches approve" not in text and "overtaken" in text
    held_list = invoke_with_test_settings("batches", "list", "--status", "held")
    assert f"{held_id}: overtaken: batch {loader.id}" in held_list.stdout, held_list.stdout
    assert "batches approve" not in held_list.stdout
    assert _listed()[str(held_id)]["shown_status"] == "held (overtaken)"

    # Approving it would load the same content a second time: refused, nothing loaded.
    refused = approve_held_batch(batch_id=str(held_id), return_state=True)
    assert refused.name == "NotApproved", refused.message
    assert f"overtaken: batch {loader.id} loaded this content since" in refused.message
    assert len(BatchRepository(flow_env).list(status="succeeded")) == 2


def test_a_held_batch_whose_folder_changed_is_stale_with_reject_or_rerun(
    flow_env: str, s3, landing_bucket: str
) -> None:
    folder, held_id = _held(flow_env, s3, landing_bucket)
    upload(s3, folder, fleet_delivery(trips=420))  # the tenant fixed its delivery
    fixed = import_s3_folder(tenant_id="acme", folder=folder, return_state=True)
    assert fixed.name == "Completed", fixed.message

    record, text = _shown(held_id)
    assert record["shown_status"] == "held (stale)"
    assert record["review_state"] == "stale"
    assert f"fleet-import batches reject {held_id}" in record["review"]
    assert "batches approve" not in text
    held_list = invoke_with_test_settings("batches", "list", "--status", "held")
    assert f"{held_id}: stale: the folder changed since" in held_list.stdout, held_list.stdout
    assert "batches approve" not in held_list.stdout


def test_approved_and_rejected_show_their_decision_everywhere(
    flow_env: str, s3, landing_bucket: str
) -> None:
    folder, held_id = _held(flow_env, s3, landing_bucket)
    approved = approve_held_batch(batch_id=str(held_id), return_state=True)
    assert approved.name == "Completed", approved.message
    approver = BatchRepository(flow_env).get(held_id).details["review"]["batch_id"]
    record, text = _shown(held_id)
    assert record["shown_status"] == "held (approved)"
    assert record["reviewed_by_batch"] == approver
    assert f"approved, loaded by batch {approver}" in text
    assert _listed()[str(held_id)]["shown_status"] == "held (approved)"
    listed = invoke_with_test_settings("batches", "list")
    assert "held (approved)" in listed.stdout and "failed (held)" not in listed.stdout

    redeliver(s3, folder, {"trips-1.csv": csv_bytes(trips_table(2))})
    again = import_s3_folder(tenant_id="acme", folder=folder, return_state=True)
    assert again.name == "Held", again.message
    (second,) = [
        b for b in BatchRepository(flow_env).list(status="failed") if "review" not in b.details
    ]
    rejected = invoke_with_test_settings(
        "batches", "reject", str(second.id), "--note", "tenant resends on Monday"
    )
    assert rejected.returncode == 0, rejected.stderr
    record, text = _shown(second.id)
    assert record["shown_status"] == "held (rejected)"
    assert record["review_note"] == "tenant resends on Monday"
    assert "rejected: tenant resends on Monday" in text


def test_a_batch_in_the_crash_window_is_committed_unknown_not_no(flow_env: str) -> None:
    """Killed after its slice load began (phase `normalised`) and before the commit was
    recorded: whether the warehouse committed is not known until the stamp is read."""
    from fleet_import.scope import Tenant, source_scope

    repo = BatchRepository(flow_env)
    scope = source_scope("s3://fleet-landing/acme/fleet/2026-07-22/")
    reserved = repo.reserve(Tenant.named("acme"), scope, "d1")
    repo.acquire_lease(reserved.batch.id, "w1", 60)
    repo.update_details(reserved.batch.id, "w1", {"phase": "discovered"})
    assert _shown(reserved.batch.id)[0]["committed"] == "no"
    repo.update_details(reserved.batch.id, "w1", {"phase": "normalised"})
    record, text = _shown(reserved.batch.id)
    assert record["status"] == BatchStatus.RUNNING
    assert record["committed"] == "unknown until settled"
    assert "unknown until settled" in text
