"""Every boundary where a driver error enters asks the one classification table: the same
driver error gets the same kind at each of them (the operational store and the PostgreSQL
warehouse, Redshift's driver, S3 sources and the staging area)."""

from __future__ import annotations

import contextlib
import gc
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import redshift_connector
from botocore.exceptions import ClientError
from botocore.stub import Stubber

from fleet_import.contracts.fleet import FLEET_DATASETS, TRIPS
from fleet_import.error_table import s3_kind
from fleet_import.errors import (
    ErrorKind,
    FleetImportError,
    OperationalStoreError,
    TransientError,
    WarehouseError,
    should_retry,
)
from fleet_import.s3.client import s3_client
from fleet_import.s3.sources import DiscoveryError, TransientDiscoveryError, discover
from fleet_import.s3.staging import StagingArea, StagingError, TransientStagingError
from fleet_import.store.connection import SqlStore
from fleet_import.warehouse.postgres.warehouse import PostgresWarehouse
from fleet_import.warehouse.redshift import driver
from fleet_import.warehouse.redshift.warehouse import RedshiftWarehouse
from tests.pgtools import with_user
from tests.redshift_emulator import RedshiftEmulator
from tests.warehouse_helpers import fleet_loads

ROLE = "arn:aws:iam::123456789012:role/fleet-redshift-copy"
SCOPE = "fleet_s3:s3://fleet-landing/acme/fleet/2026-07-22/"


def with_statement_timeout(url: str, milliseconds: int) -> str:
    separator = "&" if "?" in url else "?"
    return f"{url}{separator}options=-c%20statement_timeout%3D{milliseconds}"


# -- SQLSTATE: the operational store, the PostgreSQL warehouse, Redshift ------------------


class _SleepingStore(SqlStore):
    queries: ClassVar[dict[str, str]] = {"sleep": "SELECT pg_sleep(5)"}


def test_a_cancelled_query_is_transient_in_the_store_and_the_warehouse(database_url: str) -> None:
    """57014 (here a statement timeout) was transient in the store and terminal in the
    warehouse; both now ask the table."""
    url = with_statement_timeout(database_url, 50)
    with pytest.raises(OperationalStoreError) as in_store:
        _SleepingStore(url)._one("sleep", {})
    with pytest.raises(WarehouseError) as in_warehouse:
        PostgresWarehouse(url).execute("SELECT pg_sleep(5)")
    for caught in (in_store, in_warehouse):
        assert (caught.value.kind, caught.value.code) == (ErrorKind.TRANSIENT, "57014")
        assert caught.value.transient is True


def test_a_missing_privilege_is_configuration_in_the_store_and_the_warehouse(
    database_url: str, db: Any
) -> None:
    role = f"fleet_unprivileged_{uuid.uuid4().hex[:8]}"
    db.execute(f"CREATE ROLE {role} LOGIN")
    db.execute(f"CREATE TABLE curated_secret_{role} (x int)")
    db.execute(f"REVOKE ALL ON curated_secret_{role} FROM PUBLIC")
    try:
        url = with_user(database_url, role)
        store = _SleepingStore(url)
        store.queries = {"sleep": f"SELECT * FROM curated_secret_{role}"}
        with pytest.raises(OperationalStoreError) as in_store:
            store._one("sleep", {})
        with pytest.raises(WarehouseError) as in_warehouse:
            PostgresWarehouse(url).execute(f"SELECT * FROM curated_secret_{role}")
        for caught in (in_store, in_warehouse):
            assert (caught.value.kind, caught.value.code) == (ErrorKind.CONFIGURATION, "42501")
    finally:
        db.execute(f"DROP TABLE curated_secret_{role}")
        db.execute(f"DROP ROLE {role}")


@pytest.fixture
def emulator(database_url: str, s3: Any) -> Iterator[RedshiftEmulator]:
    with RedshiftEmulator(database_url, s3) as emu:
        yield emu


