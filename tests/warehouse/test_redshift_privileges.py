"""Least privilege (issue 27, Deliver 3): the Redshift suite logs in as a user with only the
grants docs/redshift.md lists (tests/redshift_grants.py), and `ensure_tables` runs
no DDL it does not need, so that such a user never meets a 42501 for what already exists."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
import redshift_connector

from fleet_import.contracts.fleet import FLEET_DATASETS
from fleet_import.errors import ErrorKind, WarehouseError
from fleet_import.warehouse.redshift.warehouse import RedshiftWarehouse
from tests.redshift_emulator import RedshiftEmulator
from tests.redshift_grants import LOADER

ROLE = "arn:aws:iam::123456789012:role/fleet-redshift-copy"


def warehouse(emulator: RedshiftEmulator, s3: Any, bucket: str) -> RedshiftWarehouse:
    return RedshiftWarehouse(
        emulator.connect_kwargs(),
        s3=s3,
        staging_uri=f"s3://{bucket}/redshift/",
        iam_role=ROLE,
        retry_delays=(0.0,),
    )


def ddl(emulator: RedshiftEmulator) -> list[str]:
    return [q for q in emulator.queries if q.lstrip().upper().startswith(("CREATE", "ALTER"))]


def test_the_suite_logs_in_as_a_user_without_superuser(emulator: RedshiftEmulator) -> None:
    conn = redshift_connector.connect(**emulator.connect_kwargs())
    try:
        cursor = conn.cursor()
        cursor.execute("SELECT current_user, rolsuper FROM pg_roles WHERE rolname = current_user")
        assert [tuple(row) for row in cursor.fetchall()] == [(LOADER, False)]
    finally:
        conn.close()


def test_ensure_tables_creates_only_what_is_missing(
    emulator: RedshiftEmulator, s3: Any, staging_bucket: str
) -> None:
    """The schemas exist (an administrator made them): no CREATE SCHEMA, which would need
    CREATE on the database. The tables are created once; the next call creates nothing."""
    warehouse(emulator, s3, staging_bucket).ensure_tables(FLEET_DATASETS.values())
    first = ddl(emulator)
    assert not [q for q in first if "SCHEMA" in q.upper()], first
    created = sorted(q.split("(")[0] for q in first)
    assert len(created) == 1 + len(FLEET_DATASETS), created  # the registry and each table
    emulator.queries.clear()
    warehouse(emulator, s3, staging_bucket).ensure_tables(FLEET_DATASETS.values())
    assert ddl(emulator) == []


def test_a_missing_schema_without_the_grant_to_create_it_is_a_configuration_error(
    emulator: RedshiftEmulator, s3: Any, staging_bucket: str, db: psycopg.Connection[Any]
) -> None:
    """Nothing pre-created and no CREATE on the database: Redshift's 42501, told once as a
    configuration error (an operator grants it), never retried."""
    db.execute("DROP SCHEMA curated CASCADE")
    with pytest.raises(WarehouseError) as caught:
        warehouse(emulator, s3, staging_bucket).ensure_tables(FLEET_DATASETS.values())
    assert caught.value.kind is ErrorKind.CONFIGURATION
    assert "42501" in str(caught.value) and "permission denied" in str(caught.value)
    assert sum(q.upper().startswith("CREATE SCHEMA") for q in emulator.queries) == 1
