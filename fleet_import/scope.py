"""Tenant ids, canonical S3 folders and source scopes.

Everything that later reaches SQL or S3 as a tenant or a folder passes through here first,
so that one place decides what is valid and every error names the problem.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import unquote

from fleet_import.errors import InvalidInput

SOURCE_SCOPE_PREFIX = "fleet_s3:"
SOURCE_SCOPE_MAX_LENGTH = 200

_TENANT_ID = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_SCHEME = "s3://"
# S3 keys may hold almost anything, but control characters in a folder name are always a
# mistake (a pasted newline, a tab) and make logs and scopes ambiguous.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_COMPANY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")
_DATABASE = re.compile(r"[a-z_][a-z0-9_$]{0,126}")


class InvalidTenant(InvalidInput):
    """The tenant is invalid."""


class InvalidFolder(InvalidInput):
    """The S3 folder is invalid."""


class ScopeTooLong(InvalidInput):
    """The source scope is longer than the operational store allows."""


def validate_tenant_id(tenant_id: object) -> str:
    if not isinstance(tenant_id, str) or not _TENANT_ID.fullmatch(tenant_id):
        raise InvalidTenant(
            f"invalid tenant id {tenant_id!r}: expected 1-63 characters of lower-case letters, "
            "digits, '_' or '-', starting with a letter or digit"
        )
    return tenant_id


@dataclass(frozen=True)
class Tenant:
    """A customer: its slug, its company id and the warehouse database its slices live in."""

    tenant_id: str
    company_id: str
    database: str

    def __post_init__(self) -> None:
        validate_tenant_id(self.tenant_id)
        if not isinstance(self.company_id, str) or not _COMPANY_ID.fullmatch(self.company_id):
            raise InvalidTenant(
                f"invalid company id {self.company_id!r} for tenant {self.tenant_id!r}: expected "
                "1-64 letters, digits, '_', '.', ':' or '-'"
            )
        if not isinstance(self.database, str) or not _DATABASE.fullmatch(self.database):
            raise InvalidTenant(
                f"invalid warehouse database {self.database!r} for tenant {self.tenant_id!r}: "
                "expected a lower-case identifier"
            )

    @classmethod
    def named(cls, tenant_id: str) -> Tenant:
        """A tenant whose company id and database follow from its slug (the common case)."""
        validate_tenant_id(tenant_id)
        return cls(tenant_id, tenant_id, "tenant_" + re.sub(r"[^a-z0-9_]", "_", tenant_id))


def _validate_bucket(bucket: str, folder: str) -> None:
    if not bucket:
        raise InvalidFolder(f"invalid S3 folder {folder!r}: the bucket name is empty")
    if not _BUCKET.fullmatch(bucket) or ".." in bucket or ".-" in bucket or "-." in bucket:
        raise InvalidFolder(
            f"invalid S3 folder {folder!r}: {bucket!r} is not a valid bucket name (3-63 "
            "characters of lower-case letters, digits, '.' and '-', starting and ending with a "
            "letter or digit)"
        )
    try:
        ipaddress.IPv4Address(bucket)
    except ValueError:
        return
    raise InvalidFolder(f"invalid S3 folder {folder!r}: a bucket name cannot be an IP address")


def canonical_folder(folder: object) -> str:
    """`s3://bucket/prefix/`: lower-case scheme and bucket, one trailing slash, no empty,
    `.` or `..` segments, percent-decoded once."""
    if not isinstance(folder, str):
        raise InvalidFolder(
            f"invalid S3 folder {folder!r}: expected a string like s3://bucket/prefix/"
        )
    if _CONTROL.search(folder):
        raise InvalidFolder(f"invalid S3 folder {folder!r}: it contains a control character")
    if folder[: len(_SCHEME)].lower() != _SCHEME:
        scheme = folder.split("://", 1)[0] + "://" if "://" in folder else "no scheme"
        raise InvalidFolder(
            f"invalid S3 folder {folder!r}: only s3:// folders are supported (got {scheme})"
        )
    bucket, _, raw_prefix = folder[len(_SCHEME) :].partition("/")
    bucket = bucket.lower()
    _validate_bucket(bucket, folder)
    try:
        prefix = unquote(raw_prefix, errors="strict")
    except UnicodeDecodeError:
        raise InvalidFolder(
            f"invalid S3 folder {folder!r}: its percent-encoding is not valid UTF-8"
        ) from None
    if _CONTROL.search(prefix):
        raise InvalidFolder(
            f"invalid S3 folder {folder!r}: it contains a percent-encoded control character"
        )
    if "%" in prefix:
        # The canonical folder is decoded again wherever it is used (split_folder, a stored
        # scope, a manifest), so a '%' left after this decoding (`%252e%252e`, `%2541`) would
        # be decoded a second time: the scope would name one prefix (`%41`) while another
        # (`A`) is listed, so two scopes could hold the same S3 folder.
        raise InvalidFolder(
            f"invalid S3 folder {folder!r}: it still holds '%' after percent-decoding "
            "(double-encoded?); folder names with a literal '%' are not supported"
        )
    segments = [segment for segment in prefix.split("/") if segment]
    for segment in segments:
        if segment in (".", ".."):
            raise InvalidFolder(
                f"invalid S3 folder {folder!r}: {segment!r} path segments are not allowed"
            )
    if not segments:
        raise InvalidFolder(
            f"invalid S3 folder {folder!r}: name a prefix inside the bucket, not the whole bucket"
        )
    return f"{_SCHEME}{bucket}/{'/'.join(segments)}/"


def source_scope(folder: str) -> str:
    """The unit of exclusivity and replacement: `fleet_s3:` + the canonical folder."""
    scope = SOURCE_SCOPE_PREFIX + canonical_folder(folder)
    if len(scope) > SOURCE_SCOPE_MAX_LENGTH:
        raise ScopeTooLong(
            f"source scope for {folder!r} is {len(scope)} characters; at most "
            f"{SOURCE_SCOPE_MAX_LENGTH} fit (shorten the folder prefix)"
        )
    return scope


def folder_of_scope(scope: str) -> str:
    if not scope.startswith(SOURCE_SCOPE_PREFIX):
        raise InvalidFolder(f"{scope!r} is not a fleet_s3 source scope")
    return scope[len(SOURCE_SCOPE_PREFIX) :]


def folder_leaf(folder_or_scope: str) -> str:
    """`s3://b/acme/fleet/2026-07-22/` (or its scope) -> `2026-07-22`: what tells a
    tenant's deliveries apart, the one spelling of run names (`import/{tenant}/{leaf}`),
    the CLI's tables and the tenant's artifact. Text that names no folder comes back as
    it is (a run named from a bad parameter still gets a name)."""
    folder = folder_or_scope.removeprefix(SOURCE_SCOPE_PREFIX).rstrip("/")
    head, _, leaf = folder.rpartition("/")
    return leaf if head and leaf else folder_or_scope


def split_folder(folder: str) -> tuple[str, str]:
    """(bucket, key prefix with trailing slash) of a canonical folder."""
    bucket, _, prefix = canonical_folder(folder)[len(_SCHEME) :].partition("/")
    return bucket, prefix