def test_a_cancelled_query_is_transient_through_redshifts_driver(
    emulator: RedshiftEmulator, s3: Any, staging_bucket: str
) -> None:
    redshift = RedshiftWarehouse(
        emulator.connect_kwargs(), s3=s3, staging_uri=f"s3://{staging_bucket}/r/", iam_role=ROLE
    )

    def sleep(cursor: Any) -> None:
        cursor.execute("SET statement_timeout = 50")
        cursor.execute("SELECT pg_sleep(5)")

    with pytest.raises(WarehouseError) as caught:
        redshift._in_transaction(sleep)
    assert (caught.value.kind, caught.value.code) == (ErrorKind.TRANSIENT, "57014")


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (redshift_connector.ProgrammingError({"C": "XX000", "M": "1023"}), ErrorKind.TRANSIENT),
        (
            redshift_connector.ProgrammingError(
                {
                    "C": "XX000",
                    "M": "could not complete because of conflict with concurrent transaction",
                }
            ),
            ErrorKind.TRANSIENT,
        ),
        (
            redshift_connector.ProgrammingError({"C": "57014", "M": "cancelled"}),
            ErrorKind.TRANSIENT,
        ),
        (redshift_connector.ProgrammingError({"C": "28000", "M": "no"}), ErrorKind.CONFIGURATION),
        (redshift_connector.ProgrammingError({"C": "42601", "M": "syntax"}), ErrorKind.TERMINAL),
        (
            redshift_connector.InterfaceError("BrokenPipe: server socket closed"),
            ErrorKind.TRANSIENT,
        ),
        (ConnectionResetError(104, "reset by peer"), ErrorKind.TRANSIENT),
    ],
    ids=lambda value: repr(value)[:60] if isinstance(value, Exception) else str(value),
)
def test_redshifts_boundary_asks_the_table(error: Exception, kind: ErrorKind) -> None:
    assert driver.translate(error).kind is kind


def test_a_staging_refusal_is_not_made_transient_by_the_redshift_writer(
    emulator: RedshiftEmulator, s3: Any, tmp_path: Path
) -> None:
    """The writer used to re-mark every StagingError transient: a missing staging bucket
    was retried as if it might pass. Its kind now comes from the table."""
    redshift = RedshiftWarehouse(
        emulator.connect_kwargs(),
        s3=s3,
        staging_uri=f"s3://fleet-no-such-bucket-{uuid.uuid4().hex[:8]}/stage/",
        iam_role=ROLE,
        retry_delays=(0.0,),
    )
    [trips] = fleet_loads(tmp_path, {"trips": 5})
    with (
        redshift.open_slice(
            tenant_id="acme", source_scope=SCOPE, batch_id=uuid.uuid4(), contracts=[TRIPS]
        ) as writer,
        pytest.raises(WarehouseError, match="cannot stage a file for COPY") as caught,
    ):
        writer.load_files(TRIPS, trips.files)
    assert (caught.value.kind, caught.value.code) == (ErrorKind.CONFIGURATION, "NoSuchBucket")
    assert emulator.copies == []


# -- Redshift outside SQL: logins, IAM tokens, connections that end ---------------------------


@pytest.mark.parametrize(
    ("settings", "code"),
    [
        ({"password": "wrong"}, "28000"),
        ({"user": "fleet_no_such_user"}, "28000"),
        ({"database": "fleet_no_such_database"}, "3D000"),
        ({"iam": True, "cluster_identifier": "fleet"}, None),  # IAM needs SSL: the driver refuses
    ],
    ids=["wrong password", "unknown user", "unknown database", "IAM without SSL"],
)
# redshift_connector leaves the socket of a refused login open for the garbage collector.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_refused_login_is_configuration_and_never_retried(
    emulator: RedshiftEmulator,
    s3: Any,
    staging_bucket: str,
    caplog: pytest.LogCaptureFixture,
    settings: dict[str, Any],
    code: str | None,
) -> None:
    """The driver's client-side refusals used to be retried for 22 s (transient)."""
    emulator.password = emulator.connect_kwargs()["password"]
    redshift = RedshiftWarehouse(
        emulator.connect_kwargs(**settings),
        s3=s3,
        staging_uri=f"s3://{staging_bucket}/r/",
        iam_role=ROLE,
        retry_delays=(0.0, 0.0, 0.0),
    )
    with caplog.at_level(logging.WARNING), pytest.raises(WarehouseError) as caught:
        redshift.open_slice(
            tenant_id="acme", source_scope=SCOPE, batch_id=uuid.uuid4(), contracts=[TRIPS]
        )
    assert (caught.value.kind, caught.value.code) == (ErrorKind.CONFIGURATION, code)
    assert not [r for r in caplog.records if r.name.startswith("fleet_import")]
    gc.collect()  # that socket, here, where its warning is expected


