"""The one table that sorts what drivers raise into an ErrorKind. Every boundary where a
driver error enters (the operational store, both warehouses, S3 sources, the staging area)
asks it; nothing else decides whether an error is worth a retry.

The rule, for every driver alike:
- TRANSIENT: the failure lies in the path to the service or in contention with other work,
  not in the request, so the same request sent again later may succeed: a connection lost,
  refused or timed out; a server shutting down, restarting or out of connections; a
  serialization conflict, deadlock or lock timeout; a cancelled statement; an I/O error on
  the server; throttling; an HTTP 5xx or 429.
- CONFIGURATION: nothing can succeed until an operator changes something outside the data:
  credentials, permissions, a missing database or bucket, a wrong region.
- TERMINAL: everything else. The request or the data is wrong, and sending it again fails
  the same way. A code this table does not know is terminal, unless its HTTP status says
  the server (5xx) or the rate (429) is at fault, or that the caller lacks rights (401, 403).

Exact codes win over their SQLSTATE class. Decided by code, class and exception type; the
message text is read only where Redshift gives no code of its own (see `sqlstate_kind`). So
a connection that fails before the server answers is transient, whatever the cause: libpq
reports a wrong password or database at connect time without a SQLSTATE, only in text.
"""

from __future__ import annotations

import errno
import re
import socket
import ssl
from collections.abc import Mapping

import psycopg
from boto3.exceptions import S3UploadFailedError
from botocore import exceptions as boto

from fleet_import.errors import ErrorKind

TRANSIENT, TERMINAL, CONFIGURATION = (
    ErrorKind.TRANSIENT,
    ErrorKind.TERMINAL,
    ErrorKind.CONFIGURATION,
)

SQLSTATES: Mapping[str, ErrorKind] = {
    "25P03": TRANSIENT,  # idle_in_transaction_session_timeout: the session was ended
    "3D000": CONFIGURATION,  # invalid_catalog_name: no such database
    "42501": CONFIGURATION,  # insufficient_privilege: a grant is missing, like S3's AccessDenied
    "53300": TRANSIENT,  # too_many_connections
    "55P03": TRANSIENT,  # lock_not_available: another transaction holds the lock
    "57P04": CONFIGURATION,  # database_dropped
    "58030": TRANSIENT,  # io_error on the server
}
"""Exact SQLSTATEs; they win over `SQLSTATE_CLASSES`."""

SQLSTATE_CLASSES: Mapping[str, ErrorKind] = {
    "08": TRANSIENT,  # connection exception
    "28": CONFIGURATION,  # invalid authorization specification
    "40": TRANSIENT,  # transaction rollback: serialization failure, deadlock
    "42": TERMINAL,  # syntax error or access rule violation
    "57": TRANSIENT,  # operator intervention: query cancelled, admin/crash shutdown
}
"""The first two characters of a SQLSTATE."""

# Redshift reports a serializable isolation violation as error 1023 at the start of the
# message, under the generic SQLSTATE XX000, and a concurrent-transaction conflict by text
# alone: these two shapes are read whatever the SQLSTATE.
_REDSHIFT_SERIALIZATION_ERROR = re.compile(r"\s*1023\b")
_REDSHIFT_CONFLICT = "could not complete because of conflict with concurrent transaction"

