"""RedshiftWarehouse through its real driver (redshift_connector) against the emulator
(tests/redshift_emulator.py, with Redshift's locks and 1023s): S3 staging, COPY ... FORMAT AS
PARQUET MANIFEST into temp tables, the short locked transaction that replaces the slice,
rollback, replays of serializable conflicts and of lost sessions."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fleet_import.contracts.fleet import FLEET_DATASETS, TRIPS, VEHICLES
from fleet_import.errors import WarehouseError
from fleet_import.retry import Backoff
from fleet_import.warehouse.base import DatasetLoad, LoadFile, Warehouse
from fleet_import.warehouse.redshift import slice_sql
from fleet_import.warehouse.redshift.warehouse import RedshiftWarehouse
from tests.redshift_emulator import RedshiftEmulator
from tests.warehouse_helpers import (
    COUNTS,
    commit,
    fleet_loads,
    registry,
    stamps,
    write_normalized,
)

ROLE = "arn:aws:iam::123456789012:role/fleet-redshift-copy"
PASSWORD = "pw-that-must-never-leak"
ACME, GLOBEX = "acme", "globex"
SCOPE = "fleet_s3:s3://fleet-landing/acme/fleet/2026-07-22/"
OTHER_SCOPE = "fleet_s3:s3://fleet-landing/acme/fleet/2026-07-23/"


@pytest.fixture
def redshift(emulator: RedshiftEmulator, s3: Any, staging_bucket: str) -> RedshiftWarehouse:
    wh = RedshiftWarehouse(
        emulator.connect_kwargs(password=PASSWORD),
        s3=s3,
        staging_uri=f"s3://{staging_bucket}/redshift/",
        iam_role=ROLE,
        retry_delays=(0.0, 0.0, 0.0),
    )
    wh.ensure_tables(FLEET_DATASETS.values())
    return wh


def staged_keys(s3: Any, bucket: str) -> list[str]:
    return [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]


# -- tables ------------------------------------------------------------------------------


def test_ensure_tables_creates_redshift_typed_tables(
    redshift: RedshiftWarehouse, db: psycopg.Connection[Any]
) -> None:
    assert isinstance(redshift, Warehouse)
    redshift.ensure_tables(FLEET_DATASETS.values())  # idempotent
    columns = db.execute(
        "SELECT column_name, data_type, character_maximum_length, is_nullable"
        " FROM information_schema.columns WHERE table_schema = 'curated'"
        " AND table_name = 'fleet_vehicles' ORDER BY ordinal_position"
    ).fetchall()
    by_name = {name: (kind, length, nullable) for name, kind, length, nullable in columns}
    assert by_name["vin"] == ("character varying", 68, "NO")
    assert by_name["model_year"][0] == "bigint"
    assert by_name["updated_at"][0] == "timestamp with time zone"
    assert by_name["ingestion_batch_id"] == ("character varying", 36, "NO")
    assert [c[0] for c in columns][-3:] == ["tenant_id", "source_scope", "ingestion_batch_id"]
    # No enforced keys anywhere: Redshift would not enforce them.
    assert db.execute(
        "SELECT count(*) FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace"
        " WHERE n.nspname = 'curated' AND c.contype IN ('p', 'u')"
    ).fetchone() == (0,)


def test_ensure_tables_refuses_a_table_that_no_longer_matches(
    redshift: RedshiftWarehouse,
    emulator: RedshiftEmulator,
    s3: Any,
    staging_bucket: str,
    db: psycopg.Connection[Any],
) -> None:
    db.execute("ALTER TABLE curated.fleet_trips DROP COLUMN status")
    fresh = RedshiftWarehouse(
        emulator.connect_kwargs(), s3=s3, staging_uri=f"s3://{staging_bucket}/r/", iam_role=ROLE
    )
    with pytest.raises(WarehouseError, match="does not match dataset 'trips'") as caught:
        fresh.ensure_tables([TRIPS])
    assert caught.value.transient is False


# -- slices ------------------------------------------------------------------------------


def test_three_datasets_load_typed_and_stamped(
    redshift: RedshiftWarehouse,
    emulator: RedshiftEmulator,
    db: psycopg.Connection[Any],
    tmp_path: Path,
    s3: Any,
    staging_bucket: str,
) -> None:
    loads = fleet_loads(tmp_path, COUNTS)
    result = commit(redshift, loads)
    batch = str(result.batch_id)
    assert result.row_counts == COUNTS
    assert len(emulator.copies) == 3 and redshift.copies == 3  # one COPY per dataset load
    for load in loads:
        table = load.contract.target_table
        assert stamps(db, table) == {(ACME, SCOPE, batch): COUNTS[load.contract.name]}
    assert registry(db, ACME, SCOPE) == {name: (batch, n) for name, n in COUNTS.items()}
    assert redshift.slice_owner(ACME, SCOPE) == result.batch_id
    assert redshift.slice_counts(ACME, SCOPE) == COUNTS
    # Values arrive typed and equal to the Parquet (NULLs, timestamps, doubles, bigints).
    expected = pa.concat_tables(
        [pq.read_table(f.path).select(VEHICLES.column_names) for f in loads[0].files]
    ).to_pylist()
    names = ", ".join(VEHICLES.column_names)
    got = db.execute(f"SELECT {names} FROM curated.fleet_vehicles").fetchall()
    assert sorted(got, key=str) == sorted([tuple(row.values()) for row in expected], key=str)
    # Staged Parquet is removed once the transaction has ended.
    assert staged_keys(s3, staging_bucket) == []


def test_staged_files_carry_only_the_contract_columns_and_a_manifest(
    redshift: RedshiftWarehouse, tmp_path: Path, s3: Any, staging_bucket: str
) -> None:
    loads = fleet_loads(tmp_path, {"trips": 10})
    batch_id = uuid.uuid4()
    with redshift.open_slice(
        tenant_id=ACME, source_scope=SCOPE, batch_id=batch_id, contracts=[TRIPS]
    ) as writer:
        excluded = LoadFile(loads[0].files[0].path, excluded_lines=frozenset({2, 3}))
        assert writer.load_files(TRIPS, [excluded, loads[0].files[1]]) == 8
        keys = staged_keys(s3, staging_bucket)
        assert all(k.startswith(f"redshift/{ACME}/{batch_id}/") for k in keys)
        manifest_key = next(k for k in keys if k.endswith(".manifest"))
        manifest = __import__("json").loads(
            s3.get_object(Bucket=staging_bucket, Key=manifest_key)["Body"].read()
        )
        assert len(manifest["entries"]) == 2
        for entry in manifest["entries"]:
            key = entry["url"].removeprefix(f"s3://{staging_bucket}/")
            body = s3.get_object(Bucket=staging_bucket, Key=key)["Body"].read()
            assert entry["meta"]["content_length"] == len(body) and entry["mandatory"]
            assert pq.read_schema(pa.BufferReader(body)).names == TRIPS.column_names
        assert writer.commit().row_counts == {"trips": 8}


def test_replace_slice_leaves_other_tenants_and_scopes(
    redshift: RedshiftWarehouse, db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    first = commit(redshift, fleet_loads(tmp_path / "a", COUNTS))
    other_scope = commit(redshift, fleet_loads(tmp_path / "b", COUNTS), scope=OTHER_SCOPE)
    globex = commit(redshift, fleet_loads(tmp_path / "c", COUNTS), tenant=GLOBEX)
    smaller = {"vehicles": 10, "trips": 100, "fuel_transactions": 5}
    second = commit(redshift, fleet_loads(tmp_path / "d", smaller))
    assert second.batch_id != first.batch_id
    trips = stamps(db, "curated.fleet_trips")
    assert trips == {
        (ACME, SCOPE, str(second.batch_id)): 100,
        (ACME, OTHER_SCOPE, str(other_scope.batch_id)): 1_000,
        (GLOBEX, SCOPE, str(globex.batch_id)): 1_000,
    }
    assert registry(db, ACME, SCOPE) == {
        name: (str(second.batch_id), n) for name, n in smaller.items()
    }
    assert redshift.slice_owner(ACME, SCOPE) == second.batch_id
    assert redshift.slice_owner(ACME, "fleet_s3:s3://nowhere/") is None
    # A later slice without a dataset removes that dataset's old rows and registration.
    third = commit(redshift, fleet_loads(tmp_path / "e", {"trips": 7}))
    assert registry(db, ACME, SCOPE) == {"trips": (str(third.batch_id), 7)}
    assert (ACME, SCOPE, str(second.batch_id)) not in stamps(db, "curated.fleet_vehicles")
    assert redshift.slice_counts(ACME, SCOPE) == {"trips": 7}


def test_a_failure_mid_load_rolls_back_and_keeps_the_old_slice(
    redshift: RedshiftWarehouse,
    db: psycopg.Connection[Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    s3: Any,
    staging_bucket: str,
) -> None:
    old = commit(redshift, fleet_loads(tmp_path / "old", COUNTS))
    loads = fleet_loads(tmp_path / "new", COUNTS)
    writer = redshift.open_slice(
        tenant_id=ACME,
        source_scope=SCOPE,
        batch_id=uuid.uuid4(),
        contracts=[load.contract for load in loads],
    )
    writer.load_files(loads[0].contract, loads[0].files)
    # The staging table gets one column too many: COPY's positional count check fails.
    real = slice_sql.create_staging_sql
    monkeypatch.setattr(
        slice_sql, "create_staging_sql", lambda c: real(c)[:-1] + ', "extra" BIGINT)'
    )
    with pytest.raises(WarehouseError, match="Parquet files have 9 columns") as caught:
        writer.load_files(loads[1].contract, loads[1].files)
    assert caught.value.transient is False
    with pytest.raises(WarehouseError, match="already committed or rolled back"):
        writer.commit()
    writer.close()  # idempotent
    assert stamps(db, "curated.fleet_trips") == {(ACME, SCOPE, str(old.batch_id)): 1_000}
    assert redshift.slice_owner(ACME, SCOPE) == old.batch_id
    assert redshift.slice_counts(ACME, SCOPE) == COUNTS
    assert staged_keys(s3, staging_bucket) == []


def test_an_unreadable_file_fails_before_copy_and_rolls_back(
    redshift: RedshiftWarehouse, db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    old = commit(redshift, fleet_loads(tmp_path / "old", {"trips": 10}))
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet")
    with pytest.raises(WarehouseError, match="cannot read normalized file"):
        commit(redshift, [DatasetLoad(TRIPS, (LoadFile(bad),))])
    assert stamps(db, "curated.fleet_trips") == {(ACME, SCOPE, str(old.batch_id)): 10}


def test_discard_keys_deletes_every_copy_of_a_key(
    redshift: RedshiftWarehouse, db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    # Two files that both start at trip 0: trips 0..4 appear twice.
    first = write_normalized(tmp_path / "t1.parquet", TRIPS, 20)
    second = write_normalized(tmp_path / "t2.parquet", TRIPS, 5)
    batch_id = uuid.uuid4()
    with redshift.open_slice(
        tenant_id=ACME, source_scope=SCOPE, batch_id=batch_id, contracts=[TRIPS]
    ) as writer:
        assert writer.load_files(TRIPS, [first, second]) == 25
        keys = pa.table({"trip_id": [f"trip_id-{n}" for n in range(5)]})
        assert writer.discard_keys(TRIPS, keys) == 10
        assert writer.discard_keys(TRIPS, keys.slice(0, 0)) == 0
        assert writer.commit().row_counts == {"trips": 15}
    assert stamps(db, "curated.fleet_trips") == {(ACME, SCOPE, str(batch_id)): 15}
    assert registry(db, ACME, SCOPE) == {"trips": (str(batch_id), 15)}


def test_a_serializable_conflict_at_commit_replays_only_the_short_transaction(
    redshift: RedshiftWarehouse,
    emulator: RedshiftEmulator,
    db: psycopg.Connection[Any],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    old = commit(redshift, fleet_loads(tmp_path / "old", COUNTS))
    emulator.copies.clear()
    emulator.fail_commits = 1
    with caplog.at_level(logging.WARNING, logger="fleet_import.warehouse.redshift"):
        new = commit(redshift, fleet_loads(tmp_path / "new", COUNTS))
    assert emulator.fail_commits == 0
    assert len(emulator.copies) == 3  # the temp tables survived: no COPY ran again
    assert redshift.replays == 1
    assert "SQLSTATE XX000): 1023" in caplog.text  # Redshift's shape: XX000, message 1023
    assert stamps(db, "curated.fleet_trips") == {(ACME, SCOPE, str(new.batch_id)): 1_000}
    assert registry(db, ACME, SCOPE)["trips"] == (str(new.batch_id), 1_000)
    assert new.batch_id != old.batch_id


def test_a_lost_session_loads_its_temp_tables_again(
    redshift: RedshiftWarehouse,
    emulator: RedshiftEmulator,
    db: psycopg.Connection[Any],
    tmp_path: Path,
) -> None:
    """The temp tables die with their session: a new session COPYs the staged files again
    before the short transaction, and reports itself through on_session first."""
    sessions: list[Any] = []
    loads = fleet_loads(tmp_path, COUNTS)
    with redshift.open_slice(
        tenant_id=ACME,
        source_scope=SCOPE,
        batch_id=uuid.uuid4(),
        contracts=[load.contract for load in loads],
        on_session=sessions.append,
    ) as writer:
        for load in loads:
            writer.load_files(load.contract, load.files)
        db.execute("SELECT pg_terminate_backend(%s)", (sessions[0].pid,))
        result = writer.commit()
    assert len(sessions) == 2 and sessions[0] != sessions[1]
    assert len(emulator.copies) == 6 and redshift.replays == 1
    assert redshift.slice_counts(ACME, SCOPE) == COUNTS == result.row_counts


def test_loading_takes_no_lock_another_slice_waits_for(
    redshift: RedshiftWarehouse,
    emulator: RedshiftEmulator,
    db: psycopg.Connection[Any],
    tmp_path: Path,
) -> None:
    """A slice being loaded holds no lock on a curated table: another tenant's slice of the
    same tables commits meanwhile, and then the first commits without a conflict."""
    loads = fleet_loads(tmp_path / "a", COUNTS)
    with redshift.open_slice(
        tenant_id=ACME,
        source_scope=SCOPE,
        batch_id=uuid.uuid4(),
        contracts=[load.contract for load in loads],
    ) as writer:
        for load in loads:
            writer.load_files(load.contract, load.files)
        emulator.lock_holds.clear()
        other = commit(redshift, fleet_loads(tmp_path / "b", COUNTS), tenant=GLOBEX)
        assert len(emulator.lock_holds) == 1  # the other slice's short transaction only
        first = writer.commit()
    assert redshift.replays == 0
    assert stamps(db, "curated.fleet_trips") == {
        (ACME, SCOPE, str(first.batch_id)): 1_000,
        (GLOBEX, SCOPE, str(other.batch_id)): 1_000,
    }
    lock = next(q for q in emulator.queries if q.startswith("LOCK "))
    assert lock == (
        'LOCK "curated"."fleet_fuel_transactions", "curated"."fleet_trips", '
        '"curated"."fleet_vehicles", "curated"."ingestion_slices"'
    )


def test_persistent_conflicts_give_up_transient_and_keep_the_old_slice(
    redshift: RedshiftWarehouse,
    emulator: RedshiftEmulator,
    db: psycopg.Connection[Any],
    tmp_path: Path,
) -> None:
    old = commit(redshift, fleet_loads(tmp_path / "old", {"trips": 10}))
    emulator.fail_commits = 10
    with pytest.raises(WarehouseError, match="XX000.*1023") as caught:
        commit(redshift, fleet_loads(tmp_path / "new", {"trips": 20}))
    assert caught.value.transient is True
    assert "Serializable isolation violation on table" in str(caught.value)  # the detail
    assert emulator.fail_commits == 6  # one attempt and three retries
    assert stamps(db, "curated.fleet_trips") == {(ACME, SCOPE, str(old.batch_id)): 10}


def test_no_credentials_in_sql_or_logs(
    redshift: RedshiftWarehouse,
    emulator: RedshiftEmulator,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    emulator.fail_commits = 1  # the retry path logs too
    with caplog.at_level(logging.DEBUG):
        commit(redshift, fleet_loads(tmp_path, COUNTS))
    secrets = (PASSWORD, "testing")  # the database password; moto's fake AWS key and secret
    text = "\n".join(emulator.queries)
    copies = [sql for sql in emulator.queries if sql.startswith("COPY")]
    assert copies and all(f"IAM_ROLE '{ROLE}'" in sql for sql in copies)
    assert all("CREDENTIALS" not in sql.upper() for sql in copies)
    # Our logs and the driver's (botocore's own debug log names its access key id).
    logged = "\n".join(
        r.getMessage()
        for r in caplog.records
        if r.name.startswith(("fleet_import", "redshift_connector"))
    )
    assert "SQLSTATE XX000): 1023" in logged
    for secret in secrets:
        assert secret not in text
        assert secret not in logged
    assert PASSWORD not in repr(redshift)


def test_connection_failures_are_transient(s3: Any, staging_bucket: str) -> None:
    wh = RedshiftWarehouse(
        {
            "host": "127.0.0.1",
            "port": 1,
            "database": "x",
            "user": "u",
            "password": "p",
            "ssl": False,
            "timeout": 2,
        },
        s3=s3,
        staging_uri=f"s3://{staging_bucket}/r/",
        iam_role=ROLE,
        retry_delays=(),
    )
    with pytest.raises(WarehouseError) as caught:
        wh.slice_owner(ACME, SCOPE)
    assert caught.value.transient is True
    assert "p'" not in str(caught.value)


# -- the pipeline on Redshift -------------------------------------------------------------


def test_import_folder_end_to_end(
    redshift: RedshiftWarehouse,
    repo: Any,
    s3: Any,
    landing_bucket: str,
    staging_bucket: str,
    db: psycopg.Connection[Any],
    tmp_path: Path,
) -> None:
    from fleet_import.importing.context import Committed
    from fleet_import.importing.driver import import_folder
    from fleet_import.sample_data import fleet_delivery, today_folder
    from fleet_import.scope import Tenant, source_scope
    from tests.helpers import upload

    ctx = _redshift_ctx(redshift, repo, s3, staging_bucket, tmp_path)
    folder = today_folder(landing_bucket, "acme")
    files = fleet_delivery(trips=300, fuel=120, vehicles=25)
    header, first_row = files["trips-1.csv"].split(b"\n")[:2]
    files["trips-3.csv"] = header + b"\n" + first_row + b"\n"  # a duplicate key: discarded
    upload(s3, folder, files)
    outcome = import_folder(ctx, Tenant.named("acme"), folder, "delivery-1")
    assert isinstance(outcome, Committed), outcome
    assert outcome.row_counts == {"vehicles": 25, "trips": 299, "fuel_transactions": 120}
    scope = source_scope(folder)
    assert redshift.slice_owner("acme", scope) == outcome.batch_id
    assert redshift.slice_counts("acme", scope) == outcome.row_counts
    assert stamps(db, "curated.fleet_trips") == {("acme", scope, str(outcome.batch_id)): 299}
    again = import_folder(ctx, Tenant.named("acme"), folder, "delivery-2", force=True)
    assert isinstance(again, Committed) and again.batch_id != outcome.batch_id
    assert stamps(db, "curated.fleet_trips") == {("acme", scope, str(again.batch_id)): 299}


# -- the emulator itself -------------------------------------------------------------------


def test_emulator_refuses_ssl_and_reports_redshift_version(emulator: RedshiftEmulator) -> None:
    import socket
    import struct

    import redshift_connector

    with socket.create_connection(("127.0.0.1", emulator.port), timeout=5) as raw:
        raw.sendall(struct.pack("!ii", 8, 80877103))  # SSLRequest
        assert raw.recv(1) == b"N"
    conn = redshift_connector.connect(**emulator.connect_kwargs())
    try:
        assert (b"server_version", b"8.0.2") in conn.parameter_statuses
        cursor = conn.cursor()
        with pytest.raises(redshift_connector.ProgrammingError, match="does not exist"):
            cursor.execute(
                f"COPY \"missing\" FROM 's3://nowhere/x' IAM_ROLE '{ROLE}' FORMAT AS PARQUET"
            )
        conn.rollback()
        cursor.execute("SELECT 1")  # the connection survived the error
        assert cursor.fetchall() == ([1],)
    finally:
        conn.close()


# -- crash windows and resume, as on PostgreSQL ----------------------------------------------


def _copies(emulator: RedshiftEmulator) -> int:
    return sum(1 for q in emulator.queries if q.lstrip().upper().startswith("COPY"))


def _redshift_ctx(redshift, repo, s3, staging_bucket, tmp_path, publisher=None):
    from fleet_import.importing.context import ImportContext
    from fleet_import.s3.staging import StagingArea

    return ImportContext(
        repo=repo,
        warehouse=redshift,
        s3=s3,
        staging=StagingArea(f"s3://{staging_bucket}/stage/", s3),
        lease_ttl=30,
        workdir=tmp_path / "work",
        publisher=publisher,
    )


def test_publication_failure_resumes_without_a_copy(
    redshift: RedshiftWarehouse,
    emulator: RedshiftEmulator,
    repo: Any,
    outbox: Any,
    s3: Any,
    landing_bucket: str,
    staging_bucket: str,
    tmp_path: Path,
) -> None:
    from fleet_import.importing.context import Committed, Failed
    from fleet_import.importing.driver import import_folder
    from fleet_import.importing.resume import resume_batch
    from fleet_import.publication.publisher import Publisher
    from fleet_import.sample_data import fleet_delivery, today_folder
    from fleet_import.scope import Tenant
    from fleet_import.store.models import BatchStatus
    from tests.helpers import upload

    publisher = Publisher(repo, outbox, redshift, events=lambda n, p: None, backoff=Backoff((0.0,)))
    calls: list[int] = []
    notify = publisher.steps["notify"]

    def flaky_notify(step_ctx: Any) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("notification service is down")
        notify(step_ctx)

    publisher.steps["notify"] = flaky_notify
    ctx = _redshift_ctx(redshift, repo, s3, staging_bucket, tmp_path, publisher)
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=50, fuel=20, vehicles=5))
    failed = import_folder(ctx, Tenant.named("acme"), folder, "d1")
    assert isinstance(failed, Failed) and failed.kind == "failed_publication"
    copies = _copies(emulator)
    assert copies >= 3  # the import itself did COPY each dataset
    resumed = resume_batch(ctx, outbox, failed.batch_id)
    assert isinstance(resumed, Committed) and resumed.published, resumed
    assert _copies(emulator) == copies  # not a row copied again
    assert repo.get(failed.batch_id).status == BatchStatus.SUCCEEDED
    assert redshift.slice_counts("acme", resumed.scope)["trips"] == 50


def _child_redshift_env(
    emulator: RedshiftEmulator, staging_bucket: str, **extra: object
) -> dict[str, str]:
    """What tests.import_child needs to load through the emulator (FLEET_TEST_REDSHIFT)."""
    import json

    config = {
        "connect": emulator.connect_kwargs(password=PASSWORD),
        "staging_uri": f"s3://{staging_bucket}/redshift/",
        "iam_role": ROLE,
        **extra,
    }
    return {"FLEET_TEST_REDSHIFT": json.dumps(config)}


@pytest.mark.slow
@pytest.mark.crash  # a child killed at its failpoint: make test-crash
def test_death_after_the_warehouse_commit_is_recovered_from_the_stamp(
    redshift: RedshiftWarehouse,
    emulator: RedshiftEmulator,
    repo: Any,
    s3: Any,
    moto_endpoint: str,
    landing_bucket: str,
    staging_bucket: str,
    database_url: str,
    tmp_path: Path,
) -> None:
    import time

    from fleet_import.importing.context import Committed
    from fleet_import.importing.driver import import_folder
    from fleet_import.sample_data import fleet_delivery, today_folder
    from fleet_import.scope import Tenant
    from fleet_import.store.models import BatchStatus
    from tests.helpers import upload
    from tests.import_child import KILLED, run_import_child

    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=40, fuel=10, vehicles=5))
    child = run_import_child(
        database_url,
        moto_endpoint,
        staging_bucket,
        folder,
        "d1",
        workdir=tmp_path / "child",
        env={
            "FLEET_FAILPOINTS": "after_warehouse_commit",
            **_child_redshift_env(emulator, staging_bucket),
        },
    )
    assert child.returncode == KILLED, child.stderr[-3000:]
    (batch,) = repo.list()
    assert batch.status == BatchStatus.RUNNING and not batch.details["warehouse_committed"]
    time.sleep(1.7)
    copies = _copies(emulator)
    assert copies >= 3  # the child's COPYs went through the emulator
    ctx = _redshift_ctx(redshift, repo, s3, staging_bucket, tmp_path)
    outcome = import_folder(ctx, Tenant.named("acme"), folder, "d1")
    assert isinstance(outcome, Committed) and outcome.recovered, outcome
    assert outcome.batch_id == batch.id and _copies(emulator) == copies
    assert repo.get(batch.id).status == BatchStatus.SUCCEEDED
    assert redshift.slice_counts("acme", outcome.scope)["trips"] == 40


@pytest.mark.slow
@pytest.mark.crash  # a SIGSTOPped holder: make test-crash
def test_a_frozen_holder_is_ended_with_pg_terminate_backend(
    redshift: RedshiftWarehouse,
    emulator: RedshiftEmulator,
    repo: Any,
    s3: Any,
    moto_endpoint: str,
    landing_bucket: str,
    staging_bucket: str,
    database_url: str,
    db: psycopg.Connection[Any],
    tmp_path: Path,
) -> None:
    """A worker SIGSTOPped inside its short slice transaction, holding its LOCKs on the
    curated tables and the registry, keeps its session and locks; once its lease expired,
    the next delivery ends that session (STV_SESSIONS, PG_TERMINATE_BACKEND) and loads
    without waiting for the freeze. Its registry read, blocked by the LOCK, gives up after
    lock_wait_seconds instead of waiting for ever."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from fleet_import.sample_data import fleet_delivery, today_folder
    from fleet_import.store.models import BatchStatus
    from tests.helpers import upload
    from tests.import_child import run_import_child

    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=40, fuel=10, vehicles=5))
    env = _child_redshift_env(emulator, staging_bucket, lock_wait=2.0)
    release = tmp_path / "never"
    arguments = [
        database_url,
        moto_endpoint,
        f"s3://{staging_bucket}/stage/",
        "acme",
        folder,
        "d1",
        "1.5",
        str(tmp_path / "frozen"),
    ]
    frozen = subprocess.Popen(
        [sys.executable, "-m", "tests.import_child", *arguments],
        env={**os.environ, **env, "FLEET_FAILPOINTS": f"slice_locked=wait:{release}"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert frozen.poll() is None, frozen.communicate()
            batches = repo.list()
            session = batches[0].details.get("warehouse_session") if batches else None
            row = (
                session
                and db.execute(
                    "SELECT state, (SELECT count(*) FROM pg_locks l WHERE l.pid = a.pid AND"
                    " l.mode = 'AccessExclusiveLock' AND l.relation = 'curated.ingestion_slices'"
                    "::regclass) FROM pg_stat_activity a WHERE pid = %s",
                    (session["pid"],),
                ).fetchone()
            )
            # Its short transaction LOCKed the registry (and the curated tables) and waits.
            if row == ("idle in transaction", 1):
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"the child never reached its failpoint inside the slice: {row}")
        os.kill(frozen.pid, signal.SIGSTOP)
        time.sleep(2.0)
        successor = run_import_child(
            database_url,
            moto_endpoint,
            staging_bucket,
            folder,
            "d2",
            workdir=tmp_path / "next",
            env=env,
            timeout=120,
        )
        assert successor.returncode == 0, successor.stderr[-3000:]
        assert successor.stdout.startswith("Committed"), successor.stdout
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
        release.touch()
        frozen.communicate(timeout=120)
    assert frozen.returncode != 0  # woken, its session is gone and its lease too
    (batch,) = repo.list()  # the same content: the successor continued the batch
    assert batch.status == BatchStatus.SUCCEEDED
    assert redshift.slice_owner("acme", batch.source_scope) == batch.id
    assert stamps(db, "curated.fleet_trips") == {("acme", batch.source_scope, str(batch.id)): 40}


def test_a_persistent_conflict_is_retried_by_one_layer_only(
    redshift: RedshiftWarehouse,
    emulator: RedshiftEmulator,
    repo: Any,
    s3: Any,
    landing_bucket: str,
    staging_bucket: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The Redshift writer replays its short transaction itself, so the pipeline does not
    retry the slice on top of it: one attempt and the writer's three replays, not 4 x 4, and
    the temp tables loaded once."""
    from fleet_import.importing import load as loading
    from fleet_import.importing.context import Failed
    from fleet_import.importing.driver import import_folder
    from fleet_import.sample_data import fleet_delivery, today_folder
    from fleet_import.scope import Tenant
    from tests.helpers import upload

    monkeypatch.setattr(loading, "LOAD_BACKOFF", Backoff((0.0, 0.0, 0.0)))
    ctx = _redshift_ctx(redshift, repo, s3, staging_bucket, tmp_path)
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=20, fuel=5, vehicles=3))
    emulator.fail_commits = 100
    outcome = import_folder(ctx, Tenant.named("acme"), folder, "d1")
    assert isinstance(outcome, Failed) and "1023" in outcome.error, outcome
    assert emulator.fail_commits == 100 - 4
    assert len(emulator.copies) == 3  # each dataset's COPY into its temp table, once


# -- provisioned and Serverless ------------------------------------------------------------


def test_sessions_are_named_and_ended_through_what_the_deployment_offers(
    redshift: RedshiftWarehouse,
    emulator: RedshiftEmulator,
    db: psycopg.Connection[Any],
    tmp_path: Path,
) -> None:
    """A cluster names a session by STV_SESSIONS; a Serverless workgroup, which refuses STV
    tables, by pg_backend_pid() and SYS_SESSION_HISTORY. Either way the recorded session is
    the slice's own backend, and end_session terminates it (and only while it exists): the
    writer goes on in a new session, recorded too."""
    sessions: list[Any] = []
    loads = fleet_loads(tmp_path, COUNTS)
    assert redshift.sessions.serverless is emulator.serverless
    with redshift.open_slice(
        tenant_id=ACME,
        source_scope=SCOPE,
        batch_id=uuid.uuid4(),
        contracts=[load.contract for load in loads],
        on_session=sessions.append,
    ) as writer:
        (session,) = sessions
        (backend,) = db.execute(
            "SELECT (backend_start AT TIME ZONE 'UTC') FROM pg_stat_activity WHERE pid = %s",
            (session.pid,),
        ).fetchone()
        assert session.started == backend.isoformat()
        assert redshift.end_session(session) is True
        writer.load_files(loads[0].contract, loads[0].files)  # on a new session, recorded
    assert len(sessions) == 2 and sessions[1] != session
    assert redshift.end_session(session) is False  # gone: nothing to end
    stv = [q for q in emulator.queries if "stv_" in q.lower()]
    assert bool(stv) is not emulator.serverless


def test_a_session_the_catalog_does_not_show_leaves_only_the_lease_fence(
    redshift: RedshiftWarehouse,
    emulator: RedshiftEmulator,
    db: psycopg.Connection[Any],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The documented fallback (docs/redshift.md): when the session catalog answers nothing,
    no session is recorded (a warning says so) and the slice still commits."""
    db.execute("DROP VIEW IF EXISTS public.stv_sessions")
    db.execute("DROP VIEW public.sys_session_history")
    db.execute(
        "CREATE VIEW public.sys_session_history AS SELECT 0 AS session_id, "
        "LOCALTIMESTAMP AS start_time, 'active'::text AS status WHERE false"
    )
    if not emulator.serverless:  # a cluster's STV_SESSIONS, empty likewise
        db.execute(
            "CREATE VIEW public.stv_sessions AS SELECT 0 AS process, "
            "LOCALTIMESTAMP AS starttime WHERE false"
        )
        db.execute(f"GRANT SELECT ON public.stv_sessions TO {emulator.user}")
    db.execute(f"GRANT SELECT ON public.sys_session_history TO {emulator.user}")
    db.commit()
    sessions: list[Any] = []
    loads = fleet_loads(tmp_path, COUNTS)
    caplog.set_level(logging.WARNING, logger="fleet_import.warehouse.redshift")
    with redshift.open_slice(
        tenant_id=ACME,
        source_scope=SCOPE,
        batch_id=uuid.uuid4(),
        contracts=[load.contract for load in loads],
        on_session=sessions.append,
    ) as writer:
        for load in loads:
            writer.load_files(load.contract, load.files)
        result = writer.commit()
    assert sessions == []
    assert "not in the session catalog" in caplog.text
    assert stamps(db, "curated.fleet_trips") == {(ACME, SCOPE, str(result.batch_id)): 1_000}
