"""`fleet-import run` of a shrinking redelivery, `batches list --status held`, `batches
approve` and `batches reject`, `slices rollback`, and a run a delivery manifest blocks, as
users run them: the command in this process, each running its flow (issue #24)."""

from __future__ import annotations

import json

import pytest

from fleet_import.s3.delivery_manifest import MANIFEST_NAME, manifest_for
from fleet_import.sample_data import csv_bytes, fleet_delivery, today_folder, trips_table
from fleet_import.store.repository import BatchRepository
from tests.cli.run_cli import Ran, invoke_with_test_settings
from tests.helpers import slice_rows, upload
from tests.importing.guard_helpers import redeliver, slice_snapshot
from tests.warehouse_helpers import WAREHOUSE_BACKENDS

# Whole command scenarios, several flow runs each, over a minute together: make test-e2e.
# make test keeps the same guards through the flows (tests/test_flows_guards.py).
pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def cli(*args: str, env: dict[str, str] | None = None) -> Ran:
    return invoke_with_test_settings(*args, **(env or {}))


@pytest.fixture
def api_env(flow_env: str) -> dict[str, str]:
    return {}  # invoke_with_test_settings hands the command the test harness's API


@pytest.mark.parametrize("warehouse", WAREHOUSE_BACKENDS, indirect=True)
def test_held_listed_rejected_then_approved_from_the_cli(
    flow_env: str, api_env, s3, landing_bucket: str
) -> None:
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=400))
    assert cli("run", "--tenant", "acme", folder, env=api_env).returncode == 0
    before = slice_snapshot(flow_env, folder)

    header = csv_bytes(trips_table(1)).split(b"\n", 1)[0] + b"\n"
    redeliver(s3, folder, {"trips-1.csv": header})  # header only: would empty trips
    held = cli("run", "--tenant", "acme", folder, env=api_env)
    assert held.returncode == 6, held.stdout + held.stderr
    assert held.stdout.startswith("Held: ") and "allow_empty false" in held.stdout
    assert slice_snapshot(flow_env, folder) == before
    repo = BatchRepository(flow_env)
    assert repo.list(status="running") == []
    (first_held,) = repo.list(status="failed")

    listed = cli("batches", "list", "--status", "held", "--json", env=api_env)
    assert listed.returncode == 0, listed.stderr
    assert [b["id"] for b in json.loads(listed.stdout)] == [str(first_held.id)]
    rejected = cli("batches", "reject", str(first_held.id)[:8], env=api_env)
    assert rejected.returncode == 0, rejected.stdout + rejected.stderr
    assert "rejected" in rejected.stdout
    listed = cli("batches", "list", "--status", "held", env=api_env)
    assert "no batches wait for review" in listed.stdout

    redeliver(s3, folder, {"trips-1.csv": csv_bytes(trips_table(10))})  # truncated
    held = cli("run", "--tenant", "acme", folder, env=api_env)
    assert held.returncode == 6 and "to 10 (min_rows_ratio 0.5)" in held.stdout, held.stdout
    (second,) = [b for b in repo.list(status="failed") if b.id != first_held.id]
    approved = cli("batches", "approve", str(second.id), env=api_env)
    assert approved.returncode == 0, approved.stdout + approved.stderr
    assert approved.stdout.startswith("Completed: ")
    (owner,) = slice_rows(flow_env, "fleet_trips", "acme", folder)
    assert owner[1] == 10
    summary = repo.get(owner[0]).details["summary"]  # no file parsed again
    assert summary["cache_hits"] == len(summary["files"]) == 3
    refused = cli("batches", "approve", str(first_held.id), env=api_env)
    assert refused.returncode == 1 and "already rejected" in refused.stdout, refused.stdout

    # Held again, then the folder changes before the approval: refused, nothing loaded.
    redeliver(s3, folder, {"trips-1.csv": csv_bytes(trips_table(2))})
    assert cli("run", "--tenant", "acme", folder, env=api_env).returncode == 6
    (third,) = [b for b in repo.list(status="failed") if "review" not in b.details]
    upload(s3, folder, {"trips-1.csv": csv_bytes(trips_table(3))})
    before = slice_snapshot(flow_env, folder)
    changed = cli("batches", "approve", str(third.id), env=api_env)
    assert changed.returncode == 1, changed.stdout + changed.stderr
    assert changed.stdout.startswith("NotApproved: ") and "content changed" in changed.stdout
    assert slice_snapshot(flow_env, folder) == before
    assert repo.list(status="running") == []