REDSHIFT_INTERNAL: tuple[tuple[re.Pattern[str], ErrorKind], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), kind)
    for pattern, kind in (
        # A relation dropped or replaced under a running statement by concurrent DDL (temp
        # tables, catalog reads): gone on a retry (dbt-labs/dbt-redshift#974,
        # sqlalchemy-redshift#289, npgsql#1561).
        (r"could not open relation with OID", TRANSIENT),
        # Spectrum (Parquet COPY) failing to reach S3: "S3Query Exception Connection failed,
        # retries exceeded." (code 15005), "S3 Query Exception (Fetch)" (15001), retried by
        # arthur-redshift-etl for these codes; S3 throttling or 5xx behind it.
        (r"S3\s?Query Exception", TRANSIENT),
        (r"\bSlowDown\b|reduce your request rate|Status 50[0-9]\b|Service Unavailable", TRANSIENT),
        (r"connection reset|Resource temporarily unavailable|broken pipe", TRANSIENT),
        # The COPY role or the bucket refuses: an operator fixes the IAM role or its policy.
        (r"not authorized to (assume|get credentials)|Access Denied|Status 403\b", CONFIGURATION),
    )
)
"""Redshift's internal errors (SQLSTATE XX000: Spectrum, S3, the catalog) give no code of
their own but the one in their detail, so the message and detail are read: the first
pattern that matches decides. Any other XX000 is terminal: bad data ("Spectrum Scan Error
... incompatible Parquet schema", "Unmatched number of columns"), an unsupported type."""

_CATALOG_UNIQUE = re.compile(r'unique constraint "pg_\w+"')
"""Two sessions racing the same `CREATE ... IF NOT EXISTS` (schema, table): the loser fails
23505 on a system catalog's unique index (pg_namespace_nspname_index,
pg_type_typname_nsp_index); run again, it sees the object and succeeds."""

S3_CODES: Mapping[str, ErrorKind] = {
    **dict.fromkeys(
        (
            "Throttling",
            "ThrottlingException",
            "ThrottledException",
            "RequestThrottled",
            "RequestThrottledException",
            "TooManyRequestsException",
            "SlowDown",
            "RequestLimitExceeded",
            "RequestTimeout",
            "RequestTimeoutException",
            "InternalError",
            "ServiceUnavailable",
            "503",
        ),
        TRANSIENT,
    ),
    **dict.fromkeys(
        (
            "AccessDenied",
            "AllAccessDisabled",
            "AccountProblem",
            "NoSuchBucket",
            "InvalidAccessKeyId",
            "SignatureDoesNotMatch",
            "ExpiredToken",
            "InvalidToken",
            "TokenRefreshRequired",
            "AuthorizationHeaderMalformed",
            "PermanentRedirect",
            "403",
        ),
        CONFIGURATION,
    ),
    **dict.fromkeys(
        ("NoSuchKey", "404", "PreconditionFailed", "InvalidObjectState", "InvalidRange"),
        TERMINAL,
    ),
}
"""S3 (and S3-compatible stores') error codes. HEAD requests answer with the bare status."""

_BOTOCORE_TRANSIENT = (boto.ConnectionError, boto.HTTPClientError, boto.IncompleteReadError)
"""Connection-level failures botocore already retried: EndpointConnectionError,
ConnectTimeoutError, ReadTimeoutError, ConnectionClosedError, ResponseStreamingError, ..."""
_BOTOCORE_CONFIGURATION = (
    boto.NoCredentialsError,
    boto.PartialCredentialsError,
    boto.CredentialRetrievalError,
    boto.NoRegionError,
    boto.ProfileNotFound,
)
_NETWORK_ERRORS = (
    ConnectionError,
    TimeoutError,
    socket.gaierror,
    ssl.SSLEOFError,
    ssl.SSLZeroReturnError,
)
_NETWORK_ERRNOS = frozenset(
    {
        errno.ECONNREFUSED,
        errno.ECONNRESET,
        errno.ECONNABORTED,
        errno.EPIPE,
        errno.ETIMEDOUT,
        errno.EHOSTUNREACH,
        errno.EHOSTDOWN,
        errno.ENETUNREACH,
        errno.ENETDOWN,
        errno.ENETRESET,
    }
)


