"""A foreseen error as one line a person can act on: what failed and the next step.

Decided by error class and the driver's code (SQLSTATE, S3 error code), never by message
text; the messages quoted are ours, which never carry a connection string or a password.
Anything else is unforeseen (a bug): `explain` returns None and the caller shows it in full.
"""

from __future__ import annotations

from dataclasses import dataclass

import botocore.exceptions as boto

from fleet_import.error_table import s3_error_code, s3_no_answer
from fleet_import.errors import (
    ErrorKind,
    FleetImportError,
    OperationalStoreError,
    WarehouseError,
)

_NOT_MIGRATED = frozenset({"42P01", "3F000", "42883"})  # table, schema, function missing
_NO_DATABASE = "3D000"
_LOGIN_REFUSED = frozenset({"28P01", "28000"})
_NO_BUCKET = "NoSuchBucket"
_ACCESS_DENIED = frozenset({"AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch"})
_THROTTLED = frozenset({"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded"})

_CAUSES_FOLLOWED = 5

DB_UPGRADE_HINT = "run `fleet-import db upgrade`"
S3_NO_ANSWER = "S3 does not answer"


@dataclass(frozen=True)
class Advice:
    """What went wrong (our own message) and the next step, printed as one line."""

    problem: str
    next_step: str = ""

    def __str__(self) -> str:
        return f"{self.problem}: {self.next_step}" if self.next_step else self.problem


@dataclass(frozen=True)
class _Named:
    """Where a database is set: its endpoint, its login, its name (the next step's words)."""

    endpoint: str
    login: str
    database: str

    @classmethod
    def by_url(cls, variable: str) -> _Named:
        return cls(f"{variable} (host:port)", variable, variable)


_OPERATIONAL = _Named.by_url("FLEET_DATABASE_URL")
_OR_URL = " (or a redshift:// FLEET_WAREHOUSE_URL)"
_WAREHOUSES = {
    "postgres": _Named.by_url("FLEET_WAREHOUSE_URL"),
    "redshift": _Named(
        f"FLEET_REDSHIFT_HOST and FLEET_REDSHIFT_PORT{_OR_URL}",
        f"FLEET_REDSHIFT_USER and FLEET_REDSHIFT_PASSWORD{_OR_URL}",
        f"FLEET_REDSHIFT_DATABASE{_OR_URL}",
    ),
}
"""What a warehouse error's next step names, by the backend that raised it: Redshift is
mostly set by FLEET_REDSHIFT_*, never only by a FLEET_WAREHOUSE_URL."""


def _database(exc: FleetImportError, named: _Named) -> Advice:
    code, problem = exc.code or "", _one_line(exc)
    if code in _NOT_MIGRATED:
        if named is _OPERATIONAL:
            return Advice(problem, DB_UPGRADE_HINT)
        return Advice(problem, "run `fleet-import doctor` to see which curated table is wrong")
    if code == _NO_DATABASE:
        return Advice(problem, f"create the database, or fix its name in {named.database}")
    if code in _LOGIN_REFUSED:
        return Advice(problem, f"check the user and password in {named.login}")
    if not code or code.startswith(("08", "57P")):
        return Advice(problem, f"check {named.endpoint} and that the server runs")
    return Advice(problem)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def advise(exc: BaseException) -> Advice | None:
    """What went wrong and what to do, or None for an unforeseen error (a bug)."""
    if isinstance(exc, OperationalStoreError):
        return _database(exc, _OPERATIONAL)
    if isinstance(exc, WarehouseError) and (exc.code or exc.kind is ErrorKind.TRANSIENT):
        if exc.backend == "postgres" and exc.setting:
            return _database(exc, _Named.by_url(exc.setting))
        return _database(exc, _WAREHOUSES.get(exc.backend, _WAREHOUSES["postgres"]))
    s3 = advise_s3(exc, _bucket_named_by(exc))
    if s3:
        return Advice(_one_line(exc), s3.next_step) if isinstance(exc, FleetImportError) else s3
    if isinstance(exc, FleetImportError):
        return Advice(_one_line(exc))
    return None


def explain(exc: BaseException) -> str | None:
    """`advise` as the one line the CLI prints and a failed run carries."""
    advice = advise(exc)
    return None if advice is None else str(advice)


def with_next_step(message: str, exc: BaseException) -> str:
    """`message` (what a failed batch records) followed by the next step for `exc`, when
    one is known: a batch that failed on its bucket, credentials or warehouse says what to
    check, as the CLI's one line does."""
    advice = advise(exc)
    if advice is None or not advice.next_step or message.endswith(advice.next_step):
        return message
    return f"{message}: {advice.next_step}"


def _bucket_named_by(exc: BaseException) -> str:
    cause: BaseException | None = exc
    for _ in range(_CAUSES_FOLLOWED):
        if isinstance(cause, FleetImportError) and cause.bucket_named_by:
            return cause.bucket_named_by
        cause = None if cause is None else cause.__cause__ or cause.__context__
        if cause is None:
            break
    return "FLEET_STAGING_URI"


def advise_s3(exc: BaseException, bucket_variable: str = "FLEET_STAGING_URI") -> Advice | None:
    """Missing buckets, missing or refused credentials, an endpoint that does not answer."""
    cause: BaseException | None = exc
    seen = 0
    while cause is not None and seen < _CAUSES_FOLLOWED:  # our error wraps botocore's
        code = s3_error_code(cause)
        if code == _NO_BUCKET:
            return Advice("the S3 bucket does not exist", f"create it, or check {bucket_variable}")
        if code in _ACCESS_DENIED:
            return Advice(
                "S3 refused the credentials or the request",
                "check AWS_ACCESS_KEY_ID / AWS_PROFILE and the bucket policy",
            )
        if isinstance(cause, boto.NoCredentialsError | boto.PartialCredentialsError):
            return Advice(
                "no AWS credentials",
                "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE",
            )
        if isinstance(cause, boto.NoRegionError):
            return Advice("no AWS region", "set AWS_DEFAULT_REGION")
        if code in _THROTTLED:
            return Advice(
                "S3 kept throttling the requests",
                "rerun later; if it persists, spread the load or raise FLEET_S3_MAX_ATTEMPTS",
            )
        if s3_no_answer(cause):
            # after FLEET_S3_MAX_ATTEMPTS attempts of the FLEET_S3_*_TIMEOUT_SECONDS (s3.client)
            return Advice(S3_NO_ANSWER, "check FLEET_S3_ENDPOINT_URL (or the network to AWS)")
        cause, seen = cause.__cause__ or cause.__context__, seen + 1
    return None
