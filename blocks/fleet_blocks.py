"""Prefect blocks for fleet-import's connections, and the settings they override.

Three block types, one document each under a well-known name, editable in the Prefect UI:

| block type | document | overrides (`fleet_import.config.Settings`) |
| --- | --- | --- |
| FleetOperationalDatabase | `fleet-operational-db` | `database_url`, |
| | | `database_reply_timeout_seconds` |
| FleetLandingBucket | `fleet-landing` | `s3_endpoint_url`, `staging_uri` |
| FleetWarehouse | `fleet-warehouse` | `warehouse`, `warehouse_url`, `refresh_sql`, |
| | | `warehouse_reply_timeout_seconds`; Redshift: `redshift_iam_role`, `staging_uri` |

Every command and flow resolves its settings once (`blocks.settings_in_force`): a `FLEET_*`
variable set in the environment wins, else a block's value, else the default; a worker with
no blocks registered runs on `FLEET_*` variables alone. Secret values are `SecretStr`: the
UI shows them masked, and this module never logs them or puts them in an exception.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Literal

from prefect.blocks.core import Block
from prefect.exceptions import MissingContextError, ObjectNotFound
from prefect.logging import get_run_logger
from pydantic import Field, SecretStr, ValidationError

log = logging.getLogger(__name__)

OPERATIONAL_DB_BLOCK = "fleet-operational-db"
WAREHOUSE_BLOCK = "fleet-warehouse"
LANDING_BLOCK = "fleet-landing"

_S3_URI_PATTERN = r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$"
# user:password@ in any URL an error message may quote (the API URL, a proxy, a DSN).
_URL_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]+@")


class FleetOperationalDatabase(Block):
    """The operational PostgreSQL database: ingestion batches, execution leases and the
    publication outbox. One per deployment environment."""

    _block_type_name = "Fleet Operational Database"
    _block_type_slug = "fleet-operational-database"
    _description = (
        "Operational PostgreSQL of fleet-import (ingestion_batches, publication_outbox, "
        "normalized_files). Overrides FLEET_DATABASE_URL."
    )

    url: SecretStr = Field(
        ...,
        title="URL",
        description="postgresql://user:password@host:5432/dbname (a SQLAlchemy "
        "postgresql+psycopg:// URL is accepted too).",
    )
    # A connection's bound belongs with the connection: every worker reads the block.
    reply_timeout_seconds: float | None = Field(
        None,
        gt=0,
        title="Reply timeout (s)",
        description="The longest one operational-database statement may wait for its answer "
        "before its connection is given up. Empty: FLEET_DATABASE_REPLY_TIMEOUT_SECONDS "
        "decides (30 by default).",
    )

    def as_settings(self) -> dict[str, Any]:
        overrides: dict[str, Any] = {"database_url": self.url.get_secret_value()}
        if self.reply_timeout_seconds is not None:
            overrides["database_reply_timeout_seconds"] = self.reply_timeout_seconds
        return overrides


class FleetWarehouse(Block):
    """Where curated slices are written: PostgreSQL, or Redshift through S3 staging."""

    _block_type_name = "Fleet Warehouse"
    _block_type_slug = "fleet-warehouse"
    _description = (
        "Warehouse that receives the curated slices of fleet-import. Overrides "
        "FLEET_WAREHOUSE and FLEET_WAREHOUSE_URL (and FLEET_STAGING_URI for Redshift)."
    )

    backend: Literal["postgres", "redshift"] = Field(
        "postgres", description="Warehouse dialect: postgres or redshift."
    )
    url: SecretStr = Field(
        ...,
        title="URL",
        description="Warehouse connection URL, e.g. postgresql://user:password@host:5432/db "
        "or redshift://user:password@cluster.region.redshift.amazonaws.com:5439/db.",
    )
    iam_role: str | None = Field(
        None,
        title="IAM role",
        description="Redshift only: ARN of the role COPY assumes to read the staging prefix "
        "(credentials never enter SQL).",
    )
    staging_uri: str | None = Field(
        None,
        title="Staging URI",
        description="Redshift only: s3://bucket/prefix/ for the Parquet files COPY loads; "
        "replaces the landing block's staging URI when set.",
        pattern=_S3_URI_PATTERN,
    )
    # A deployment cannot set FLEET_REFRESH_SQL on every worker; the block reaches them all.
    refresh_sql: list[str] = Field(
        default_factory=list,
        title="Refresh SQL",
        description="Warehouse statements the refresh_dependants publication step runs, in "
        "order, after a slice is committed (e.g. REFRESH MATERIALIZED VIEW fleet_daily). "
        "Empty: FLEET_REFRESH_SQL decides (none by default).",
    )
    reply_timeout_seconds: float | None = Field(
        None,
        gt=0,
        title="Reply timeout (s)",
        description="The longest one warehouse statement (a COPY, the COMMIT, a refresh) may "
        "wait for its answer before its connection is given up. Empty: "
        "FLEET_WAREHOUSE_REPLY_TIMEOUT_SECONDS decides (900 by default).",
    )

    def as_settings(self) -> dict[str, Any]:
        overrides: dict[str, Any] = {
            "warehouse": self.backend,
            "warehouse_url": self.url.get_secret_value(),
        }
        if self.iam_role:
            overrides["redshift_iam_role"] = self.iam_role
        if self.staging_uri:
            overrides["staging_uri"] = self.staging_uri
        if self.refresh_sql:
            overrides["refresh_sql"] = list(self.refresh_sql)
        if self.reply_timeout_seconds is not None:
            overrides["warehouse_reply_timeout_seconds"] = self.reply_timeout_seconds
        return overrides


class FleetLandingBucket(Block):
    """Where the import reads S3 and stages normalized files.

    Which bucket and prefix hold the tenants' folders is not here: the sweep takes them as
    deployment parameters and the relay as options, and the S3 credentials come from boto3's
    chain (instance role, AWS_* variables, profile). Documents saved when this block held
    bucket, prefix and access keys still load; those values are ignored.
    """

    _block_type_name = "Fleet Landing Bucket"
    _block_type_slug = "fleet-landing-bucket"
    _description = (
        "S3 endpoint and staging area (normalized Parquet, rejects) of fleet-import. "
        "Overrides FLEET_S3_ENDPOINT_URL and FLEET_STAGING_URI."
    )

    endpoint_url: str | None = Field(
        None,
        title="Endpoint URL",
        description="S3-compatible endpoint (MinIO, moto); leave empty for AWS.",
    )
    staging_uri: str = Field(
        ...,
        title="Staging URI",
        description="s3://bucket/prefix/ for normalized Parquet and rejects.",
        pattern=_S3_URI_PATTERN,
    )

    def as_settings(self) -> dict[str, Any]:
        overrides: dict[str, Any] = {"staging_uri": self.staging_uri}
        if self.endpoint_url:
            overrides["s3_endpoint_url"] = self.endpoint_url
        return overrides


FleetBlock = FleetOperationalDatabase | FleetWarehouse | FleetLandingBucket

# (class, document name) in the order their overrides apply: the warehouse comes after the
# landing bucket so that a Redshift staging URI wins over the landing one.
BLOCK_DOCUMENTS: tuple[tuple[type[FleetBlock], str], ...] = (
    (FleetOperationalDatabase, OPERATIONAL_DB_BLOCK),
    (FleetLandingBucket, LANDING_BLOCK),
    (FleetWarehouse, WAREHOUSE_BLOCK),
)


def stored_settings() -> dict[str, tuple[Any, str]]:
    """`Settings` fields set by the block documents that exist under their default names,
    each with the document that set it (a later document's value wins, BLOCK_DOCUMENTS).

    A missing document (or an unregistered block type) is skipped silently: the environment
    decides. Any other failure is logged as a warning, without secrets, and skipped too.
    """
    stored: dict[str, tuple[Any, str]] = {}
    for block_cls, name in BLOCK_DOCUMENTS:
        block = _load_if_exists(block_cls, name)
        if block is not None:
            stored.update({field: (value, name) for field, value in block.as_settings().items()})
    return stored


def settings_overrides() -> dict[str, Any]:
    """The blocks' values alone, field by field (`stored_settings` without their sources)."""
    return {field: value for field, (value, _name) in stored_settings().items()}


def _load_if_exists(block_cls: type[FleetBlock], name: str) -> FleetBlock | None:
    slug = f"{block_cls.get_block_type_slug()}/{name}"
    try:
        # _sync: a sync call even from an async flow, where load() would return a coroutine.
        return block_cls.load(name, _sync=True)
    except ValueError as exc:
        if isinstance(exc.__cause__, ObjectNotFound):
            return None
        warn_in_run("ignoring Prefect block %s: %s", slug, describe_error(exc))
    except Exception as exc:  # noqa: BLE001 - configuration falls back to the environment
        warn_in_run("ignoring Prefect block %s: %s", slug, describe_error(exc))
    return None


def warn_in_run(message: str, *args: object) -> None:
    """Into the flow run's log (visible in the UI) inside a run, this module's log outside."""
    try:
        logger: logging.Logger | logging.LoggerAdapter[logging.Logger] = get_run_logger()
    except MissingContextError:
        logger = log
    logger.warning(message, *args)


def describe_error(exc: BaseException) -> str:
    """An error message safe to log: no validated input values, no URL credentials."""
    # Block.load raises pydantic's error itself, or wraps it (RuntimeError ... from it).
    invalid = exc if isinstance(exc, ValidationError) else exc.__cause__
    if isinstance(invalid, ValidationError):
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or '<document>'}: {error['msg']}"
            for error in invalid.errors(include_input=False, include_url=False)
        )
        return f"invalid block document ({problems})"
    return f"{type(exc).__name__}: {redact_url_credentials(str(exc))}"


def redact_url_credentials(text: str) -> str:
    return _URL_USERINFO.sub(r"\g<scheme>***@", text)
