"""`fleet-import costs` against a real store after real imports: per tenant, the rows,
rejects, bytes staged and seconds the committed slices recorded, filtered by tenant and
by creation time; a bad --since is a usage error naming the format."""

from __future__ import annotations

import datetime as dt
import json

from fleet_import.importing.context import Committed
from fleet_import.importing.driver import import_folder
from fleet_import.sample_data import fleet_delivery, today_folder
from fleet_import.scope import Tenant
from tests.cli.run_cli import invoke
from tests.helpers import started_at, upload


def test_costs_per_tenant_from_the_batches_own_timings(
    database_url: str, import_ctx, s3, landing_bucket: str
) -> None:
    loaded = {}
    for tenant, trips in (("acme", 60), ("globex", 30)):
        folder = today_folder(landing_bucket, tenant)
        upload(s3, folder, fleet_delivery(trips=trips, fuel=10, vehicles=5))
        outcome = import_folder(import_ctx, Tenant.named(tenant), folder, f"costs-{tenant}")
        assert isinstance(outcome, Committed), outcome
        loaded[tenant] = outcome
    started_at(database_url, loaded["globex"].batch_id, dt.datetime(2026, 7, 1, tzinfo=dt.UTC))
    env = {"FLEET_DATABASE_URL": database_url}

    ran = invoke(["costs", "--json"], env)
    assert ran.returncode == 0, ran.stderr
    by_tenant = {row["tenant_id"]: row for row in json.loads(ran.stdout)}
    assert sorted(by_tenant) == ["acme", "globex"]
    for tenant, outcome in loaded.items():
        row = by_tenant[tenant]
        assert row["batches"] == 1
        assert row["rows"] == sum(outcome.row_counts.values())
        assert row["staged_bytes"] > 0
        seconds = outcome.summary["seconds"]
        assert row["copy_seconds"] == round(sum(seconds["copy"].values()), 3)
        assert row["commit_seconds"] == seconds["commit"]
        assert row["load_seconds"] == seconds["load"] >= row["commit_seconds"]

    since = invoke(["costs", "--since", "2026-07-02", "--json"], env)
    assert [r["tenant_id"] for r in json.loads(since.stdout)] == ["acme"]
    one = invoke(["costs", "--tenant", "globex"], env)
    assert one.returncode == 0 and "globex" in one.stdout and "acme" not in one.stdout
    assert "cost per tenant" in one.stdout

    bad = invoke(["costs", "--since", "last week"], env)
    assert bad.returncode == 2
    assert "--since 'last week': expected an ISO 8601 time" in bad.stderr
