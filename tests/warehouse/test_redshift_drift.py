"""Drift's DDL on Redshift through the emulator (issue #25, part 1): `evolve` adds the new
column (VARCHAR sized in bytes, BIGINT) by an ALTER TABLE of its own, before the slice's
locked commit, and the values arrive through the Parquet COPY; `review` holds, approval adds
the column and loads the cached content. Provisioned and Serverless."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from fleet_import.contracts.fleet import FLEET_DATASETS, TRIPS
from fleet_import.contracts.model import ContractSet
from fleet_import.importing.context import Committed, Failed, ImportContext
from fleet_import.importing.driver import import_folder
from fleet_import.importing.review import approve_held
from fleet_import.s3.staging import StagingArea
from fleet_import.sample_data import fleet_delivery, today_folder
from fleet_import.scope import Tenant
from fleet_import.store.details import FailureKind
from fleet_import.warehouse.redshift.warehouse import RedshiftWarehouse
from tests.helpers import layout_admission, upload
from tests.redshift_emulator import RedshiftEmulator

pytestmark = pytest.mark.slow

ACME = Tenant.named("acme")
ROLE = "arn:aws:iam::123456789012:role/fleet-redshift-copy"


def with_columns(table_csv: bytes) -> bytes:
    """co2_grams (100, 101, ...) and a text column, plate, at the end of each row."""
    header, *rows = table_csv.decode().strip().split("\n")
    lines = [f"{header},co2_grams,plate"]
    lines += [f"{row},{100 + n},P-{n}" for n, row in enumerate(rows)]
    return ("\n".join(lines) + "\n").encode()


def redshift_ctx(
    emulator: RedshiftEmulator, repo, s3: Any, staging_bucket: str, tmp_path, policy: str
) -> ImportContext:
    warehouse = RedshiftWarehouse(
        emulator.connect_kwargs(),
        s3=s3,
        staging_uri=f"s3://{staging_bucket}/redshift/",
        iam_role=ROLE,
        retry_delays=(0.0, 0.0, 0.0),
    )
    trips = TRIPS.model_copy(update={"on_new_columns": policy})
    others = [c for c in FLEET_DATASETS.values() if c.name != "trips"]
    return ImportContext(
        repo=repo,
        warehouse=warehouse,
        s3=s3,
        staging=StagingArea(f"s3://{staging_bucket}/stage/", s3),
        contracts=ContractSet([*others, trips]),
        lease_ttl=30,
        workdir=tmp_path / "work",
    )


def trips_columns(database_url: str) -> list[tuple[str, str, int | None]]:
    with psycopg.connect(database_url) as conn:
        return conn.execute(
            "SELECT column_name, data_type, character_maximum_length"
            " FROM information_schema.columns WHERE table_schema = 'curated'"
            " AND table_name = 'fleet_trips' ORDER BY ordinal_position"
        ).fetchall()[-3:]


def loaded_values(database_url: str) -> list[tuple]:
    with psycopg.connect(database_url) as conn:
        return conn.execute(
            "SELECT co2_grams, plate FROM curated.fleet_trips"
            " WHERE co2_grams IS NOT NULL ORDER BY co2_grams"
        ).fetchall()


def drifted(s3, landing_bucket: str) -> str:
    folder = today_folder(landing_bucket, "acme")
    files = fleet_delivery(trips=20)
    files["trips-1.csv"] = with_columns(files["trips-1.csv"])
    upload(s3, folder, files)
    return folder


def added_before_the_lock(emulator: RedshiftEmulator) -> None:
    """Each ADD COLUMN ran before the slice's LOCK: never inside its locked commit."""
    queries = emulator.queries
    adds = [i for i, q in enumerate(queries) if "ADD COLUMN" in q]
    locks = [i for i, q in enumerate(queries) if q.startswith("LOCK ")]
    assert len(adds) == 2 and locks, queries
    assert max(adds) < min(i for i in locks if i > min(adds)), queries


def test_evolve_adds_columns_outside_the_locked_commit(
    emulator: RedshiftEmulator,
    database_url: str,
    repo,
    s3,
    staging_bucket,
    landing_bucket,
    tmp_path,
) -> None:
    ctx = redshift_ctx(emulator, repo, s3, staging_bucket, tmp_path, "evolve")
    folder = drifted(s3, landing_bucket)
    outcome = import_folder(ctx, ACME, folder, "d1")
    assert isinstance(outcome, Committed), outcome
    added_before_the_lock(emulator)
    # new_column_type's default, string: as wide as a Redshift VARCHAR goes, in bytes.
    assert trips_columns(database_url)[-2:] == [
        ("co2_grams", "character varying", 65535),
        ("plate", "character varying", 65535),
    ]
    assert loaded_values(database_url) == [(str(100 + n), f"P-{n}") for n in range(10)]


def test_review_holds_then_approval_adds_the_columns_on_redshift(
    emulator: RedshiftEmulator,
    database_url: str,
    repo,
    s3,
    staging_bucket,
    landing_bucket,
    tmp_path,
) -> None:
    ctx = redshift_ctx(emulator, repo, s3, staging_bucket, tmp_path, "review")
    folder = drifted(s3, landing_bucket)
    held = import_folder(ctx, ACME, folder, "d1")
    assert isinstance(held, Failed) and held.kind == FailureKind.HELD, held
    assert not [q for q in emulator.queries if "ADD COLUMN" in q]

    emulator.queries.clear()
    approved = approve_held(ctx, held.batch_id, admission=layout_admission())
    assert isinstance(approved, Committed), approved
    added_before_the_lock(emulator)
    assert approved.summary["cache_hits"] == len(approved.summary["files"])
    assert [name for name, _, _ in trips_columns(database_url)][-2:] == ["co2_grams", "plate"]
    assert loaded_values(database_url) == [(str(100 + n), f"P-{n}") for n in range(10)]
