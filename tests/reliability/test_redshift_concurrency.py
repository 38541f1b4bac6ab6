"""Sixteen tenants import at once into the same curated tables through the Redshift emulator,
which locks tables, takes snapshots and raises 1023s as Redshift does: every batch succeeds,
every slice holds exactly its source rows, and no serializable isolation violation reaches
a batch (the short slice transactions LOCK their tables first, in one order)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from fleet_import.batches import BatchRepository, BatchStatus
from fleet_import.context import Committed, ImportContext
from fleet_import.contracts import FLEET_DATASETS
from fleet_import.pipeline import import_folder
from fleet_import.scope import Tenant
from fleet_import.staging import StagingArea
from fleet_import.warehouse.redshift import RedshiftWarehouse
from tests.redshift_emulator import RedshiftEmulator
from tests.reliability.conftest import connect, make_source, slice_differences, upload_sources

pytestmark = pytest.mark.slow

TENANTS = 16
ROLE = "arn:aws:iam::123456789012:role/fleet-redshift-copy"
_JOIN_SECONDS = 240


def test_sixteen_tenants_import_at_once(
    database_url: str, s3: Any, landing_bucket: str, staging_bucket: str, tmp_path: Path
) -> None:
    sources = [
        make_source(
            landing_bucket, f"tenant{i:02d}", "2026-11-30", seed=i, trips=300, fuel=60, vehicles=12
        )
        for i in range(TENANTS)
    ]
    upload_sources(s3, sources)
    outcomes: dict[str, Any] = {}
    with RedshiftEmulator(database_url, s3) as emulator:
        warehouses = [
            RedshiftWarehouse(
                emulator.connect_kwargs(),
                s3=s3,
                staging_uri=f"s3://{staging_bucket}/redshift/",
                iam_role=ROLE,
            )
            for _ in sources
        ]
        warehouses[0].ensure_tables(FLEET_DATASETS.values())
        start = threading.Barrier(TENANTS)

        def run(source: Any, warehouse: RedshiftWarehouse) -> None:
            ctx = ImportContext(
                repo=BatchRepository(database_url),
                warehouse=warehouse,
                s3=s3,
                staging=StagingArea(f"s3://{staging_bucket}/stage/", s3),
                lease_ttl=60,
                normalize_workers=1,
                workdir=tmp_path / source.tenant_id,
            )
            start.wait()
            try:
                outcomes[source.tenant_id] = import_folder(
                    ctx, Tenant.named(source.tenant_id), source.folder, "delivery-1"
                )
            except Exception as exc:  # noqa: BLE001 - reported below with the others
                outcomes[source.tenant_id] = exc

        threads = [
            threading.Thread(target=run, args=(source, warehouse))
            for source, warehouse in zip(sources, warehouses, strict=True)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=_JOIN_SECONDS)
        assert not any(thread.is_alive() for thread in threads)
        lock_holds = list(emulator.lock_holds)
    failed = {t: o for t, o in outcomes.items() if not isinstance(o, Committed)}
    assert not failed and len(outcomes) == TENANTS, failed
    repo = BatchRepository(database_url)
    for source in sources:
        batch = repo.get(outcomes[source.tenant_id].batch_id)
        assert batch is not None and batch.status == BatchStatus.SUCCEEDED
        assert "1023" not in str(batch.details)
    with connect(database_url) as conn:
        problems = [
            problem
            for source in sources
            # Redshift's stamp column is a VARCHAR: the owner as its text.
            for problem in slice_differences(
                conn,
                source,
                str(outcomes[source.tenant_id].batch_id),  # type: ignore[arg-type]
            )
        ]
    assert problems == []
    # Every slice's short transaction, at least, took table locks (its LOCK).
    assert len(lock_holds) >= TENANTS
