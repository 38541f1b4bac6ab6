"""`fleet-import freshness` as users run it (in this process, against the real store and moto's
S3) with a controlled clock (`--at`): the table and the JSON name tenant, dataset, last
loaded, expected by and state; judging tells and remembers nothing."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from fleet_import.importing.context import Committed
from fleet_import.importing.driver import import_folder
from fleet_import.sample_data import fleet_delivery, today_folder
from fleet_import.scope import Tenant
from fleet_import.store.freshness_repository import FreshnessRepository
from tests.cli.run_cli import Ran, invoke
from tests.helpers import started_at, upload


def run_cli(*args: str, env: dict[str, str]) -> Ran:
    return invoke(args, env)


def test_freshness_table_and_json(
    tmp_path: Path, database_url: str, moto_endpoint: str, s3, landing_bucket: str, import_ctx
) -> None:
    slos = tmp_path / "freshness.yaml"
    slos.write_text(
        f"landing: {{bucket: {landing_bucket}}}\ndefault: daily by 06:00 Europe/Berlin\n"
    )
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(
        "tenants:\n"
        "  acme: {}\n"
        "  globex:\n"
        "    overrides:\n"
        "      freshness: daily by 08:00 Europe/Berlin on business days\n"
    )
    env = {
        "FLEET_DATABASE_URL": database_url,
        "FLEET_S3_ENDPOINT_URL": moto_endpoint,
        "FLEET_FRESHNESS": str(slos),
        "FLEET_TENANTS": str(tenants),
    }
    acme = today_folder(landing_bucket, "acme", dt.date(2026, 7, 22))
    upload(s3, acme, fleet_delivery(trips=20, fuel=5, vehicles=3) | {"_SUCCESS": b""})
    loaded = import_folder(import_ctx, Tenant.named("acme"), acme, "k")
    assert isinstance(loaded, Committed)
    started_at(database_url, loaded.batch_id, dt.datetime(2026, 7, 22, 5, tzinfo=dt.UTC))
    globex = today_folder(landing_bucket, "globex", dt.date(2026, 7, 22))
    upload(s3, globex, {"trips-1.csv": b"trip_id\n"})  # no marker yet

    at = "2026-07-22T08:30+02:00"
    shown = run_cli("freshness", "--at", at, env=env)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert "freshness at 2026-07-22 06:30 UTC" in shown.stdout
    [acme_line] = [line for line in lines if "acme" in line]
    assert "fresh" in acme_line and "2026-07-23 04:00 UTC" in acme_line  # the next due
    [globex_line] = [line for line in lines if "globex" in line]
    assert "arrived, incomplete" in globex_line and "never" in globex_line
    assert "2026-07-22 06:00 UTC" in globex_line  # 08:00 in Berlin, missed

    as_json = run_cli("freshness", "--json", "--at", at, env=env)
    assert as_json.returncode == 0, as_json.stderr
    rows = {row["tenant_id"]: row for row in json.loads(as_json.stdout)}
    assert rows["acme"]["state"] == "fresh"
    assert rows["acme"]["last_loaded"] == "2026-07-22T05:00:00+00:00"
    assert rows["acme"]["expected_by"] == "2026-07-23T04:00:00+00:00"
    assert rows["globex"] | {"checked_at": None} == {
        "tenant_id": "globex",
        "dataset": "*",
        "slo": "daily by 08:00 Europe/Berlin on business days",
        "state": "arrived, incomplete",
        "late": True,
        "expected_by": "2026-07-22T06:00:00+00:00",
        "last_loaded": None,
        "found": "arrived, incomplete: waiting for its _SUCCESS marker",
        "folder": globex,
        "checked_at": None,
    }
    assert FreshnessRepository(database_url).verdicts() == []  # a view: nothing remembered


def test_at_a_past_moment_only_loads_started_by_then_count(
    tmp_path: Path, database_url: str, moto_endpoint: str, s3, landing_bucket: str, import_ctx
) -> None:
    """`--at T` judges what existed at T: acme's folder of the day was loaded after T (the
    real clock, months later), so at T it was not loaded and never had been; globex loaded,
    before T, a folder dated three days after T, which is no delivery of T's day (it kept
    globex "fresh" until its date)."""
    slos = tmp_path / "freshness.yaml"
    slos.write_text(f"landing: {{bucket: {landing_bucket}}}\ndefault: daily by 06:00 UTC\n")
    env = {
        "FLEET_DATABASE_URL": database_url,
        "FLEET_S3_ENDPOINT_URL": moto_endpoint,
        "FLEET_FRESHNESS": str(slos),
    }
    files = fleet_delivery(trips=20, fuel=5, vehicles=3) | {"_SUCCESS": b""}
    acme = today_folder(landing_bucket, "acme", dt.date(2026, 7, 22))
    upload(s3, acme, files)
    assert isinstance(import_folder(import_ctx, Tenant.named("acme"), acme, "a"), Committed)
    ahead = today_folder(landing_bucket, "globex", dt.date(2026, 7, 25))
    upload(s3, ahead, files)
    loaded = import_folder(import_ctx, Tenant.named("globex"), ahead, "g")
    assert isinstance(loaded, Committed)
    started_at(database_url, loaded.batch_id, dt.datetime(2026, 7, 21, 12, tzinfo=dt.UTC))

    shown = run_cli("freshness", "--json", "--at", "2026-07-22T12:00Z", env=env)
    assert shown.returncode == 0, shown.stderr
    rows = {row["tenant_id"]: row for row in json.loads(shown.stdout)}
    assert rows["acme"]["late"] and rows["acme"]["last_loaded"] is None
    assert rows["acme"]["expected_by"] == "2026-07-22T06:00:00+00:00"
    assert rows["globex"]["late"] and rows["globex"]["state"] == "missing"
    assert rows["globex"]["last_loaded"] == "2026-07-21T12:00:00+00:00"
    assert rows["globex"]["found"] == f"no folder dated 2026-07-22 in s3://{landing_bucket}/"

    table = run_cli("freshness", "--at", "2026-07-22T12:00Z", env=env)
    [acme_line] = [line for line in table.stdout.splitlines() if "acme" in line]
    assert "never" in acme_line and "fresh" not in acme_line


def test_bad_settings_and_a_bad_clock_exit_with_their_codes(tmp_path: Path) -> None:
    slos = tmp_path / "freshness.yaml"
    slos.write_text("datasets: {trips: hourly by 06:00}\n")
    broken = run_cli("freshness", env={"FLEET_FRESHNESS": str(slos)})
    assert broken.returncode == 78
    assert (
        "FLEET_FRESHNESS:" in broken.stderr and "datasets.trips: 'hourly by 06:00'" in broken.stderr
    )
    bad_clock = run_cli("freshness", "--at", "tomorrow", env={})
    assert bad_clock.returncode == 2 and "--at 'tomorrow'" in bad_clock.stderr