def test_rollback_from_the_cli_restores_the_previous_slice_or_says_why_not(
    flow_env: str, api_env, s3, landing_bucket: str
) -> None:
    folder = today_folder(landing_bucket, "acme")
    # Retention 0 days: only the previous success's files are kept.
    env = {**api_env, "FLEET_RETAIN_DAYS": "0"}
    upload(s3, folder, fleet_delivery(trips=400))
    assert cli("run", "--tenant", "acme", folder, env=env).returncode == 0
    repo = BatchRepository(flow_env)
    (first,) = repo.list(status="succeeded")
    redeliver(s3, folder, {"trips-1.csv": csv_bytes(trips_table(300, start=5000))})
    assert cli("run", "--tenant", "acme", folder, env=env).returncode == 0
    good = slice_snapshot(flow_env, folder)
    (second,) = [b for b in repo.list(status="succeeded") if b.id != first.id]
    redeliver(s3, folder, {"trips-1.csv": csv_bytes(trips_table(20, start=9000))})
    bad = cli("run", "--tenant", "acme", folder, "--no-guard", env=env)
    assert bad.returncode == 0, bad.stdout + bad.stderr

    restored = cli("slices", "rollback", "--tenant", "acme", folder, env=env)
    assert restored.returncode == 0, restored.stdout + restored.stderr
    assert restored.stdout.startswith(f"Completed: rolled back to batch {second.id} (by default")
    after = slice_snapshot(flow_env, folder)  # row-exact, stamped by a new batch
    assert {t: [r[:-1] for r in rows] for t, rows in after.items()} == {
        t: [r[:-1] for r in rows] for t, rows in good.items()
    }
    (owner,) = slice_rows(flow_env, "fleet_trips", "acme", folder)
    assert owner[1] == 300
    batch = repo.get(owner[0])
    assert batch.details["rolled_back_to"] == str(second.id) and owner[0] != second.id
    assert batch.details["summary"]["cache_hits"] == len(batch.details["summary"]["files"])

    gone = cli("slices", "rollback", "--tenant", "acme", folder, "--to", str(first.id), env=env)
    assert gone.returncode == 1, gone.stdout + gone.stderr
    assert gone.stdout.startswith("NotRolledBack: ") and "are gone" in gone.stdout
    assert "trips-1.csv" in gone.stdout
    assert slice_snapshot(flow_env, folder) == after
    assert repo.list(status="running") == []


def test_a_second_rollback_never_brings_back_what_the_first_removed_from_the_cli(
    flow_env: str, api_env, s3, landing_bucket: str
) -> None:
    """Issue 46, item 10: good G, truncated T approved, `slices rollback` back to G; a second
    `slices rollback` chose T again (the newest success not owning the slice) and published
    the content the operator had just removed. Now it says there is nothing earlier to go to,
    and T loads again only when named."""
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=400))
    assert cli("run", "--tenant", "acme", folder, env=api_env).returncode == 0
    repo = BatchRepository(flow_env)
    (good,) = repo.list(status="succeeded")
    redeliver(s3, folder, {"trips-1.csv": csv_bytes(trips_table(10))})  # truncated
    assert cli("run", "--tenant", "acme", folder, env=api_env).returncode == 6
    (held,) = repo.list(status="failed")
    approved = cli("batches", "approve", str(held.id), env=api_env)
    assert approved.returncode == 0, approved.stdout + approved.stderr
    ((truncated, rows),) = slice_rows(flow_env, "fleet_trips", "acme", folder)
    assert rows == 10  # loaded by the approving batch

    first = cli("slices", "rollback", "--tenant", "acme", folder, env=api_env)
    assert first.returncode == 0, first.stdout + first.stderr
    assert first.stdout.startswith(f"Completed: rolled back to batch {good.id} (by default)")
    (restored,) = slice_rows(flow_env, "fleet_trips", "acme", folder)
    assert restored[1] == 400
    assert repo.get(restored[0]).details["rollback_replaced"] == str(truncated)

    second = cli("slices", "rollback", "--tenant", "acme", folder, env=api_env)
    assert second.returncode == 1, second.stdout + second.stderr
    assert second.stdout.startswith("NotRolledBack: ") and "--to" in second.stdout
    assert slice_rows(flow_env, "fleet_trips", "acme", folder) == [restored]

    named = cli("slices", "rollback", "--tenant", "acme", folder, "--to", str(truncated),
                env=api_env)  # fmt: skip
    assert named.returncode == 0, named.stdout + named.stderr
    assert named.stdout.startswith(f"Completed: rolled back to batch {truncated}; batch ")
    assert slice_rows(flow_env, "fleet_trips", "acme", folder)[0][1] == 10
    assert repo.list(status="running") == []


