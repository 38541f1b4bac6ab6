"""Redshift's real error family through the real driver and the emulator, on a provisioned
cluster and on Serverless: each transient shape is retried and the slice lands; a terminal
one fails the batch once, with its message; what redshift_connector raises outside its own
hierarchy is caught at the driver boundary."""

from __future__ import annotations

import contextlib
import ssl
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redshift_connector

from fleet_import.contracts.fleet import FLEET_DATASETS
from fleet_import.errors import ErrorKind, WarehouseError
from fleet_import.explain import explain
from fleet_import.warehouse.redshift import driver
from fleet_import.warehouse.redshift.warehouse import RedshiftWarehouse
from tests.redshift_emulator import RedshiftEmulator
from tests.redshift_grants import give
from tests.warehouse_helpers import ACME, COUNTS, SCOPE, commit, fleet_loads, stamps

ROLE = "arn:aws:iam::123456789012:role/fleet-redshift-copy"
S3_THROTTLED = (
    "Spectrum Scan Error",
    "\n  error:  Spectrum Scan Error\n  code:      15007\n  context:   "
    "S3ServiceException:Please reduce your request rate.,Status 503,Error SlowDown\n",
)
S3_UNREACHABLE = ("S3Query Exception Connection failed, retries exceeded.", "  code:      15005")
RELATION_GONE = ("could not open relation with OID 6134794", "")
BAD_PARQUET = (
    "Spectrum Scan Error",
    "\n  error:  Spectrum Scan Error\n  code:      15007\n  context:   File "
    "'https://s3.eu-west-1.amazonaws.com/b/k.parquet' has an incompatible Parquet schema "
    "for column 's3://b/k.parquet.started_at'\n",
)


@pytest.fixture
def redshift(emulator: RedshiftEmulator, s3: Any, staging_bucket: str) -> RedshiftWarehouse:
    wh = RedshiftWarehouse(
        emulator.connect_kwargs(),
        s3=s3,
        staging_uri=f"s3://{staging_bucket}/redshift/",
        iam_role=ROLE,
        retry_delays=(0.0, 0.0, 0.0),
    )
    wh.ensure_tables(FLEET_DATASETS.values())
    return wh


@pytest.mark.parametrize("shape", [S3_THROTTLED, S3_UNREACHABLE, RELATION_GONE], ids=str)
def test_a_transient_copy_error_is_retried_and_the_slice_lands(
    redshift: RedshiftWarehouse,
    emulator: RedshiftEmulator,
    db: psycopg.Connection[Any],
    tmp_path: Path,
    shape: tuple[str, str],
) -> None:
    message, detail = shape
    emulator.fail_next("copy", message, detail=detail)
    result = commit(redshift, fleet_loads(tmp_path, COUNTS))
    assert emulator.failures == [] and redshift.replays == 1
    assert stamps(db, "curated.fleet_trips") == {(ACME, SCOPE, str(result.batch_id)): 1_000}


def test_a_transient_commit_error_replays_the_short_transaction(
    redshift: RedshiftWarehouse,
    emulator: RedshiftEmulator,
    db: psycopg.Connection[Any],
    tmp_path: Path,
) -> None:
    emulator.copies.clear()
    emulator.fail_next("commit", RELATION_GONE[0], detail=RELATION_GONE[1])
    result = commit(redshift, fleet_loads(tmp_path, COUNTS))
    assert emulator.failures == [] and redshift.replays == 1
    assert len(emulator.copies) == 3  # the temp tables survived
    assert stamps(db, "curated.fleet_trips") == {(ACME, SCOPE, str(result.batch_id)): 1_000}


def test_a_terminal_copy_error_fails_the_batch_once_with_its_message(
    redshift: RedshiftWarehouse,
    emulator: RedshiftEmulator,
    repo: Any,
    s3: Any,
    landing_bucket: str,
    staging_bucket: str,
    db: psycopg.Connection[Any],
    tmp_path: Path,
) -> None:
    """Bad data is not retried by the writer nor by the pipeline: one COPY refused, the
    batch failed with Spectrum's own words, no slice written."""
    from fleet_import.importing.context import Failed, ImportContext
    from fleet_import.importing.driver import import_folder
    from fleet_import.s3.staging import StagingArea
    from fleet_import.sample_data import fleet_delivery, today_folder
    from fleet_import.scope import Tenant
    from fleet_import.store.models import BatchStatus
    from tests.helpers import upload

    ctx = ImportContext(
        repo=repo,
        warehouse=redshift,
        s3=s3,
        staging=StagingArea(f"s3://{staging_bucket}/stage/", s3),
        lease_ttl=30,
        workdir=tmp_path / "work",
    )
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=20, fuel=5, vehicles=3))
    message, detail = BAD_PARQUET
    emulator.fail_next("copy", message, detail=detail)
    emulator.fail_next("copy", message, detail=detail)  # a retry would meet this one
    outcome = import_folder(ctx, Tenant.named("acme"), folder, "d1")
    assert isinstance(outcome, Failed), outcome
    assert "Spectrum Scan Error" in outcome.error
    assert "incompatible Parquet schema" in outcome.error
    assert len(emulator.failures) == 1  # refused once, never tried again
    assert redshift.replays == 0 and not emulator.copies
    (batch,) = repo.list()
    assert batch.status == BatchStatus.FAILED
    assert stamps(db, "curated.fleet_trips") == {}


# -- the driver boundary -------------------------------------------------------------------


