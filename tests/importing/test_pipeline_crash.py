"""Real process deaths at the riskiest points of the data path, then a rerun."""

from __future__ import annotations

import time

import pytest

from fleet_import.importing.context import Committed, ImportContext, NotClaimed
from fleet_import.importing.driver import import_folder
from fleet_import.sample_data import fleet_delivery, today_folder
from fleet_import.scope import Tenant, source_scope
from fleet_import.store.models import BatchStatus
from fleet_import.warehouse.postgres.warehouse import PostgresWarehouse
from tests.helpers import CHILD_TTL, slice_rows, upload
from tests.import_child import KILLED, run_import_child

ACME = Tenant.named("acme")


@pytest.mark.slow
@pytest.mark.parametrize(
    "failpoint", ["after_warehouse_commit", "after_normalized_file", "after_lease"]
)
def test_rerun_after_a_kill_finishes_the_same_batch(
    import_ctx: ImportContext,
    s3,
    moto_endpoint: str,
    landing_bucket: str,
    staging_bucket: str,
    database_url: str,
    tmp_path,
    failpoint: str,
) -> None:
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=120, fuel=30, vehicles=10))
    child = run_import_child(
        database_url,
        moto_endpoint,
        staging_bucket,
        folder,
        "d1",
        workdir=tmp_path / "child",
        ttl=CHILD_TTL,
        env={"FLEET_FAILPOINTS": failpoint},
    )
    assert child.returncode == KILLED, child.stderr
    (batch,) = import_ctx.repo.list()
    assert batch.status == BatchStatus.RUNNING and not batch.details["warehouse_committed"]

    # The dead worker's lease is still live: a duplicate delivery must not claim it.
    assert isinstance(import_folder(import_ctx, ACME, folder, "d1"), NotClaimed)
    time.sleep(CHILD_TTL + 0.2)

    warehouse = PostgresWarehouse(database_url)
    import_ctx.warehouse = warehouse
    outcome = import_folder(import_ctx, ACME, folder, "d1")
    assert isinstance(outcome, Committed), outcome
    assert outcome.batch_id == batch.id
    assert import_ctx.repo.get(batch.id).status == BatchStatus.SUCCEEDED
    assert slice_rows(database_url, "fleet_trips", "acme", folder) == [(batch.id, 120)]
    if failpoint == "after_warehouse_commit":
        # The slice was already stamped: only the operational record was redone.
        assert outcome.recovered and warehouse.copies == 0
        assert outcome.row_counts == {"vehicles": 10, "trips": 120, "fuel_transactions": 30}
    else:
        assert not outcome.recovered and warehouse.copies > 0
    assert warehouse.slice_owner("acme", source_scope(folder)) == batch.id
    assert import_ctx.repo.list(status="running") == []
