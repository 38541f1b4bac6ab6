"""Drift policies (issue #25, part 1) as users meet them: a contract file (FLEET_CONTRACTS)
with `on_new_columns`, an `emissions` export that gained `co2_grams` and lacks its optional
`note`, run by `fleet-import run` / `batches approve` (in this process) and by the flows under
Prefect's test harness. Real PostgreSQL, moto's S3 server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleet_import.sample_data import fleet_delivery, today_folder
from fleet_import.store.models import BatchStatus
from fleet_import.store.repository import BatchRepository
from tests.cli.run_cli import Ran, invoke_with_test_settings
from tests.helpers import curated, upload

pytestmark = pytest.mark.slow

CONTRACT = """\
datasets:
  - name: emissions
    file_glob: "emissions*"
    target_table: curated.fleet_emissions
    natural_key: [reading_id]
    on_new_columns: {policy}
    new_column_type: int64
    columns:
      - {{name: reading_id, type: string, nullable: false}}
      - {{name: vehicle_id, type: string}}
      - {{name: note, type: string, optional: true}}
"""
EMISSIONS = b"reading_id,vehicle_id,co2_grams\nR1,V1,120\nR2,V2,95\nR3,V1,\n"


def contract_file(tmp_path: Path, policy: str) -> str:
    path = tmp_path / f"contracts-{policy}.yaml"
    path.write_text(CONTRACT.format(policy=policy))
    return str(path)


def deliver(s3, landing_bucket: str) -> str:
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, {**fleet_delivery(trips=20), "emissions.csv": EMISSIONS})
    return folder


def emissions(database_url: str) -> list[tuple]:
    columns = dict(
        curated(
            database_url,
            "SELECT column_name, data_type FROM information_schema.columns"
            " WHERE table_schema = 'curated' AND table_name = 'fleet_emissions'",
        )
    )
    if not columns:  # never loaded: no table yet
        return []
    co2 = "co2_grams" if "co2_grams" in columns else "NULL"
    return curated(
        database_url,
        f"SELECT reading_id, note, {co2} FROM curated.fleet_emissions ORDER BY reading_id",
    )


def cli(*args: str, env: dict[str, str]) -> Ran:
    return invoke_with_test_settings(*args, **env)


@pytest.fixture
def api_env(flow_env: str) -> dict[str, str]:
    return {}


@pytest.mark.parametrize("policy", ["reject", "ignore", "evolve", "review"])
def test_each_policy_from_the_cli(
    policy: str, flow_env: str, api_env, s3, landing_bucket: str, tmp_path: Path
) -> None:
    env = {**api_env, "FLEET_CONTRACTS": contract_file(tmp_path, policy)}
    folder = deliver(s3, landing_bucket)
    run = cli("run", "--tenant", "acme", folder, env=env)
    output = run.stdout + run.stderr
    repo = BatchRepository(flow_env)
    if policy == "reject":
        assert run.returncode == 1, output
        assert "emissions.csv" in output and "unexpected columns: co2_grams" in output
        return
    if policy == "review":
        assert run.returncode == 6, output
        assert run.stdout.startswith("Held: ") and "co2_grams int64" in run.stdout, output
        assert emissions(flow_env) == []
        (held,) = repo.list(status="failed")
        listed = cli("batches", "list", "--status", "held", env=env)
        assert f"{held.id}: emissions new columns co2_grams int64" in listed.stdout, listed
        approved = cli("batches", "approve", str(held.id), env=env)
        assert approved.returncode == 0, approved.stdout + approved.stderr
        assert approved.stdout.startswith("Completed: "), approved.stdout
    else:
        assert run.returncode == 0, output
    (batch,) = repo.list(status=BatchStatus.SUCCEEDED)
    if policy == "ignore":
        assert emissions(flow_env) == [("R1", None, None), ("R2", None, None), ("R3", None, None)]
        assert batch.details["drift"]["emissions"]["columns"] == {"co2_grams": "int64"}
    else:  # evolved, or approved: the column is the table's, with the file's values
        assert emissions(flow_env) == [("R1", None, 120), ("R2", None, 95), ("R3", None, None)]


def test_ignored_and_held_drift_under_prefect(
    flow_env: str, s3, landing_bucket: str, tmp_path: Path, monkeypatch
) -> None:
    from flows.approve_held_batch import approve_held_batch
    from flows.import_s3_folder import import_s3_folder
    from flows.reporting import ExitCode, exit_code_for
    from flows.story import drift_facts, story_markdown

    repo = BatchRepository(flow_env)
    folder = deliver(s3, landing_bucket)
    monkeypatch.setenv("FLEET_CONTRACTS", contract_file(tmp_path, "ignore"))
    ignored = import_s3_folder(tenant_id="acme", folder=folder, return_state=True)
    assert ignored.name == "Completed", ignored.message
    (batch,) = repo.list(status=BatchStatus.SUCCEEDED)
    assert dict(drift_facts(batch)) == {
        "new columns: emissions": "co2\\_grams int64, not loaded (ignore)"
    }
    assert "new columns: emissions" in story_markdown(batch, {})

    # The same folder under review: its contract version differs, so it loads anew -- held.
    monkeypatch.setenv("FLEET_CONTRACTS", contract_file(tmp_path, "review"))
    held = import_s3_folder(tenant_id="acme", folder=folder, return_state=True)
    assert held.name == "Held" and exit_code_for(held) == ExitCode.HELD, held.message
    assert "co2_grams int64" in held.message
    (held_batch,) = repo.list(status="failed")
    assert dict(drift_facts(held_batch))["held: emissions"].startswith("new columns co2")
    assert emissions(flow_env) == [("R1", None, None), ("R2", None, None), ("R3", None, None)]

    approved = approve_held_batch(batch_id=str(held_batch.id), return_state=True)
    assert approved.name == "Completed", approved.message
    assert emissions(flow_env) == [("R1", None, 120), ("R2", None, 95), ("R3", None, None)]
    (owner,) = curated(flow_env, "SELECT DISTINCT ingestion_batch_id FROM curated.fleet_emissions")
    summary = repo.get(owner[0]).details["summary"]
    assert summary["cache_hits"] == len(summary["files"])  # nothing read from S3 again


FITTER = b"reading_id,vehicle_id,fitter\nR1,V1,Ann Smith\nR2,V2,Bo Li\nR3,V1,\n"


def _emissions_columns(database_url: str) -> set[str]:
    rows = curated(
        database_url,
        "SELECT column_name FROM information_schema.columns"
        " WHERE table_schema = 'curated' AND table_name = 'fleet_emissions'",
    )
    return {name for (name,) in rows}


def test_an_approval_whose_new_column_does_not_fit_its_type_alters_nothing(
    flow_env: str, s3, landing_bucket: str, tmp_path: Path
) -> None:
    """Issue #46 item 7: `new_column_type: int64` and a text column `fitter`: the approval
    used to add `fitter bigint`, then fail every row, and the column stayed. It is refused
    now, naming the column, its type and a value that does not fit; the table is as before
    and the batch still held (rejecting it is what is left)."""
    env = {"FLEET_CONTRACTS": contract_file(tmp_path, "review")}
    folder = today_folder(landing_bucket, "acme")
    # A first delivery without new columns creates the table (its columns are the contract's).
    without_drift = b"reading_id,vehicle_id\nR0,V0\n"
    upload(s3, folder, {**fleet_delivery(trips=20), "emissions.csv": without_drift})
    first = cli("run", "--tenant", "acme", folder, env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    before = _emissions_columns(flow_env)
    assert "fitter" not in before

    upload(s3, folder, {"emissions.csv": FITTER})
    run = cli("run", "--tenant", "acme", folder, env=env)
    assert run.returncode == 6, run.stdout + run.stderr
    assert "fitter int64" in run.stdout
    repo = BatchRepository(flow_env)
    (held,) = repo.list(status="failed")

    approved = cli("batches", "approve", str(held.id), env=env)
    output = approved.stdout + approved.stderr
    assert approved.returncode == 1, output
    assert "fitter" in output and "int64" in output and "'Ann Smith'" in output, output
    assert _emissions_columns(flow_env) == before  # no ALTER TABLE
    assert repo.get(held.id).details.get("review") is None  # still held: reject it instead
    assert [b.id for b in repo.list(status="failed")] == [held.id]  # no approval batch failed


EXTEND_TRIPS = """\
extend:
  trips:
    on_new_columns: ignore
    aliases:
      distance_km: [distance]
