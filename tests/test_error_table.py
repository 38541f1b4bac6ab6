"""The classification table (fleet_import.error_table), code by code: every driver error a
boundary may meet gets one kind, by the one rule in the table's docstring."""

from __future__ import annotations

import errno
import socket
import ssl

import psycopg
import pytest
from botocore import exceptions as boto
from psycopg import errors as pg_errors

from fleet_import.error_table import classify, s3_kind, sqlstate_kind
from fleet_import.errors import (
    DetailsInvalid,
    ErrorKind,
    FleetImportError,
    InvalidInput,
    LeaseLost,
    OperationalStoreError,
    PreCommitError,
    TransientError,
    WarehouseError,
    error_of_kind,
)

TRANSIENT, TERMINAL = ErrorKind.TRANSIENT, ErrorKind.TERMINAL
CONFIGURATION, LEASE_LOST = ErrorKind.CONFIGURATION, ErrorKind.LEASE_LOST


@pytest.mark.parametrize(
    ("sqlstate", "kind"),
    [
        ("08000", TRANSIENT),  # connection exception
        ("08006", TRANSIENT),  # connection failure
        ("08001", TRANSIENT),  # client unable to establish connection
        ("40001", TRANSIENT),  # serialization failure
        ("40P01", TRANSIENT),  # deadlock detected
        ("53300", TRANSIENT),  # too many connections
        ("57P01", TRANSIENT),  # admin shutdown
        ("57P02", TRANSIENT),  # crash shutdown
        ("57P03", TRANSIENT),  # cannot connect now
        ("57014", TRANSIENT),  # query cancelled
        ("58030", TRANSIENT),  # I/O error
        ("55P03", TRANSIENT),  # lock not available
        ("25P03", TRANSIENT),  # idle-in-transaction session timeout
        ("28000", CONFIGURATION),  # invalid authorization
        ("28P01", CONFIGURATION),  # invalid password
        ("3D000", CONFIGURATION),  # no such database
        ("42501", CONFIGURATION),  # insufficient privilege
        ("57P04", CONFIGURATION),  # database dropped
        ("42601", TERMINAL),  # syntax error
        ("42P01", TERMINAL),  # undefined table
        ("23505", TERMINAL),  # unique violation
        ("23502", TERMINAL),  # not-null violation
        ("22P02", TERMINAL),  # invalid text representation
        ("53100", TERMINAL),  # disk full: needs an operator, not a retry
        ("XX000", TERMINAL),  # internal error, without Redshift's shapes
    ],
)
def test_sqlstates(sqlstate: str, kind: ErrorKind) -> None:
    assert sqlstate_kind(sqlstate) is kind


@pytest.mark.parametrize(
    ("sqlstate", "message", "kind"),
    [
        ("XX000", "1023", TRANSIENT),
        (
            "XX000",
            "1023 Serializable isolation violation on table - 100, transactions ...",
            TRANSIENT,
        ),
        ("40001", "1023 Serializable isolation violation on table (emulated)", TRANSIENT),
        ("XX000", "  1023\nDETAIL: Serializable isolation violation", TRANSIENT),
        (
            "XX000",
            "Query could not complete because of conflict with concurrent transaction",
            TRANSIENT,
        ),
        (None, "1023 Serializable isolation violation", TRANSIENT),
        ("XX000", "10230 rows were not loaded", TERMINAL),
        ("XX000", "Parquet files have 9 columns, the table has 10", TERMINAL),
    ],
)
def test_redshift_shapes(sqlstate: str | None, message: str, kind: ErrorKind) -> None:
    assert sqlstate_kind(sqlstate, message) is kind


SPECTRUM_DETAIL = (
    "\n  -----------------------------------------------\n  error:  {error}\n  code:      {code}"
    "\n  context:   {context}\n  query:     26301369\n  location:  dory_util.cpp:1450"
    "\n  process:   worker_thread [pid=10836]\n  -----------------------------------------------"
)


