"""Cost per tenant on Redshift: every statement of a slice's session runs under
`query_group` = its batch id, so SYS_QUERY_HISTORY (query_label) attributes the cluster's
seconds to the batch, hence to its tenant. The emulator accepts query_group as Redshift
does (a setting PostgreSQL would refuse)."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import redshift_connector

from fleet_import.importing.context import Committed
from fleet_import.importing.driver import import_folder
from fleet_import.sample_data import fleet_delivery, today_folder
from fleet_import.scope import Tenant
from fleet_import.warehouse.redshift.slice_sql import QUERY_GROUP_MAX, query_group_sql
from tests.cli.run_cli import invoke
from tests.helpers import upload
from tests.redshift_emulator import RedshiftEmulator
from tests.warehouse.test_redshift_drift import redshift_ctx


def test_the_emulator_keeps_a_query_group_for_the_session(emulator: RedshiftEmulator) -> None:
    conn: Any = redshift_connector.connect(**emulator.connect_kwargs())
    try:
        cursor = conn.cursor()
        cursor.execute("SET query_group TO 'batch-1'")
        conn.commit()
        cursor.execute("SHOW query_group")
        assert cursor.fetchall()[0][0] == "batch-1"
        cursor.execute("RESET query_group")
        conn.commit()
    finally:
        conn.close()


def test_a_query_group_longer_than_redshift_keeps_is_cut() -> None:
    assert query_group_sql("x" * 400) == f"SET query_group TO '{'x' * QUERY_GROUP_MAX}'"
    assert query_group_sql("it's") == "SET query_group TO 'it''s'"


def test_every_statement_of_the_slice_runs_under_its_batch_id(
    emulator: RedshiftEmulator, repo, s3, staging_bucket, landing_bucket, tmp_path, database_url
) -> None:
    ctx = redshift_ctx(emulator, repo, s3, staging_bucket, tmp_path, "evolve")
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=20, fuel=5, vehicles=3))
    emulator.queries.clear()
    outcome = import_folder(ctx, Tenant.named("acme"), folder, "query-group")
    assert isinstance(outcome, Committed), outcome
    queries = emulator.queries
    group = query_group_sql(str(outcome.batch_id))
    first = queries.index(group)
    copies = [i for i, q in enumerate(queries) if q.lstrip().upper().startswith("COPY ")]
    locks = [i for i, q in enumerate(queries) if q.startswith("LOCK ")]
    assert copies and locks, queries
    assert first < min(copies) and first < min(locks), queries
    # What SYS_QUERY_HISTORY then holds under the batch's label: its COPYs and its commit's
    # statements, each with its elapsed microseconds.
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT query_text, elapsed_time FROM sys_query_history WHERE query_label = %s",
            (str(outcome.batch_id),),
        ).fetchall()
    texts = [text.lstrip().upper() for text, _ in rows]
    assert sum(t.startswith("COPY ") for t in texts) == len(copies)
    assert any(t.startswith("LOCK ") for t in texts) and any(t.startswith("INSERT ") for t in texts)
    assert all(elapsed >= 0 for _, elapsed in rows) and sum(e for _, e in rows) > 0


def test_costs_adds_the_seconds_redshift_attributes_to_each_tenant(
    emulator: RedshiftEmulator, repo, s3, staging_bucket, landing_bucket, tmp_path, database_url
) -> None:
    ctx = redshift_ctx(emulator, repo, s3, staging_bucket, tmp_path, "evolve")
    batches = {}
    for tenant in ("acme", "globex"):
        folder = today_folder(landing_bucket, tenant)
        upload(s3, folder, fleet_delivery(trips=20, fuel=5, vehicles=3))
        outcome = import_folder(ctx, Tenant.named(tenant), folder, f"cost-{tenant}")
        assert isinstance(outcome, Committed), outcome
        batches[tenant] = str(outcome.batch_id)
    with psycopg.connect(database_url) as conn:
        expected = dict(
            conn.execute(
                "SELECT query_label, sum(elapsed_time) FROM sys_query_history "
                "WHERE query_label = ANY(%s) GROUP BY 1",
                (list(batches.values()),),
            ).fetchall()
        )
    kwargs = emulator.connect_kwargs()
    env = {
        "FLEET_DATABASE_URL": database_url,
        "FLEET_WAREHOUSE": "redshift",
        "FLEET_REDSHIFT_HOST": "127.0.0.1",
        "FLEET_REDSHIFT_PORT": str(kwargs["port"]),
        "FLEET_REDSHIFT_DATABASE": kwargs["database"],
        "FLEET_REDSHIFT_USER": kwargs["user"],
        "FLEET_REDSHIFT_PASSWORD": "unused-trust-auth",
        "FLEET_REDSHIFT_SSL": "false",
        "FLEET_REDSHIFT_IAM_ROLE": "arn:aws:iam::123456789012:role/fleet-redshift-copy",
        "FLEET_REDSHIFT_STAGING_URI": f"s3://{staging_bucket}/redshift/",
    }
    ran = invoke(["costs", "--warehouse-seconds", "--json"], env)
    assert ran.returncode == 0, ran.stderr
    by_tenant = {row["tenant_id"]: row for row in json.loads(ran.stdout)}
    for tenant, batch_id in batches.items():
        assert by_tenant[tenant]["redshift_seconds"] == round(int(expected[batch_id]) / 1e6, 3)
        assert by_tenant[tenant]["redshift_seconds"] > 0

    on_postgres = invoke(["costs", "--warehouse-seconds"], {"FLEET_DATABASE_URL": database_url})
    assert on_postgres.returncode == 2
    assert "--warehouse-seconds reads Redshift's SYS_QUERY_HISTORY" in on_postgres.stderr
