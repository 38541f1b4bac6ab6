"""Cost per tenant on Redshift: every statement of a slice's session runs under
`query_group` = its batch id, so SYS_QUERY_HISTORY (query_label) attributes the cluster's
seconds to the batch, hence to its tenant. The emulator accepts query_group as Redshift
does (a setting PostgreSQL would refuse)."""

from __future__ import annotations

from typing import Any

import redshift_connector

from fleet_import.importing.context import Committed
from fleet_import.importing.driver import import_folder
from fleet_import.sample_data import fleet_delivery, today_folder
from fleet_import.scope import Tenant
from fleet_import.warehouse.redshift.slice_sql import QUERY_GROUP_MAX, query_group_sql
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
    emulator: RedshiftEmulator, repo, s3, staging_bucket, landing_bucket, tmp_path
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