def sqlstate_kind(
    sqlstate: str | None, message: str = "", *, connection: bool = False
) -> ErrorKind:
    """A database error by SQLSTATE (PostgreSQL's and Redshift's). Without one, the server
    never answered: `connection` says whether the driver saw the connection fail (transient)
    rather than refuse a call on the client side (terminal)."""
    if _REDSHIFT_SERIALIZATION_ERROR.match(message) or _REDSHIFT_CONFLICT in message:
        return TRANSIENT
    if not sqlstate:
        return TRANSIENT if connection else TERMINAL
    if sqlstate == "XX000":
        return next((kind for rule, kind in REDSHIFT_INTERNAL if rule.search(message)), TERMINAL)
    if sqlstate == "23505" and _CATALOG_UNIQUE.search(message):
        return TRANSIENT
    return SQLSTATES.get(sqlstate) or SQLSTATE_CLASSES.get(sqlstate[:2], TERMINAL)


def psycopg_kind(exc: psycopg.Error) -> ErrorKind:
    """psycopg raises OperationalError, without a SQLSTATE, when the connection fails."""
    connection = isinstance(exc, psycopg.OperationalError)
    return sqlstate_kind(exc.sqlstate, exc.diag.message_primary or "", connection=connection)


def s3_kind(code: str, http_status: int = 0) -> ErrorKind:
    """An S3 error response by its code, else by its HTTP status."""
    if code in S3_CODES:
        return S3_CODES[code]
    if http_status >= 500 or http_status == 429:
        return TRANSIENT
    if http_status in (401, 403):
        return CONFIGURATION
    return TERMINAL


def client_error_code(exc: boto.ClientError) -> tuple[str, int]:
    """(error code, HTTP status) of an S3 error response."""
    code = str(exc.response.get("Error", {}).get("Code") or "")
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
    return code, status


def _unwrapped(exc: BaseException) -> BaseException:
    """boto3's upload_file raises S3UploadFailedError over the S3 error response; that
    response is what happened."""
    if isinstance(exc, S3UploadFailedError):
        inner = exc.__cause__ or exc.__context__
        if isinstance(inner, boto.ClientError):
            return inner
    return exc


def s3_error_code(exc: BaseException) -> str | None:
    """The S3 error code behind `exc`, if an S3 error response is behind it."""
    exc = _unwrapped(exc)
    return (client_error_code(exc)[0] or None) if isinstance(exc, boto.ClientError) else None


def s3_no_answer(exc: BaseException) -> bool:
    """botocore never got an answer (refused, unreachable, timed out, cut mid-answer), after
    its own attempts: one thing to an operator, "S3 does not answer"."""
    return isinstance(_unwrapped(exc), _BOTOCORE_TRANSIENT)


def network_kind(exc: OSError) -> ErrorKind:
    """A socket-level failure (refused, reset, timed out, unreachable, a name that did not
    resolve, a TLS stream cut short or corrupted mid-session: any `ssl.SSLError`) is
    transient; a certificate that does not verify needs an operator; any other OS error is
    terminal. (A TLS handshake refused at connect time is the caller's to call
    configuration: only it knows that no session was ever established.)"""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return CONFIGURATION
    if isinstance(exc, (*_NETWORK_ERRORS, ssl.SSLError)) or exc.errno in _NETWORK_ERRNOS:
        return TRANSIENT
    return TERMINAL


def classify(exc: BaseException) -> ErrorKind:
    """The kind of anything a driver raised: psycopg, botocore, or the network below them.
    (redshift_connector is optional: its boundary reads the SQLSTATE and calls
    `sqlstate_kind`.)"""
    exc = _unwrapped(exc)
    if isinstance(exc, psycopg.Error):
        return psycopg_kind(exc)
    if isinstance(exc, boto.ClientError):
        return s3_kind(*client_error_code(exc))
    if isinstance(exc, _BOTOCORE_TRANSIENT):
        return TRANSIENT
    if isinstance(exc, _BOTOCORE_CONFIGURATION):
        return CONFIGURATION
    if isinstance(exc, OSError):
        return network_kind(exc)
    return TERMINAL
