"""The lost COMMIT answer on Redshift, through the emulator (provisioned and Serverless):
the proxy sits between redshift_connector and the emulator. redshift_connector sends its
COMMIT as a prepared statement (Parse once, then Bind): the proxy finds it by its Bind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleet_import.contracts.fleet import FLEET_DATASETS
from fleet_import.importing.context import Committed, CommitUnknown, ImportContext
from fleet_import.importing.driver import import_folder
from fleet_import.retry import Backoff, spanning
from fleet_import.s3.staging import StagingArea
from fleet_import.scope import Tenant
from fleet_import.store.models import BatchStatus
from fleet_import.warehouse.redshift.warehouse import RedshiftWarehouse
from flows.reporting import state_for
from tests.faults.conftest import AFTER_STAMP, SLICE_COMMIT, batch_rows, recovered_invariants
from tests.faults.proxy import FaultProxy
from tests.redshift_emulator import RedshiftEmulator
from tests.reliability.conftest import Source

pytestmark = [pytest.mark.faults, pytest.mark.slow]

ROLE = "arn:aws:iam::123456789012:role/fleet-redshift-copy"
OUTAGE_SECONDS = 10.0


@pytest.fixture
def emulator_proxy(emulator: RedshiftEmulator) -> Any:
    with FaultProxy(("127.0.0.1", emulator.port)) as proxy:
        yield proxy


@pytest.fixture
def redshift_ctx(
    emulator: RedshiftEmulator,
    emulator_proxy: FaultProxy,
    repo: Any,
    s3: Any,
    staging_bucket: str,
    tmp_path: Path,
) -> ImportContext:
    warehouse = RedshiftWarehouse(
        emulator.connect_kwargs(port=emulator_proxy.port),
        s3=s3,
        staging_uri=f"s3://{staging_bucket}/redshift/",
        iam_role=ROLE,
        retry_delays=(0.0, 0.0),
    )
    warehouse.ensure_tables(FLEET_DATASETS.values())
    return ImportContext(
        repo=repo,
        warehouse=warehouse,
        s3=s3,
        staging=StagingArea(f"s3://{staging_bucket}/stage/", s3),
        lease_ttl=30,
        workdir=tmp_path / "work",
        commit_readback=spanning(60),
    )


def _copies(emulator: RedshiftEmulator) -> int:
    return sum(1 for q in emulator.queries if q.lstrip().upper().startswith("COPY"))


def test_a_lost_commit_answer_on_redshift_is_settled_by_the_stamp(
    redshift_ctx: ImportContext,
    emulator: RedshiftEmulator,
    emulator_proxy: FaultProxy,
    source: Source,
    database_url: str,
) -> None:
    fired = emulator_proxy.lose_reply(SLICE_COMMIT, after=AFTER_STAMP, then_refuse=OUTAGE_SECONDS)
    outcome = import_folder(redshift_ctx, Tenant.named("acme"), source.folder, "d1")
    assert fired.is_set()
    assert isinstance(outcome, Committed) and outcome.recovered and outcome.published, outcome
    copies = _copies(emulator)
    assert copies == 3  # one COPY per dataset: nothing replayed
    assert recovered_invariants(database_url, source) == []


def test_an_unreadable_stamp_on_redshift_leaves_the_batch_to_the_next_run(
    redshift_ctx: ImportContext,
    emulator: RedshiftEmulator,
    emulator_proxy: FaultProxy,
    source: Source,
    database_url: str,
) -> None:
    redshift_ctx.commit_readback = Backoff((0.5, 0.5), jitter=0.0)
    emulator_proxy.lose_reply(SLICE_COMMIT, after=AFTER_STAMP, then_refuse=600)
    outcome = import_folder(redshift_ctx, Tenant.named("acme"), source.folder, "d1")
    assert isinstance(outcome, CommitUnknown), outcome
    line = state_for(outcome).message or ""  # exit 7's line names Redshift's settings
    assert "check FLEET_REDSHIFT_HOST and FLEET_REDSHIFT_PORT" in line, line
    [(batch_id, status, lease, details)] = batch_rows(database_url)
    assert status == BatchStatus.RUNNING and lease is None and "commit_unknown" in details
    copies = _copies(emulator)
    emulator_proxy.pass_through()
    again = import_folder(redshift_ctx, Tenant.named("acme"), source.folder, "d1")
    assert isinstance(again, Committed) and again.batch_id == batch_id and again.recovered
    assert _copies(emulator) == copies  # settled from the stamp, nothing loaded again
    assert recovered_invariants(database_url, source) == []
