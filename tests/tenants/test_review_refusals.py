"""Approve and rollback check the tenant rule themselves: a disabled tenant's held batch is
not approved and its slice is not rolled back, through the flows and the CLI (exit 9, one
line naming the tenant and why), with nothing written; enabled again, both work."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from fleet_cli.cli import app
from fleet_import.sample_data import csv_bytes, fleet_delivery, today_folder, trips_table
from fleet_import.store.repository import BatchRepository
from fleet_import.tenants.binding import DELIVERY_REFUSED_EVENT
from flows.approve_held_batch import approve_held_batch
from flows.import_s3_folder import import_s3_folder
from flows.reporting import ExitCode, exit_code_for
from flows.rollback_slice import rollback_slice
from tests.helpers import upload
from tests.importing.guard_helpers import redeliver, slice_snapshot

pytestmark = pytest.mark.slow

ENABLED = "tenants:\n  acme: {}\n  globex: {}\n"
DISABLED = "tenants:\n  acme: {}\n  globex:\n    enabled: false\n"


def _batches(database_url: str) -> list[tuple]:
    return [(b.id, b.status, b.details) for b in BatchRepository(database_url).list()]


def _refused_events(resource_id: str) -> list[Any]:
    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter

    event_filter = EventFilter(
        event=EventNameFilter(name=[DELIVERY_REFUSED_EVENT]),
        resource=EventResourceFilter(id=[resource_id]),
    )
    deadline = time.monotonic() + 30
    while True:
        with get_client(sync_client=True) as client:
            events = client.read_events(filter=event_filter, limit=10).events
        if events or time.monotonic() > deadline:
            return events
        time.sleep(0.5)


def test_a_disabled_tenant_s_held_batch_and_slice_are_left_alone(
    flow_env: str, s3, landing_bucket: str, tmp_path: Path, monkeypatch
) -> None:
    registry = tmp_path / "tenants.yaml"
    registry.write_text(ENABLED)
    monkeypatch.setenv("FLEET_TENANTS", str(registry))
    folder = today_folder(landing_bucket, "globex")
    upload(s3, folder, fleet_delivery(trips=400))
    assert import_s3_folder(tenant_id="globex", folder=folder, return_state=True).is_completed()
    redeliver(s3, folder, {"trips-1.csv": csv_bytes(trips_table(30, start=7000))})
    bad = import_s3_folder(tenant_id="globex", folder=folder, no_guard=True, return_state=True)
    assert bad.name == "Completed", bad.message  # an earlier success to roll back to
    redeliver(s3, folder, {"trips-1.csv": csv_bytes(trips_table(5, start=8000))})
    held = import_s3_folder(tenant_id="globex", folder=folder, return_state=True)
    assert held.name == "Held", held.message
    (held_batch,) = BatchRepository(flow_env).list(status="failed")

    registry.write_text(DISABLED)
    slice_before, batches_before = slice_snapshot(flow_env, folder), _batches(flow_env)
    approve = approve_held_batch(batch_id=str(held_batch.id), return_state=True)
    rollback = rollback_slice(tenant_id="globex", folder=folder, return_state=True)
    for state in (approve, rollback):
        assert state.name == "Refused" and exit_code_for(state) == ExitCode.REFUSED, state
        assert "tenant 'globex' is disabled in the tenant registry" in state.message
    cli = CliRunner()
    for command in (
        ["batches", "approve", str(held_batch.id)],
        ["slices", "rollback", "--tenant", "globex", folder],
    ):
        done = cli.invoke(app, command, env={"COLUMNS": "300"})
        assert done.exit_code == 9, done.output
        (line,) = [line for line in done.output.splitlines() if line.startswith("Refused")]
        assert "tenant 'globex' is disabled" in line, done.output
    approvals = _refused_events(f"fleet.batch.{held_batch.id}")
    assert {e.payload["source"] for e in approvals} == {"approve-held-batch"}, approvals
    assert all(e.payload["kind"] == "disabled_tenant" for e in approvals)
    rollbacks = _refused_events(f"fleet.delivery.{folder}")
    assert {e.payload["source"] for e in rollbacks} == {"rollback-slice"}, rollbacks
    assert slice_snapshot(flow_env, folder) == slice_before  # not a row written
    assert _batches(flow_env) == batches_before  # no batch made, the held one undecided

    registry.write_text(ENABLED)  # the refusal was the only thing in the way
    approved = approve_held_batch(batch_id=str(held_batch.id), return_state=True)
    assert approved.name == "Completed", approved.message
    restored = rollback_slice(tenant_id="globex", folder=folder, return_state=True)
    assert restored.name == "Completed", restored.message
