"""The slice writers run on what they are given (a connect callable, counters, and on
Redshift the staging area, the COPY role and a Backoff), with no warehouse behind them: a
writer built by hand loads, replays and counts exactly as one opened by its warehouse."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pytest

from fleet_import.config import libpq_url
from fleet_import.contracts.fleet import FLEET_DATASETS, TRIPS
from fleet_import.errors import WarehouseError
from fleet_import.retry import Backoff
from fleet_import.s3.staging import StagingArea
from fleet_import.warehouse.committer import SliceRequest, WriterCounters
from fleet_import.warehouse.postgres import driver as postgres_driver
from fleet_import.warehouse.postgres.warehouse import PostgresWarehouse
from fleet_import.warehouse.postgres.writer import PostgresSliceWriter
from fleet_import.warehouse.redshift import driver as redshift_driver
from fleet_import.warehouse.redshift.warehouse import RedshiftWarehouse
from fleet_import.warehouse.redshift.writer import RedshiftSliceWriter
from tests.redshift_emulator import RedshiftEmulator
from tests.warehouse_helpers import ACME, SCOPE, fleet_loads, stamps

ROLE = "arn:aws:iam::123456789012:role/fleet-redshift-copy"
NO_WAIT = Backoff((0.0,), jitter=0.0)
"""One replay, at once."""


@pytest.fixture
def emulator(database_url: str, s3: Any) -> Iterator[RedshiftEmulator]:
    with RedshiftEmulator(database_url, s3) as emu:
        yield emu


def _request(batch_id: uuid.UUID) -> SliceRequest:
    return SliceRequest(ACME, SCOPE, batch_id, {TRIPS.name: TRIPS})


def test_a_postgres_writer_needs_only_a_connection_and_counters(
    database_url: str, db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    warehouse = PostgresWarehouse(database_url)
    warehouse.ensure_tables([TRIPS])
    connections: list[object] = []

    def connect() -> psycopg.Connection[Any]:
        conn = postgres_driver.connect(libpq_url(database_url))
        connections.append(conn)
        return conn

    counters = WriterCounters()
    [trips] = fleet_loads(tmp_path, {"trips": 7})
    batch_id = uuid.uuid4()
    with PostgresSliceWriter(_request(batch_id), connect=connect, counters=counters) as writer:
        assert writer.load_files(TRIPS, trips.files) == 7
        assert writer.commit().row_counts == {"trips": 7}
    assert len(connections) == 1  # one transaction, one connection
    assert counters == WriterCounters(copies=1, replays=0)
    assert warehouse.copies == 0  # the warehouse reports its own writers' counters only
    assert warehouse.slice_owner(ACME, SCOPE) == batch_id
    assert stamps(db, TRIPS.target_table) == {(ACME, SCOPE, batch_id): 7}


def _redshift_writer(
    emulator: RedshiftEmulator, s3: Any, staging_uri: str, counters: WriterCounters
) -> RedshiftSliceWriter:
    return RedshiftSliceWriter(
        _request(uuid.uuid4()),
        connect=partial(redshift_driver.connect, emulator.connect_kwargs()),
        staging=StagingArea(staging_uri, s3),
        iam_role=ROLE,
        backoff=NO_WAIT,
        counters=counters,
    )


def test_a_redshift_writer_replays_by_the_backoff_it_is_given(
    emulator: RedshiftEmulator, s3: Any, staging_bucket: str, tmp_path: Path
) -> None:
    staging_uri = f"s3://{staging_bucket}/writers/"
    warehouse = RedshiftWarehouse(
        emulator.connect_kwargs(), s3=s3, staging_uri=staging_uri, iam_role=ROLE
    )
    warehouse.ensure_tables(FLEET_DATASETS.values())
    [trips] = fleet_loads(tmp_path, {"trips": 5})

    counters = WriterCounters()
    with _redshift_writer(emulator, s3, staging_uri, counters) as writer:
        writer.load_files(TRIPS, trips.files)
        emulator.fail_commits = 1  # the slice commit's first COMMIT: one replay passes
        committed = writer.commit()
    assert counters == WriterCounters(copies=1, replays=1)
    assert warehouse.slice_owner(ACME, SCOPE) == committed.batch_id

    counters = WriterCounters()
    with _redshift_writer(emulator, s3, staging_uri, counters) as writer:
        writer.load_files(TRIPS, trips.files)
        emulator.fail_commits = 2  # more than the one replay the backoff allows
        with pytest.raises(WarehouseError) as caught:
            writer.commit()
        assert caught.value.transient
        with pytest.raises(WarehouseError, match="already committed or rolled back"):
            writer.commit()
    assert counters == WriterCounters(copies=1, replays=1)
    assert warehouse.replays == 0  # neither writer was the warehouse's
    assert warehouse.slice_owner(ACME, SCOPE) == committed.batch_id