def test_a_session_ended_under_the_driver_is_transient(emulator: RedshiftEmulator, db: Any) -> None:
    conn = driver.connect(emulator.connect_kwargs(timeout=10))
    cursor = conn.cursor()
    cursor.execute("SELECT pg_backend_pid()")
    db.execute("SELECT pg_terminate_backend(%s, 5000)", cursor.fetchone())  # waits for its end
    for _ in range(2):  # the first statement finds the socket closed, the next a dead pipe
        with pytest.raises(driver.DRIVER_ERRORS) as caught:
            cursor.execute("SELECT 1")
        assert driver.translate(caught.value).kind is ErrorKind.TRANSIENT
    with contextlib.suppress(*driver.DRIVER_ERRORS):
        conn.close()


def test_a_cluster_gone_mid_session_is_transient(database_url: str, s3: Any) -> None:
    with RedshiftEmulator(database_url, s3) as gone:
        conn = driver.connect(gone.connect_kwargs(timeout=10))
        conn.cursor().execute("SELECT 1")
    with pytest.raises(driver.DRIVER_ERRORS) as caught:
        conn.cursor().execute("SELECT 1")
    error = driver.translate(caught.value)
    assert error.kind is ErrorKind.TRANSIENT and "server socket closed" in str(error)
    with contextlib.suppress(*driver.DRIVER_ERRORS):
        conn.close()


@pytest.mark.parametrize(
    ("error", "connecting", "kind"),
    [
        (redshift_connector.InterfaceError("Server refuses SSL"), True, ErrorKind.CONFIGURATION),
        (
            redshift_connector.InterfaceError("Only %s and %% are supported in the query."),
            False,
            ErrorKind.TERMINAL,
        ),
        (
            redshift_connector.InterfaceError("communication error", ConnectionRefusedError(111)),
            True,
            ErrorKind.TRANSIENT,
        ),
        (
            redshift_connector.OperationalError("connection time out", TimeoutError()),
            True,
            ErrorKind.TRANSIENT,
        ),
        (redshift_connector.InterfaceError("connection is closed"), False, ErrorKind.TRANSIENT),
        (
            ClientError({"Error": {"Code": "Throttling"}}, "GetClusterCredentials"),
            True,
            ErrorKind.TRANSIENT,
        ),
        (
            ClientError({"Error": {"Code": "ExpiredToken"}}, "GetClusterCredentials"),
            True,
            ErrorKind.CONFIGURATION,
        ),
    ],
    ids=lambda value: repr(value)[:50] if isinstance(value, Exception) else str(value),
)
def test_what_the_driver_raises_without_a_sqlstate(
    error: Exception, connecting: bool, kind: ErrorKind
) -> None:
    """redshift_connector's own refusals carry no SQLSTATE: a lost connection is transient,
    a refused setting at connect needs an operator, a misuse afterwards is terminal."""
    assert driver.translate(error, connecting=connecting).kind is kind


@pytest.fixture
def iam_login(moto_endpoint: str) -> dict[str, Any]:
    """IAM login settings whose temporary credentials come from moto's Redshift
    (GetClusterCredentials), as redshift_connector asks botocore for them."""
    return {
        "iam": True,
        "ssl": True,
        "host": "fleet.c0ffee123456.us-east-1.redshift.amazonaws.com",  # not resolved
        "port": 5439,
        "database": "dev",
        "db_user": "loader",
        "cluster_identifier": "fleet-no-such-cluster",
        "region": "us-east-1",
        "endpoint_url": moto_endpoint,
        "iam_disable_cache": True,
    }


def _no_aws_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.mark.parametrize(
    ("case", "kind", "code"),
    [
        ("unknown cluster", ErrorKind.CONFIGURATION, "ClusterNotFound"),
        ("no AWS credentials", ErrorKind.CONFIGURATION, None),
        ("no such profile", ErrorKind.CONFIGURATION, None),
        ("endpoint unreachable", ErrorKind.TRANSIENT, None),
    ],
)
def test_iam_token_errors_are_translated(
    iam_login: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    case: str,
    kind: ErrorKind,
    code: str | None,
) -> None:
    """botocore's errors from the IAM login used to leave the driver untranslated."""
    if case == "no AWS credentials":
        _no_aws_credentials(monkeypatch, tmp_path)
    elif case == "no such profile":
        iam_login["profile"] = "fleet-no-such-profile"
    elif case == "endpoint unreachable":
        monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
        iam_login["endpoint_url"] = "http://127.0.0.1:1"
    with pytest.raises(WarehouseError, match="warehouse") as caught:
        driver.connect(iam_login)
    assert (caught.value.kind, caught.value.code) == (kind, code)