def test_a_manifest_with_a_missing_or_short_file_blocks_the_run_from_the_cli(
    flow_env: str, api_env, s3, landing_bucket: str
) -> None:
    folder = today_folder(landing_bucket, "acme")
    files = fleet_delivery(trips=200)
    listed = {**files, "trips-3.csv": files["trips-1.csv"]}  # never arrives
    upload(s3, folder, {**files, MANIFEST_NAME: manifest_for(listed, folder, {})})
    missing = cli("run", "--tenant", "acme", folder, env=api_env)
    assert missing.returncode == 1, missing.stdout + missing.stderr
    assert f"missing: {folder}trips-3.csv" in missing.stdout, missing.stdout

    cut = {**files, "trips-2.csv.gz": files["trips-2.csv.gz"] + b"cut off in transit"}
    upload(s3, folder, {MANIFEST_NAME: manifest_for(cut, folder, {})})
    short = cli("run", "--tenant", "acme", folder, env=api_env)
    assert short.returncode == 1, short.stdout + short.stderr
    assert f"size differs: {folder}trips-2.csv.gz" in short.stdout, short.stdout
    assert slice_rows(flow_env, "fleet_trips", "acme", folder) == []
    assert BatchRepository(flow_env).list(status="running") == []


def test_a_manifest_listing_a_file_twice_is_refused_naming_the_file_from_the_cli(
    flow_env: str, api_env, s3, landing_bucket: str
) -> None:
    """Issue 46, item 10: a manifest listing trips-1.csv twice loaded with exit 0; it is
    malformed (were the two entries to differ, which would hold?), and the run names the
    file."""
    folder = today_folder(landing_bucket, "acme")
    files = fleet_delivery(trips=20)
    entries = json.loads(manifest_for(files, folder, {}))["entries"]
    twice = next(e for e in entries if e["url"].endswith("trips-1.csv"))
    malformed = {"entries": [*entries, twice]}
    upload(s3, folder, {**files, MANIFEST_NAME: json.dumps(malformed).encode()})
    refused = cli("run", "--tenant", "acme", folder, env=api_env)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    (line,) = refused.stdout.splitlines()
    assert line.startswith("Failed: failed_pre_commit: "), line
    assert f"{MANIFEST_NAME}: {folder}trips-1.csv is listed twice" in line, line
    assert slice_rows(flow_env, "fleet_trips", "acme", folder) == []
    assert BatchRepository(flow_env).list(status="running") == []


def test_a_manifest_naming_a_dataset_s_only_file_that_never_arrived_names_it_from_the_cli(
    flow_env: str, api_env, s3, landing_bucket: str
) -> None:
    """Issue 40, item 8: the one line names the missing file and the manifest (it said only
    `no file for required dataset(s) vehicles`), and nothing reached the warehouse."""
    folder = today_folder(landing_bucket, "acme")
    files = fleet_delivery(trips=20)
    arrived = {k: v for k, v in files.items() if k != "vehicles.csv"}
    upload(s3, folder, {**arrived, MANIFEST_NAME: manifest_for(files, folder, {})})
    missing = cli("run", "--tenant", "acme", folder, env=api_env)
    assert missing.returncode == 1, missing.stdout + missing.stderr
    (line,) = missing.stdout.splitlines()
    assert line.startswith("Failed: failed_pre_commit: "), line
    assert f"does not match its manifest {MANIFEST_NAME}: missing: {folder}vehicles.csv" in line
    assert "Traceback" not in missing.stdout + missing.stderr
    assert slice_rows(flow_env, "fleet_vehicles", "acme", folder) == []
    assert BatchRepository(flow_env).list(status="running") == []