def test_a_driver_key_error_is_retried_on_a_new_connection(
    redshift: RedshiftWarehouse,
    emulator: RedshiftEmulator,
    db: psycopg.Connection[Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """redshift-connector 2.1.9-2.1.12 raise KeyError from their prepared-statement cache
    after DDL or ROLLBACK (its issue #273): the first LOCK of the slice commit raises it
    here, as that cache would. The writer drops that session, loads its temp tables again
    on a new one, and commits."""
    real_execute = redshift_connector.Cursor.execute
    raised: list[str] = []

    def execute(self: Any, operation: str, *args: Any, **kwargs: Any) -> Any:
        if operation.startswith("LOCK") and not raised:
            raised.append(operation)
            raise KeyError(("LOCK", ()))  # the cache's key: SQL text and parameter types
        return real_execute(self, operation, *args, **kwargs)

    monkeypatch.setattr(redshift_connector.Cursor, "execute", execute)
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
        result = writer.commit()
    assert raised and redshift.replays == 1
    assert len(sessions) == 2  # the session whose cache broke was not reused
    assert stamps(db, "curated.fleet_trips") == {(ACME, SCOPE, str(result.batch_id)): 1_000}


@pytest.mark.parametrize(
    "exc",
    [KeyError(("SELECT 1", ())), IndexError("list index out of range")],
    ids=lambda exc: type(exc).__name__,
)
def test_what_the_driver_raises_outside_its_hierarchy_is_translated(exc: Exception) -> None:
    error = driver.translate(exc)
    assert error.kind is ErrorKind.TRANSIENT
    assert type(exc).__name__ in str(error)
    assert isinstance(exc, driver.DRIVER_ERRORS)


def test_struct_and_decode_errors_are_caught_at_the_boundary_too() -> None:
    import struct

    try:
        struct.unpack("!i", b"\x00")
    except struct.error as exc:
        assert driver.translate(exc).kind is ErrorKind.TRANSIENT
    bad = UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
    assert driver.translate(bad).kind is ErrorKind.TRANSIENT


def test_tls_errors_are_configuration_at_connect_and_transient_mid_session() -> None:
    handshake = ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number")
    corrupted = ssl.SSLError(1, "[SSL: DECRYPTION_FAILED_OR_BAD_RECORD_MAC]")
    assert driver.translate(handshake, connecting=True).kind is ErrorKind.CONFIGURATION
    assert driver.translate(corrupted).kind is ErrorKind.TRANSIENT
    cut = ssl.SSLEOFError(8, "EOF occurred in violation of protocol")
    assert driver.translate(cut, connecting=True).kind is ErrorKind.TRANSIENT
    wrapped = redshift_connector.InterfaceError("communication error", corrupted)
    assert driver.translate(wrapped).kind is ErrorKind.TRANSIENT
    assert driver.translate(wrapped, connecting=True).kind is ErrorKind.CONFIGURATION


def test_a_redshift_error_names_the_redshift_settings_as_what_to_check() -> None:
    """Redshift is set by FLEET_REDSHIFT_* (a redshift:// FLEET_WAREHOUSE_URL is optional):
    its errors' next step named FLEET_WAREHOUSE_URL alone, a setting the user may never
    have set (issue 26, the Redshift cells through the flow and the CLI)."""
    refused = driver.translate(ConnectionRefusedError(111, "Connection refused"))
    login = driver.translate(
        redshift_connector.ProgrammingError({"C": "28000", "M": "password authentication failed"})
    )
    wrapped = WarehouseError(f"{refused}; not stamped", kind=refused.kind, backend=refused.backend)
    assert explain(refused) == explain(wrapped).replace("; not stamped", "")
    assert (explain(refused) or "").endswith(
        "check FLEET_REDSHIFT_HOST and FLEET_REDSHIFT_PORT (or a redshift:// "
        "FLEET_WAREHOUSE_URL) and that the server runs"
    )
    assert "in FLEET_REDSHIFT_USER and FLEET_REDSHIFT_PASSWORD" in (explain(login) or "")
    postgres = WarehouseError("warehouse connection failed", kind=ErrorKind.TRANSIENT)
    assert (explain(postgres) or "").endswith(
        "check FLEET_WAREHOUSE_URL (host:port) and that the server runs"
    )


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_commit_whose_connection_drops_arrives_as_a_lost_connection(
    emulator: RedshiftEmulator, db: psycopg.Connection[Any], when: str
) -> None:
    """The injection point for issue 26 (the unknown commit outcome): the connection of a
    writing COMMIT drops before or after the server committed. Either way the driver raises
    a client-side InterfaceError without SQLSTATE, which `translate` makes a transient lost
    connection; only the server knows which happened (the stamp decides)."""
    db.execute("CREATE TABLE dropped (v bigint)")
    give(db, emulator.user, "dropped")
    conn = redshift_connector.connect(**emulator.connect_kwargs())
    try:
        conn.cursor().execute("INSERT INTO dropped VALUES (1)")
        emulator.drop_next_commit(when)
        with pytest.raises(redshift_connector.InterfaceError) as caught:
            conn.commit()
    finally:
        with contextlib.suppress(redshift_connector.Error):
            conn.close()
    error = driver.translate(caught.value)
    assert error.kind is ErrorKind.TRANSIENT and error.code is None, error
    assert "connection" in str(error)
    expected = (1,) if when == "after" else (0,)
    assert db.execute("SELECT count(*) FROM dropped").fetchone() == expected
    open_transactions = (
        "SELECT count(*) FROM pg_stat_activity WHERE usename = %s AND state LIKE 'idle in%%'"
        " AND datname = current_database()"  # the loader's sessions of other tests are not ours
    )
    for _ in range(100):  # the server ends the dropped session (rolling back) on its own time
        if db.execute(open_transactions, [emulator.user]).fetchone() == (0,):
            break
        time.sleep(0.05)
    assert db.execute(open_transactions, [emulator.user]).fetchone() == (0,)
    assert db.execute("SELECT count(*) FROM dropped").fetchone() == expected
    assert emulator.commit_drops == []
