"""Build the objects the algorithm talks to from Settings: one place, used by the CLI, the
flows and the demo."""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fleet_import.config import Settings, libpq_url
from fleet_import.contracts.files import contracts_in_force
from fleet_import.errors import ConfigurationError
from fleet_import.importing.context import ImportContext, Progress, no_event, no_progress
from fleet_import.publication.events import EventSink
from fleet_import.publication.lineage_delivery import (
    Lineage,
    LineageDelivery,
    LineageNaming,
    transport_emit,
)
from fleet_import.publication.publisher import Publisher
from fleet_import.publication.retention import Retention
from fleet_import.retry import spanning
from fleet_import.s3.client import settings_s3_client
from fleet_import.s3.staging import StagingArea
from fleet_import.store.gates import GateRepository
from fleet_import.store.lineage_outbox import LineageOutbox
from fleet_import.store.outbox import OutboxRepository
from fleet_import.store.repository import BatchRepository
from fleet_import.store.review_repository import ReviewRepository
from fleet_import.tenants.databases import (
    own_database,
    postgres_url_for,
    redshift_kwargs_for,
    templated,
)
from fleet_import.tenants.registry import registry_in_force
from fleet_import.warehouse.base import Warehouse
from fleet_import.warehouse.postgres.warehouse import PostgresWarehouse
from fleet_import.warehouse.routing import TenantWarehouses


@dataclass
class Runtime:
    settings: Settings
    ctx: ImportContext
    outbox: OutboxRepository
    publisher: Publisher


SECONDS_PER_DAY = 24 * 3600


def build_warehouse(settings: Settings, s3: Any) -> Warehouse:
    """The one warehouse, or one per tenant database when the registry or a `{database}`
    template says so (fleet_import.tenants.databases)."""
    registry = registry_in_force(settings.tenants)
    own = registry is not None and any(t.own_database for t in registry.tenants.values())
    if not (own or templated(settings)):
        return warehouse_of(settings, s3, None)
    return TenantWarehouses(
        lambda tenant_id: own_database(settings, tenant_id, registry),
        lambda database: warehouse_of(settings, s3, database),
        replays_slices=settings.warehouse == "redshift",
        shared=not templated(settings),
    )


def warehouse_of(settings: Settings, s3: Any, database: str | None) -> Warehouse:
    """The warehouse of one database (None: the shared one), never routed per tenant."""
    if settings.warehouse == "postgres":
        return PostgresWarehouse(
            postgres_url_for(settings, database),
            reply_timeout=settings.warehouse_reply_timeout_seconds,
            setting=settings.warehouse_url_setting,
        )
    from fleet_import.warehouse.redshift.warehouse import RedshiftWarehouse

    missing = [
        name
        for name, value in (
            (
                "FLEET_REDSHIFT_HOST (or a redshift:// FLEET_WAREHOUSE_URL)",
                settings.redshift_connect_kwargs().get("host"),
            ),
            ("FLEET_REDSHIFT_IAM_ROLE", settings.redshift_iam_role),
        )
        if not value
    ]
    staging_uri = settings.redshift_staging_uri or settings.staging_uri or ""
    if not staging_uri.startswith("s3://"):
        missing.append("FLEET_REDSHIFT_STAGING_URI (an s3:// prefix)")
    if missing:
        raise ConfigurationError(f"FLEET_WAREHOUSE=redshift needs {', '.join(missing)}")
    return RedshiftWarehouse(
        {
            **redshift_kwargs_for(settings, database),
            "timeout": max(1, round(settings.warehouse_reply_timeout_seconds)),
        },
        s3=s3,
        staging_uri=staging_uri,
        iam_role=str(settings.redshift_iam_role),
    )


def build_runtime(
    settings: Settings | None = None,
    *,
    events: EventSink = no_event,
    progress: Progress = no_progress,
    step_overrides: Mapping[str, Callable[..., Any]] | None = None,
) -> Runtime:
    settings = settings or Settings()
    if not settings.staging_uri:
        raise ConfigurationError(
            "FLEET_STAGING_URI is not set: name an s3://bucket/prefix/ (or a local directory) "
            "for normalized files and rejects"
        )
    s3 = settings_s3_client(settings)
    repo = BatchRepository.from_settings(settings)
    outbox = OutboxRepository.from_settings(settings)
    warehouse = build_warehouse(settings, s3)
    staging = StagingArea(settings.staging_uri, s3)
    publisher = Publisher(
        repo,
        outbox,
        warehouse,
        events=events,
        refresh_sql=settings.refresh_sql,
        run_warehouse_sql=warehouse.execute if settings.refresh_sql else None,
        staging=staging,
        retention=Retention(  # issue #24: what a rollback may load again
            ReviewRepository.from_settings(settings),
            keep_seconds=settings.retain_days * SECONDS_PER_DAY,
            keep_count=settings.retain_batches,
        ),
    )
    for name, handler in (step_overrides or {}).items():
        publisher.steps[name] = handler
    workdir = (
        Path(settings.workdir) if settings.workdir else Path(tempfile.gettempdir()) / "fleet-import"
    )
    ctx = ImportContext(
        repo=repo,
        warehouse=warehouse,
        s3=s3,
        staging=staging,
        contracts=contracts_in_force(settings.contracts),
        lease_ttl=settings.lease_ttl_seconds,
        commit_readback=spanning(settings.commit_readback_seconds),
        normalize_workers=settings.normalize_workers,
        csv_max_line_bytes=settings.csv_max_line_bytes,
        publisher=publisher,
        events=events,
        lineage=build_lineage(settings),
        gates=GateRepository.from_settings(settings),
        progress=progress,
        workdir=workdir,
        settings=settings,
    )
    return Runtime(settings, ctx, outbox, publisher)


def build_lineage(settings: Settings) -> Lineage | None:
    """OpenLineage as `FLEET_OPENLINEAGE` names it; None when it is unset. The warehouse's
    namespace carries host and port only, never its credentials."""
    if not settings.openlineage:
        return None
    if settings.warehouse == "redshift":
        kwargs = settings.redshift_connect_kwargs()
        where = f"redshift://{kwargs.get('host')}:{kwargs.get('port', 5439)}"
        database = str(kwargs.get("database") or "dev")
    else:
        url = urlsplit(libpq_url(settings.effective_warehouse_url))
        where = f"postgres://{url.hostname or 'localhost'}:{url.port or 5432}"
        database = url.path.lstrip("/") or "postgres"
    registry = registry_in_force(settings.tenants)
    naming = LineageNaming(
        settings.openlineage_namespace,
        where,
        database,
        lambda tenant_id: own_database(settings, tenant_id, registry),
    )
    outbox = LineageOutbox.from_settings(settings)
    return Lineage(naming, LineageDelivery(outbox, transport_emit(settings.openlineage)))


_REMOTE_CONTEXTS: dict[str, ImportContext] = {}


def remote_context(settings: Settings) -> ImportContext:
    """The context an ImportContext unpickles to in another process (a Dask worker running a
    normalize task): one per settings per process, with a scratch directory of its own, and
    `remote` set, so that its normalized files live in the staging area only."""
    password = settings.redshift_password
    key = settings.model_dump_json() + (password.get_secret_value() if password else "")
    if key not in _REMOTE_CONTEXTS:
        workdir = Path(tempfile.mkdtemp(prefix="fleet-import-remote-"))
        ctx = dataclasses.replace(build_runtime(settings).ctx, remote=True, workdir=workdir)
        _REMOTE_CONTEXTS[key] = ctx
    return _REMOTE_CONTEXTS[key]