# -- S3: sources and the staging area ---------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("SomethingNew", 400),  # was terminal in sources, transient in staging
        ("SomethingNew", 503),
        ("SlowDown", 503),
        ("AccessDenied", 403),
        ("ExpiredToken", 400),  # was transient in sources
        ("NoSuchKey", 404),
    ],
)
def test_an_s3_error_gets_the_same_kind_in_sources_and_staging(
    moto_endpoint: str, code: str, status: int
) -> None:
    client = s3_client(moto_endpoint)
    staging = StagingArea("s3://fleet-staging/stage/", client)
    caught: list[FleetImportError] = []
    with Stubber(client) as stub:
        stub.add_client_error("list_objects_v2", service_error_code=code, http_status_code=status)
        stub.add_client_error("delete_objects", service_error_code=code, http_status_code=status)
        for attempt in (
            lambda: discover(client, "s3://fleet-landing/acme/fleet/2026-07-22/", FLEET_DATASETS),
            lambda: staging.delete(["a.parquet"]),
        ):
            with pytest.raises(FleetImportError) as raised:
                attempt()
            caught.append(raised.value)
    kind = s3_kind(code, status)
    assert [(error.kind, error.code) for error in caught] == [(kind, code)] * 2
    transient = kind is ErrorKind.TRANSIENT
    expected = (
        [TransientDiscoveryError, TransientStagingError]
        if transient
        else [DiscoveryError, StagingError]
    )
    assert [type(error) for error in caught] == expected
    # each boundary's own class, transient or not (`except StagingError` catches both)
    assert isinstance(caught[0], DiscoveryError) and isinstance(caught[1], StagingError)
    assert [isinstance(error, TransientError) for error in caught] == [transient] * 2
    # botocore retried it (the one layer that retries S3): no step runner retries it again
    assert [(error.retried, should_retry(error)) for error in caught] == [(True, False)] * 2


def test_a_staging_error_names_the_object(moto_endpoint: str, tmp_path: Path) -> None:
    """Which file, not only which staging area: the object an operator goes and looks at."""
    client = s3_client(moto_endpoint)
    staging = StagingArea("s3://fleet-staging/stage/", client)
    local = tmp_path / "abc.parquet"
    local.write_bytes(b"PAR1")
    with Stubber(client) as stub:
        stub.add_client_error(
            "head_object", service_error_code="AccessDenied", http_status_code=403
        )
        stub.add_client_error("put_object", service_error_code="AccessDenied", http_status_code=403)
        messages = []
        for attempt in (
            lambda: staging.get_file("normalized/trips/abc.parquet", tmp_path / "back.parquet"),
            lambda: staging.put_file(local, "normalized/trips/abc.parquet"),
        ):
            with pytest.raises(StagingError) as raised:
                attempt()
            messages.append(str(raised.value))
    assert messages == [
        f"staging {what} of normalized/trips/abc.parquet failed in s3://fleet-staging/stage/: "
        "AccessDenied"
        for what in ("download", "upload")
    ]


# -- the flows' retry rule --------------------------------------------------------------------


def _retried_below(error: FleetImportError) -> FleetImportError:
    error.retried = True
    return error


@pytest.mark.parametrize(
    ("error", "retried"),
    [
        (TransientError("slow down"), True),
        (WarehouseError("lost", kind=ErrorKind.TRANSIENT), True),
        (OperationalStoreError("cancelled", kind=ErrorKind.TRANSIENT), True),
        (StagingError("denied", kind=ErrorKind.CONFIGURATION), False),
        (WarehouseError("syntax"), False),
        (DiscoveryError("empty folder"), False),
        (ValueError("not ours"), False),
        (_retried_below(TransientError("SlowDown after botocore's retries")), False),
    ],
    ids=lambda value: repr(value)[:40] if isinstance(value, Exception) else str(value),
)
def test_the_flows_retry_what_the_kind_calls_transient(error: Exception, retried: bool) -> None:
    assert should_retry(error) is retried