"""


def test_a_shipped_dataset_extended_by_fleet_contracts(
    flow_env: str, s3, landing_bucket: str, tmp_path: Path
) -> None:
    """Issue #46 item 9: a renamed column and a new one in the Fleet `trips` export load
    with an alias and a drift policy from FLEET_CONTRACTS, no code change (redefining
    `trips` there was refused: "defined twice")."""
    contracts = tmp_path / "extend.yaml"
    contracts.write_text(EXTEND_TRIPS)
    env = {"FLEET_CONTRACTS": str(contracts)}
    shown = cli("contracts", "show", "--json", env=env)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    trips = next(c for c in json.loads(shown.stdout)["contracts"] if c["dataset"] == "trips")
    assert trips["policies"]["on_new_columns"] == "ignore"
    distance = next(c for c in trips["columns"] if c["name"] == "distance_km")
    assert distance["aliases"] == ["distance"]

    folder = today_folder(landing_bucket, "acme")
    files = fleet_delivery(trips=20)
    header, *rows = files["trips-1.csv"].rstrip(b"\n").split(b"\n")
    header = header.replace(b'"distance_km"', b'"distance"') + b',"fitter"'
    files["trips-1.csv"] = b"\n".join([header, *(row + b",Ann" for row in rows)]) + b"\n"
    upload(s3, folder, files)
    run = cli("run", "--tenant", "acme", folder, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    (batch,) = BatchRepository(flow_env).list(status=BatchStatus.SUCCEEDED)
    assert batch.details["row_counts"]["trips"] == 20
    assert batch.details["drift"]["trips"]["columns"] == {"fitter": "string"}
    assert curated(
        flow_env, "SELECT count(*) FROM curated.fleet_trips WHERE distance_km IS NOT NULL"
    ) == [(20,)]
