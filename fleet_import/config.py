"""Settings from the environment (prefix FLEET_); flows may override them from Prefect blocks."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


class Settings(BaseSettings):
    """Every knob the core reads. Durations are seconds."""

    model_config = SettingsConfigDict(env_prefix="FLEET_", extra="ignore")

    database_url: str = Field(
        DEFAULT_DATABASE_URL, description="operational PostgreSQL (ingestion_batches, outbox)"
    )
    warehouse_url: str | None = Field(
        None, description="warehouse PostgreSQL; defaults to the operational database"
    )
    s3_endpoint_url: str | None = Field(None, description="S3 endpoint (moto, MinIO); AWS if unset")
    staging_uri: str | None = Field(
        None, description="s3://bucket/prefix/ for normalised Parquet and rejects"
    )
    lease_ttl_seconds: float = Field(120.0, gt=0, description="execution lease length")
    warehouse: str = Field("postgres", description="warehouse backend: postgres (redshift later)")
    contracts: str | None = Field(
        None, description="extra dataset contracts: YAML paths or modules, comma-separated"
    )
    normalize_workers: int = Field(2, ge=1, le=32, description="files normalised at once")
    refresh_sql: list[str] = Field(
        default_factory=list, description="warehouse SQL run by refresh_dependants (JSON list)"
    )
    workdir: str | None = Field(None, description="local scratch directory; a temp dir if unset")

    @property
    def effective_warehouse_url(self) -> str:
        return self.warehouse_url or self.database_url


def libpq_url(url: str) -> str:
    """A URL psycopg accepts, whatever SQLAlchemy dialect suffix it carries."""
    for prefix in ("postgresql+psycopg://", "postgresql+psycopg2://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql://" + url[len(prefix) :]
    return url


def sqlalchemy_url(url: str) -> str:
    """The same database as a SQLAlchemy URL on the psycopg 3 driver."""
    return "postgresql+psycopg://" + libpq_url(url).removeprefix("postgresql://")
