"""Sixteen tenants, each in a process of its own as a flow run is, import at once into the
same curated tables through the Redshift emulator, which locks tables, takes snapshots and
raises 1023s as Redshift does: every batch succeeds, every slice holds exactly its source
rows, and no serializable isolation violation reaches a batch (the short slice transactions
LOCK their tables first, in one order)."""

from __future__ import annotations

import multiprocessing
import uuid
from pathlib import Path
from typing import Any

import pytest

from fleet_import.contracts.fleet import FLEET_DATASETS
from fleet_import.importing.context import Committed, ImportContext
from fleet_import.importing.driver import import_folder
from fleet_import.s3.client import s3_client
from fleet_import.s3.staging import StagingArea
from fleet_import.scope import Tenant
from fleet_import.store.models import BatchStatus
from fleet_import.store.repository import BatchRepository
from fleet_import.warehouse.redshift.warehouse import RedshiftWarehouse
from tests.redshift_emulator import ISOLATION_LEVELS, RedshiftEmulator
from tests.reliability.conftest import connect, make_source, slice_differences, upload_sources

pytestmark = [pytest.mark.slow, pytest.mark.e2e]  # 16 processes at once: `make test-e2e`

TENANTS = 16
ROLE = "arn:aws:iam::123456789012:role/fleet-redshift-copy"
_JOIN_SECONDS = 240


def _import(
    tenant_id: str, folder: str, urls: dict[str, Any], workdir: Path, start: Any, results: Any
) -> None:
    """One tenant's import in a process of its own, as a flow run is; its outcome (the
    batch id, or why not) goes to `results`."""
    s3 = s3_client(urls["s3"])
    ctx = ImportContext(
        repo=BatchRepository(urls["database"]),
        warehouse=RedshiftWarehouse(
            urls["redshift"], s3=s3, staging_uri=f"{urls['staging']}redshift/", iam_role=ROLE
        ),
        s3=s3,
        staging=StagingArea(f"{urls['staging']}stage/", s3),
        lease_ttl=60,
        normalize_workers=1,
        workdir=workdir,
    )
    start.wait()
    try:
        outcome = import_folder(ctx, Tenant.named(tenant_id), folder, "delivery-1")
    except Exception as exc:  # noqa: BLE001 - reported by the test with the others
        outcome = exc
    if isinstance(outcome, Committed):
        results.put((tenant_id, str(outcome.batch_id)))
    else:
        results.put((tenant_id, repr(outcome)))


@pytest.mark.parametrize("isolation_level", ISOLATION_LEVELS)
def test_sixteen_tenants_import_at_once(
    isolation_level: str,
    database_url: str,
    moto_endpoint: str,
    s3: Any,
    landing_bucket: str,
    staging_bucket: str,
    tmp_path: Path,
) -> None:
    sources = [
        make_source(
            landing_bucket, f"tenant{i:02d}", "2026-11-30", seed=i, trips=300, fuel=60, vehicles=12
        )
        for i in range(TENANTS)
    ]
    upload_sources(s3, sources)
    spawn = multiprocessing.get_context("spawn")
    start, results = spawn.Barrier(TENANTS), spawn.Queue()
    with RedshiftEmulator(database_url, s3, isolation_level=isolation_level) as emulator:
        RedshiftWarehouse(
            emulator.connect_kwargs(),
            s3=s3,
            staging_uri=f"s3://{staging_bucket}/redshift/",
            iam_role=ROLE,
        ).ensure_tables(FLEET_DATASETS.values())
        urls = {
            "database": database_url,
            "redshift": emulator.connect_kwargs(),
            "s3": moto_endpoint,
            "staging": f"s3://{staging_bucket}/",
        }
        processes = [
            spawn.Process(
                target=_import,
                args=(s.tenant_id, s.folder, urls, tmp_path / s.tenant_id, start, results),
            )
            for s in sources
        ]
        for process in processes:
            process.start()
        try:
            outcomes = dict(results.get(timeout=_JOIN_SECONDS) for _ in processes)
        finally:
            for process in processes:
                process.join(timeout=10)
                if process.is_alive():
                    process.kill()
        lock_holds = list(emulator.lock_holds)
        refusals = list(emulator.refusals)
    batch_ids: dict[str, uuid.UUID] = {}
    failed = {}
    for tenant_id, outcome in outcomes.items():
        try:
            batch_ids[tenant_id] = uuid.UUID(outcome)
        except ValueError:
            failed[tenant_id] = outcome
    assert not failed and len(outcomes) == TENANTS, failed
    repo = BatchRepository(database_url)
    for source in sources:
        batch = repo.get(batch_ids[source.tenant_id])
        assert batch is not None and batch.status == BatchStatus.SUCCEEDED
        # No failure was recorded and resumed, and no 1023 (SQLSTATE XX000) is kept anywhere
        # in the details: a bare "1023" would also match etags and sizes.
        assert not {"failure", "last_failure", "resumes"} & batch.details.keys(), batch.details
        assert "XX000" not in str(batch.details), batch.details
        assert "Serializable isolation" not in str(batch.details), batch.details
    with connect(database_url) as conn:
        problems = [
            problem
            for source in sources
            # Redshift's stamp column is a VARCHAR: the owner as its text.
            for problem in slice_differences(
                conn,
                source,
                str(batch_ids[source.tenant_id]),
            )
        ]
    assert problems == []
    # Every slice's short transaction, at least, took table locks (its LOCK).
    assert len(lock_holds) >= TENANTS
    assert refusals == []  # nothing Redshift would refuse (tests/redshift_strict.py)
