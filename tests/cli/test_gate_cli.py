"""The content gate as users meet it (issue 49): `fleet-import run` of a delivery in cents
instead of euros, one with 90% empty drivers and one with orphan vehicle ids, each held
(exit 6); `gate show` and `batches show` print the checks and the profile beside the
replaced slice's, `--json` for scripts; `batches approve` loads the held content;
`--no-gate` skips the gate for one run, and the batch says so."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from fleet_import.sample_data import csv_bytes, fleet_delivery, today_folder, trips_table
from fleet_import.store.repository import BatchRepository
from flows.gate_report import gate_key
from tests.cli.run_cli import Ran, invoke_with_test_settings
from tests.helpers import curated, slice_rows, upload
from tests.importing.guard_helpers import redeliver
from tests.importing.test_gate import TRIPS, VEHICLES, cents, delivered, empty_drivers
from tests.prefect_reads import latest_artifact

# Whole command scenarios, several flow runs each: make test-e2e.
pytestmark = [pytest.mark.slow, pytest.mark.e2e]

CONTRACTS = """
extend:
  trips:
    checks:
      - type: relationships
        columns: [vehicle_id]
        to: vehicles.vehicle_id
        warn_if: "> 0"
        error_if: "> 1%"
"""


@pytest.fixture
def env(flow_env: str, tmp_path: Path) -> dict[str, str]:
    contracts = tmp_path / "contracts.yaml"
    contracts.write_text(CONTRACTS)
    return {"FLEET_CONTRACTS": str(contracts)}


def cli(*args: str, env: dict[str, str]) -> Ran:
    return invoke_with_test_settings(*args, **env)


def fuel_sum(database_url: str, folder: str) -> str:
    ((total,),) = curated(
        database_url,
        "SELECT sum(total_amount) FROM curated.fleet_fuel_transactions "
        "WHERE tenant_id = 'acme' AND source_scope = %s",
        f"fleet_s3:{folder}",
    )
    return str(total)


def test_cents_and_empty_drivers_are_held_shown_and_the_approval_loads_them(
    flow_env: str, env: dict[str, str], s3, landing_bucket: str
) -> None:
    folder = delivered(s3, landing_bucket)
    first = cli("run", "--tenant", "acme", folder, env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    euros = fuel_sum(flow_env, folder)
    repo = BatchRepository(flow_env)

    cents(s3, folder)
    held = cli("run", "--tenant", "acme", folder, env=env)
    assert held.returncode == 6, held.stdout + held.stderr
    assert held.stdout.startswith("Held: ") and "mean_moved(total_amount)" in held.stdout
    assert fuel_sum(flow_env, folder) == euros  # nothing committed
    (cents_batch,) = repo.list(status="failed")

    shown = cli("gate", "show", str(cents_batch.id)[:8], env=env)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "fuel_transactions: error, 80 rows -> 80 rows (compared with batch" in shown.stdout
    assert "mean_moved(total_amount)" in shown.stdout and "> 300%" in shown.stdout
    assert "total_amount" in shown.stdout and "null %" in shown.stdout  # the profile table
    as_json = json.loads(cli("gate", "show", str(cents_batch.id), "--json", env=env).stdout)
    (fuel,) = [d for d in as_json["datasets"] if d["dataset"] == "fuel_transactions"]
    assert fuel["outcome"] == "error" and fuel["baseline_profile"]["rows"] == 80
    assert [r["check"] for r in fuel["results"] if r["outcome"] == "error"] == [
        "mean_moved(total_amount)"
    ]
    batch_view = cli("batches", "show", str(cents_batch.id), env=env)
    assert "mean_moved(total_amount)" in batch_view.stdout, batch_view.stdout
    artifact = str(latest_artifact(gate_key(cents_batch.id)))  # the run's, for the UI
    assert artifact.startswith(f"# content gate of batch {cents_batch.id}: error"), artifact
    assert "| error | mean\\_moved(total\\_amount) |" in artifact
    assert "| total\\_amount | 0\\.0 -\\> 0.0 |" in artifact  # before -> now, escaped

    approved = cli("batches", "approve", str(cents_batch.id), env=env)
    assert approved.returncode == 0, approved.stdout + approved.stderr
    hundredfold = fuel_sum(flow_env, folder)
    assert float(hundredfold) == pytest.approx(100 * float(euros))  # the held content
    (owner,) = {row[0] for row in slice_rows(flow_env, "fleet_fuel_transactions", "acme", folder)}
    gates = json.loads(cli("gate", "show", str(owner), "--json", env=env).stdout)
    assert "waived" in {d["outcome"] for d in gates["datasets"]}

    empty_drivers(s3, folder)
    held = cli("run", "--tenant", "acme", folder, env=env)
    assert held.returncode == 6, held.stdout + held.stderr
    assert "null_rate_up(driver_id): null 10% -> 90% (> +25 points)" in held.stdout


def test_orphan_vehicle_ids_hold_a_first_load_and_no_gate_lets_them_through(
    flow_env: str, env: dict[str, str], s3, landing_bucket: str
) -> None:
    folder = today_folder(landing_bucket, "acme", dt.date(2026, 7, 23))
    files = fleet_delivery(trips=TRIPS, vehicles=VEHICLES)
    upload(s3, folder, files)
    # A third of the trips name vehicles the delivery does not have.
    redeliver(s3, folder, {"trips-1.csv": csv_bytes(trips_table(TRIPS, vehicles=2 * VEHICLES))})
    held = cli("run", "--tenant", "acme", folder, env=env)
    assert held.returncode == 6, held.stdout + held.stderr
    assert "relationships(vehicle_id): 20 rows (33.3%) (warn_if > 0, error_if > 1%)" in held.stdout
    assert "failing rows: s3://" in held.stdout
    repo = BatchRepository(flow_env)
    (batch,) = repo.list(status="failed")
    shown = cli("gate", "show", str(batch.id), env=env)
    assert "no previous profile" in shown.stdout, shown.stdout
    assert "failing rows (20):" in shown.stdout

    passed = cli("run", "--tenant", "acme", folder, "--no-gate", env=env)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    (loaded,) = repo.list(status="succeeded")
    assert loaded.details["guard"]["no_gate"] is True
    shown = cli("gate", "show", str(loaded.id), env=env)
    assert "content gate skipped: no_gate" in shown.stdout, shown.stdout


def test_a_warning_publishes_says_so_on_the_final_line_and_tells_automations(
    flow_env: str, env: dict[str, str], s3, landing_bucket: str
) -> None:
    from fleet_import.importing.gate import WARNED_EVENT
    from tests.prefect_reads import batch_events

    folder = today_folder(landing_bucket, "acme", dt.date(2026, 7, 24))
    upload(s3, folder, fleet_delivery(trips=200, vehicles=VEHICLES))
    trips = trips_table(200, vehicles=VEHICLES)
    orphan = csv_bytes(trips).replace(b'"T7","V7"', b'"T7","V999"')
    redeliver(s3, folder, {"trips-1.csv": orphan})  # one trip of 200: 0.5%, under 1%
    warned = cli("run", "--tenant", "acme", folder, env=env)
    assert warned.returncode == 0, warned.stdout + warned.stderr
    assert warned.stdout.startswith("Completed: batch "), warned.stdout
    assert "content gate warned: trips relationships(vehicle_id): 1 rows (0.5%)" in warned.stdout
    (batch,) = BatchRepository(flow_env).list(status="succeeded")
    assert batch.details["gate"]["warnings"] == 1
    (event,) = batch_events(batch.id, expected=1, name=WARNED_EVENT)
    assert [w["check"] for w in event.payload["warnings"]] == ["relationships(vehicle_id)"]