def redshift_internal(message: str, code: int, context: str) -> str:
    """What the Redshift boundary classifies: message, then the detail Redshift sends
    (driver.translate joins them for XX000)."""
    return f"{message}: {SPECTRUM_DETAIL.format(error=message, code=code, context=context)}"


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        # transient: the path to S3, the catalog under concurrent DDL, the connection
        ("could not open relation with OID 6134794", TRANSIENT),  # dbt-redshift#974
        (
            redshift_internal(
                "S3Query Exception Connection failed, retries exceeded.", 15005, ""
            ),  # harrystech/arthur-redshift-etl#134
            TRANSIENT,
        ),
        (
            redshift_internal(
                "S3 Query Exception (Fetch)",
                15001,
                "boost::thread_resource_error: Resource temporarily unavailable",
            ),
            TRANSIENT,
        ),
        (
            redshift_internal(
                "Spectrum Scan Error",
                15007,
                "S3ServiceException:Please reduce your request rate.,Status 503,Error SlowDown",
            ),
            TRANSIENT,
        ),
        (
            redshift_internal(
                "Spectrum Scan Error", 15007, "S3ServiceException:Service Unavailable,Status 503"
            ),
            TRANSIENT,
        ),
        (
            redshift_internal("Spectrum Scan Error", 15007, "Connection reset by peer"),
            TRANSIENT,
        ),
        # terminal: the data (rudder-server#3178, amazon-redshift-python-driver#107)
        (
            redshift_internal(
                "Spectrum Scan Error",
                15007,
                "Unmatched number of columns between table and file. Table columns: 20, "
                "Data columns: 16, File name: https://s3.us-east-1.amazonaws.com/b/k",
            ),
            TERMINAL,
        ),
        (
            redshift_internal(
                "Spectrum Scan Error",
                15007,
                "File 'https://s3.us-east-2.amazonaws.com/b/k.parquet' has an incompatible "
                "Parquet schema for column 's3://b/k.parquet.registration_dttm'",
            ),
            TERMINAL,
        ),
        ("Invalid timestamp format or value", TERMINAL),
        # permissions: the COPY role, the bucket
        (
            "User arn:aws:redshift:eu-west-1:123456789012:dbuser:fleet/loader is not "
            "authorized to assume IAM Role arn:aws:iam::123456789012:role/fleet-copy",
            CONFIGURATION,
        ),
        (
            redshift_internal(
                "Spectrum Scan Error", 15007, "S3ServiceException:Access Denied,Status 403"
            ),
            CONFIGURATION,
        ),
    ],
)
def test_redshift_internal_errors_by_their_shape(message: str, kind: ErrorKind) -> None:
    """XX000 is every Redshift internal error: its message and detail sort it."""
    assert sqlstate_kind("XX000", message) is kind


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        (
            'duplicate key value violates unique constraint "pg_namespace_nspname_index"',
            TRANSIENT,
        ),
        (
            'duplicate key value violates unique constraint "pg_type_typname_nsp_index"',
            TRANSIENT,
        ),
        ('duplicate key value violates unique constraint "fleet_trips_pkey"', TERMINAL),
        ("duplicate key value", TERMINAL),
    ],
)
def test_a_create_race_on_a_catalog_index_is_transient(message: str, kind: ErrorKind) -> None:
    """Two sessions racing one CREATE ... IF NOT EXISTS: the loser's 23505 is on a system
    catalog's index, and a retry sees the object; a user key's violation is the data's."""
    assert sqlstate_kind("23505", message) is kind


def test_an_ssl_error_mid_session_is_transient() -> None:
    assert classify(ssl.SSLError(1, "[SSL: DECRYPTION_FAILED_OR_BAD_RECORD_MAC]")) is TRANSIENT
    assert classify(ssl.SSLError(1, "[SSL: BAD_LENGTH] bad length")) is TRANSIENT


def test_no_sqlstate_is_a_lost_connection_only_when_the_driver_says_so() -> None:
    assert sqlstate_kind(None, connection=True) is TRANSIENT
    assert sqlstate_kind(None) is TERMINAL
    assert sqlstate_kind("", "", connection=False) is TERMINAL


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (pg_errors.QueryCanceled("canceling statement due to statement timeout"), TRANSIENT),
        (pg_errors.SerializationFailure("could not serialize access"), TRANSIENT),
        (pg_errors.AdminShutdown("terminating connection"), TRANSIENT),
        (pg_errors.InsufficientPrivilege("permission denied"), CONFIGURATION),
        (pg_errors.InvalidPassword("password authentication failed"), CONFIGURATION),
        (pg_errors.NotNullViolation("null value"), TERMINAL),
        (psycopg.OperationalError("connection failed: refused"), TRANSIENT),
        (psycopg.InterfaceError("the connection is closed"), TERMINAL),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, Exception) else str(value),
)
def test_psycopg_errors(exc: psycopg.Error, kind: ErrorKind) -> None:
    assert classify(exc) is kind


