"""Settings from the environment (prefix FLEET_), Prefect blocks where registered, defaults:
resolved once, in one order (`resolve_settings`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
# Files normalized at once while finished ones load: two keep the COPY busy and a 2M-row
# delivery under 400 MB (benchmarks/README.md).
DEFAULT_NORMALIZE_WORKERS = 2
DEFAULT_LEASE_TTL_SECONDS = 120.0
# How long the outcome of a slice COMMIT that got no answer is read back from the slice
# stamp before the batch is left running for the next run to settle (importing.settle): an
# outage of a minute or two, a failover, ends in the same run.
DEFAULT_COMMIT_READBACK_SECONDS = 120.0
DEFAULT_WAREHOUSE_REPLY_TIMEOUT_SECONDS = 900.0
"""A statement with no answer for this long ends its connection: longer than any slice COPY,
COMMIT or refresh should take, far shorter than for ever."""
DEFAULT_DATABASE_REPLY_TIMEOUT_SECONDS = 30.0
"""An operational statement with no answer for this long ends its connection: every one is
a few rows by index, so far longer than any should take, and shorter than a lease renewal
interval (40 s of the default TTL), so one hung renewal leaves the next its turn."""
# The sweep enters folders dated from this many days ago through tomorrow, so its cost does
# not grow with history; a delivery older than that is imported by a run with a longer lookback.
DEFAULT_SWEEP_LOOKBACK_DAYS = 3
# Warehouse loads at once across every worker, and of one tenant: a tenant's backfill takes
# at most half the slots, so fresh deliveries of the others still load (deployments/README).
DEFAULT_WAREHOUSE_LOAD_SLOTS = 4
DEFAULT_TENANT_LOAD_SLOTS = 2
# The landing layout every import checks a folder against (fleet_import.intake.landing's
# DEFAULT_PATTERN; the relay and the sweep take theirs from their own options).
DEFAULT_LANDING_PATTERN = "{tenant}/fleet/{yyyy-mm-dd}/"
# S3 is retried by botocore alone (fleet_import.s3.client): these bound one S3 call, and so
# how soon a run against an S3 that stopped answering ends (fleet_import.s3.client.call_bound:
# 63 s with these; docs/faults.md).
DEFAULT_S3_CONNECT_TIMEOUT_SECONDS = 5.0
DEFAULT_S3_READ_TIMEOUT_SECONDS = 15.0
DEFAULT_S3_MAX_ATTEMPTS = 3
# The longest CSV line (record) sure to be read: Arrow parses in blocks at least this big,
# and keeps a few dozen of them read ahead, so memory grows with it (docs/configuration.md).
DEFAULT_CSV_MAX_LINE_BYTES = 1 << 20
MAX_CSV_MAX_LINE_BYTES = 1 << 28


class Settings(BaseSettings):
    """Every knob the core reads. Durations are seconds."""

    model_config = SettingsConfigDict(env_prefix="FLEET_", extra="ignore")

    database_url: str = Field(
        DEFAULT_DATABASE_URL, description="operational PostgreSQL (ingestion_batches, outbox)"
    )
    database_reply_timeout_seconds: float = Field(
        DEFAULT_DATABASE_REPLY_TIMEOUT_SECONDS,
        gt=0,
        description="the longest an operational-database statement may go without an answer "
        "before its connection is given up (a black hole the TCP keepalives cannot see)",
    )
    warehouse_url: str | None = Field(
        None, description="warehouse PostgreSQL; defaults to the operational database"
    )
    s3_endpoint_url: str | None = Field(None, description="S3 endpoint (moto, MinIO); AWS if unset")
    s3_connect_timeout_seconds: float = Field(
        DEFAULT_S3_CONNECT_TIMEOUT_SECONDS, gt=0, description="S3: wait this long to connect"
    )
    s3_read_timeout_seconds: float = Field(
        DEFAULT_S3_READ_TIMEOUT_SECONDS,
        gt=0,
        description="S3: wait this long for each read of an answer (not for the whole body)",
    )
    s3_max_attempts: int = Field(
        DEFAULT_S3_MAX_ATTEMPTS,
        ge=1,
        le=10,
        description="S3: attempts of one call, the first included (botocore's standard "
        "retries: throttling, 5xx, timeouts, dropped connections); nothing above retries S3",
    )
    staging_uri: str | None = Field(
        None, description="s3://bucket/prefix/ for normalized Parquet and rejects"
    )
    lease_ttl_seconds: float = Field(
        DEFAULT_LEASE_TTL_SECONDS, gt=0, description="execution lease length"
    )
    commit_readback_seconds: float = Field(
        DEFAULT_COMMIT_READBACK_SECONDS,
        ge=0,
        description="how long the outcome of a slice COMMIT that got no answer is read back "
        "from the slice stamp before the batch is left running for the next run to settle",
    )
    warehouse_reply_timeout_seconds: float = Field(
        DEFAULT_WAREHOUSE_REPLY_TIMEOUT_SECONDS,
        gt=0,
        description="the longest a warehouse statement may go without an answer before its "
        "connection is given up (a black hole the TCP keepalives cannot see)",
    )
    delivery_manifest_name: str = Field(
        "_manifest.json",
        min_length=1,
        description="a delivery folder's own manifest (Redshift COPY manifest shape)",
    )
    retain_days: float = Field(
        7.0,
        ge=0,
        description="days the normalized files of a scope's earlier successes are kept for "
        "rollbacks (the previous success is always kept)",
    )
    retain_batches: int = Field(
        1, ge=1, description="earlier successes of a scope whose files are kept, however old"
    )
    state_retain_days: float = Field(
        30.0,
        ge=0,
        description="days after which the trim-operational-state flow deletes succeeded "
        "batches' outbox steps and delivered lineage events, and compacts their details",
    )
    sweep_lookback_days: int = Field(
        DEFAULT_SWEEP_LOOKBACK_DAYS,
        ge=0,
        description="days back the sweep looks for dated landing folders (0: every folder)",
    )
    warehouse: Literal["postgres", "redshift"] = Field("postgres", description="warehouse backend")
    redshift_host: str | None = Field(None, description="Redshift endpoint host")
    redshift_port: int = Field(5439, description="Redshift port")
    redshift_database: str = Field("dev", description="Redshift database")
    redshift_user: str | None = Field(None, description="Redshift user (password auth)")
    redshift_password: SecretStr | None = Field(None, description="Redshift password")
    redshift_iam: bool = Field(False, description="authenticate with IAM instead of a password")
    redshift_cluster_identifier: str | None = Field(None, description="IAM auth: cluster id")
    redshift_region: str | None = Field(None, description="IAM auth: AWS region")
    redshift_db_user: str | None = Field(None, description="IAM auth: database user")
    redshift_ssl: bool = Field(True, description="TLS to Redshift")
    redshift_serverless: bool = Field(
        False,
        description="the endpoint is a Redshift Serverless workgroup (also detected from "
        "a *.redshift-serverless.amazonaws.com host)",
    )
    redshift_iam_role: str | None = Field(
        None, description="role ARN Redshift assumes for COPY (never credentials in SQL)"
    )
    redshift_staging_uri: str | None = Field(
        None, description="s3:// prefix COPY reads from; defaults to the staging URI"
    )
    contracts: str | None = Field(
        None, description="extra dataset contracts: YAML paths or modules, comma-separated"
    )
    normalize_workers: int = Field(
        DEFAULT_NORMALIZE_WORKERS, ge=1, le=32, description="files normalized at once"
    )
    csv_max_line_bytes: int = Field(
        DEFAULT_CSV_MAX_LINE_BYTES,
        ge=1024,
        le=MAX_CSV_MAX_LINE_BYTES,
        description="the longest CSV line (a record, quoted values spanning lines included) "
        "sure to be read, in bytes; a file with a longer one fails, naming it",
    )
    warehouse_load_slots: int = Field(
        DEFAULT_WAREHOUSE_LOAD_SLOTS,
        ge=0,
        description="slice loads at once, all workers (0: no cap)",
    )
    tenant_load_slots: int = Field(
        DEFAULT_TENANT_LOAD_SLOTS,
        ge=0,
        description="slice loads at once of one tenant (0: no cap)",
    )
    dask_address: str | None = Field(
        None, description="Dask scheduler (tcp://host:8786) flows normalize on; else threads"
    )
    refresh_sql: list[str] = Field(
        default_factory=list, description="warehouse SQL run by refresh_dependants (JSON list)"
    )
    workdir: str | None = Field(None, description="local scratch directory; a temp dir if unset")
    tenants: str | None = Field(
        None, description="tenant registry YAML (fleet_import.tenants.registry); none: any slug"
    )
    freshness: str | None = Field(
        None,
        description="freshness SLO file (fleet_import.freshness.policies); none: no check",
    )
    openlineage: str | None = Field(
        None,
        description="OpenLineage transport: http(s)://host:5000 or file:///path.jsonl; none: off",
    )
    openlineage_namespace: str = Field(
        "fleet-import", description="OpenLineage job namespace of the slice runs"
    )
    landing_prefix: str = Field("", description="key prefix above the tenant folders")
    landing_pattern: str = Field(
        DEFAULT_LANDING_PATTERN, description="tenant folder layout after the landing prefix"
    )

    def redshift_connect_kwargs(self) -> dict[str, object]:
        """redshift_connector.connect arguments: IAM or password, TLS as configured. A
        `redshift://user:password@host:5439/db` FLEET_WAREHOUSE_URL (what the warehouse block
        holds) fills whatever the FLEET_REDSHIFT_* variables leave unset."""
        url = urlsplit(self.warehouse_url or "")
        from_url = url.scheme == "redshift"
        password = self.redshift_password.get_secret_value() if self.redshift_password else None
        kwargs: dict[str, object] = {
            "host": self.redshift_host or (url.hostname if from_url else None),
            "port": url.port
            if from_url and url.port and not self.redshift_host
            else self.redshift_port,
            "database": (url.path.lstrip("/") if from_url else "") or self.redshift_database,
            "ssl": self.redshift_ssl,
        }
        if self.redshift_serverless:  # the driver's IAM login asks Serverless then, too
            kwargs["is_serverless"] = True
        user = self.redshift_user or (unquote(url.username) if from_url and url.username else None)
        if from_url and password is None and url.password:
            password = unquote(url.password)
        if self.redshift_iam:
            kwargs.update(
                iam=True,
                cluster_identifier=self.redshift_cluster_identifier,
                region=self.redshift_region,
                db_user=self.redshift_db_user,
            )
        else:
            kwargs.update(user=user, password=password)
        return {k: v for k, v in kwargs.items() if v is not None}

    @property
    def effective_warehouse_url(self) -> str:
        return self.warehouse_url or self.database_url

    @property
    def warehouse_url_setting(self) -> str:
        """The variable `effective_warehouse_url` comes from: what its errors name."""
        return "FLEET_WAREHOUSE_URL" if self.warehouse_url else "FLEET_DATABASE_URL"


def libpq_url(url: str) -> str:
    """A URL psycopg accepts, whatever SQLAlchemy dialect suffix it carries."""
    for prefix in ("postgresql+psycopg://", "postgresql+psycopg2://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql://" + url[len(prefix) :]
    return url


def sqlalchemy_url(url: str) -> str:
    """The same database as a SQLAlchemy URL on the psycopg 3 driver."""
    return "postgresql+psycopg://" + libpq_url(url).removeprefix("postgresql://")


_MASK = "***"
_PASSWORD_PARAMETER = re.compile(r"(?i)(?<=[?&])password=[^&]*")


def masked_url(url: str) -> str:
    """`url` as it may be printed: its password (in the user part or a `password=` query
    parameter) replaced by ***, everything else as given."""
    scheme, sep, rest = url.partition("://")
    rest = _PASSWORD_PARAMETER.sub(f"password={_MASK}", rest)
    # The user part ends at the last '@', not at the first '/', '?' or '#' as urlsplit has it:
    # a password holding one of those unencoded (libpq may still connect) is masked whole. An
    # '@' in the query masks more than the password, never less.
    userinfo, at, after = rest.rpartition("@")
    user, colon, _password = userinfo.partition(":")
    return f"{scheme}{sep}{user}{colon and ':' + _MASK}{at}{after}"


SOURCE_DEFAULT = "default"
SOURCE_ENVIRONMENT = "environment"


@dataclass(frozen=True)
class ResolvedSettings:
    """The settings every command, flow and check uses, with where each value came from.

    One order, everywhere: a `FLEET_*` variable in the environment wins; else a registered
    Prefect block's value; else the default. `overruled` names each setting whose variable
    won over a block that holds another value, which the caller says once."""

    settings: Settings
    sources: Mapping[str, str]
    overruled: tuple[str, ...] = ()

    def source_of(self, field: str) -> str:
        return self.sources.get(field, SOURCE_DEFAULT)

    def overruled_line(self) -> str | None:
        """One line naming every variable that won over a block, and how to use the block."""
        if not self.overruled:
            return None
        return (
            "the environment wins over the Prefect blocks for "
            + ", ".join(self.overruled)
            + ": unset those variables to use the blocks' values"
        )


def env_variable(field: str) -> str:
    return f"FLEET_{field.upper()}"


def resolve_settings(
    from_env: Settings,
    stored: Mapping[str, tuple[Any, str]],
    env: Mapping[str, str],
) -> ResolvedSettings:
    """`from_env` (the environment over the defaults) with the blocks' `stored` values
    (field -> (value, block name)) applied where no variable is set."""
    present = {name.upper() for name in env}
    in_env = {field for field in Settings.model_fields if env_variable(field) in present}
    sources = {field: SOURCE_ENVIRONMENT for field in in_env}
    update: dict[str, Any] = {}
    overruled: list[str] = []
    for field, (value, block) in stored.items():
        if field not in in_env:
            update[field] = value
            sources[field] = f"block {block}"
        elif _differs(getattr(from_env, field), value):
            overruled.append(f"{env_variable(field)} (block {block})")
    settings = from_env.model_copy(update=update) if update else from_env
    return ResolvedSettings(settings, sources, tuple(overruled))


def _differs(current: Any, stored: Any) -> bool:
    if isinstance(current, SecretStr):
        current = current.get_secret_value()
    return bool(current != stored)