@pytest.mark.parametrize(
    ("code", "status", "kind"),
    [
        ("SlowDown", 503, TRANSIENT),
        ("RequestTimeout", 400, TRANSIENT),
        ("InternalError", 500, TRANSIENT),
        ("ServiceUnavailable", 503, TRANSIENT),
        ("503", 503, TRANSIENT),
        ("Throttling", 400, TRANSIENT),
        ("ThrottlingException", 400, TRANSIENT),
        ("RequestLimitExceeded", 400, TRANSIENT),
        ("AccessDenied", 403, CONFIGURATION),
        ("403", 403, CONFIGURATION),
        ("AllAccessDisabled", 403, CONFIGURATION),
        ("NoSuchBucket", 404, CONFIGURATION),
        ("InvalidAccessKeyId", 403, CONFIGURATION),
        ("SignatureDoesNotMatch", 403, CONFIGURATION),
        ("ExpiredToken", 400, CONFIGURATION),
        ("PermanentRedirect", 301, CONFIGURATION),
        ("NoSuchKey", 404, TERMINAL),
        ("404", 404, TERMINAL),
        ("PreconditionFailed", 412, TERMINAL),
        ("InvalidObjectState", 403, TERMINAL),
        # Codes the table does not know: by HTTP status.
        ("SomethingNew", 400, TERMINAL),
        ("SomethingNew", 500, TRANSIENT),
        ("SomethingNew", 503, TRANSIENT),
        ("SomethingNew", 429, TRANSIENT),
        ("SomethingNew", 403, CONFIGURATION),
        ("SomethingNew", 401, CONFIGURATION),
        ("", 0, TERMINAL),
    ],
)
def test_s3_codes(code: str, status: int, kind: ErrorKind) -> None:
    assert s3_kind(code, status) is kind
    response = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}
    assert classify(boto.ClientError(response, "GetObject")) is kind  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (boto.EndpointConnectionError(endpoint_url="http://s3"), TRANSIENT),
        (boto.ConnectTimeoutError(endpoint_url="http://s3"), TRANSIENT),
        (boto.ReadTimeoutError(endpoint_url="http://s3"), TRANSIENT),
        (boto.ConnectionClosedError(endpoint_url="http://s3"), TRANSIENT),
        (boto.ResponseStreamingError(error="IncompleteRead"), TRANSIENT),
        (boto.IncompleteReadError(actual_bytes=1, expected_bytes=2), TRANSIENT),
        (boto.NoCredentialsError(), CONFIGURATION),
        (boto.PartialCredentialsError(provider="env", cred_var="secret"), CONFIGURATION),
        (boto.NoRegionError(), CONFIGURATION),
        (boto.ParamValidationError(report="Bucket is required"), TERMINAL),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, Exception) else str(value),
)
def test_botocore_errors(exc: Exception, kind: ErrorKind) -> None:
    assert classify(exc) is kind


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (ConnectionRefusedError(errno.ECONNREFUSED, "refused"), TRANSIENT),
        (ConnectionResetError(errno.ECONNRESET, "reset"), TRANSIENT),
        (BrokenPipeError(errno.EPIPE, "broken pipe"), TRANSIENT),
        (TimeoutError("timed out"), TRANSIENT),
        (OSError(errno.EHOSTUNREACH, "no route to host"), TRANSIENT),
        (OSError(errno.ENETUNREACH, "network is unreachable"), TRANSIENT),
        (socket.gaierror(socket.EAI_AGAIN, "temporary failure in name resolution"), TRANSIENT),
        (ssl.SSLEOFError("EOF occurred in violation of protocol"), TRANSIENT),
        (ssl.SSLCertVerificationError("certificate verify failed"), CONFIGURATION),
        (FileNotFoundError(errno.ENOENT, "no such file"), TERMINAL),
        (ValueError("not a driver error"), TERMINAL),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, Exception) else str(value),
)
def test_network_errors(exc: Exception, kind: ErrorKind) -> None:
    assert classify(exc) is kind


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (FleetImportError(), TERMINAL),
        (PreCommitError(), TERMINAL),
        (InvalidInput(), TERMINAL),
        (DetailsInvalid(), TERMINAL),
        (TransientError(), TRANSIENT),
        (LeaseLost(), LEASE_LOST),
        (OperationalStoreError(), TERMINAL),
        (WarehouseError(), TERMINAL),
        (WarehouseError("lost", kind=TRANSIENT, code="08006"), TRANSIENT),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, Exception) else str(value),
)
def test_every_error_has_a_kind_and_transient_is_read_from_it(
    error: FleetImportError, kind: ErrorKind
) -> None:
    assert error.kind is kind
    assert error.transient is (kind is TRANSIENT)
    with pytest.raises(AttributeError):
        error.transient = True  # type: ignore[misc]


def test_error_of_kind_keeps_transient_errors_catchable_by_class() -> None:
    transient = error_of_kind(TRANSIENT, "slow", PreCommitError, code="SlowDown")
    assert isinstance(transient, TransientError) and transient.code == "SlowDown"
    # The class asked for: `except PreCommitError` catches the transient one too.
    assert isinstance(transient, PreCommitError) and transient.transient
    refused = error_of_kind(CONFIGURATION, "denied", PreCommitError, code="AccessDenied")
    assert type(refused) is PreCommitError
    assert (refused.kind, refused.code, str(refused)) == (CONFIGURATION, "AccessDenied", "denied")


def test_each_boundary_error_has_a_transient_variant_that_pickles() -> None:
    import pickle

    from fleet_import.s3.sources import DiscoveryError
    from fleet_import.s3.staging import StagingError

    for cls in (PreCommitError, DiscoveryError, StagingError):
        error = error_of_kind(TRANSIENT, "slow", cls, code="SlowDown")
        assert isinstance(error, cls) and isinstance(error, TransientError), cls
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is type(error) and str(back) == "slow"
    with pytest.raises(TypeError):
        error_of_kind(TRANSIENT, "slow", InvalidInput)


def test_configuration_errors_raised_by_the_core_are_never_retried() -> None:
    from fleet_import.config import Settings
    from fleet_import.contracts.model import ContractError
    from fleet_import.errors import ErrorKind, is_transient
    from fleet_import.importing.runtime import build_runtime

    with pytest.raises(FleetImportError) as missing:
        build_runtime(Settings(staging_uri=None))
    assert missing.value.kind is ErrorKind.CONFIGURATION and not is_transient(missing.value)
    assert ContractError("bad").kind is ErrorKind.CONFIGURATION
