"""Build the objects the algorithm talks to from Settings: one place, used by the CLI, the
flows and the demo."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet_import.batches import BatchRepository
from fleet_import.batches.outbox import OutboxRepository
from fleet_import.config import Settings
from fleet_import.contracts import contracts_in_force
from fleet_import.errors import InvalidInput
from fleet_import.pipeline import EventSink, ImportContext, Progress, _no_event, _no_progress
from fleet_import.publication import Publisher
from fleet_import.sources import s3_client
from fleet_import.staging import StagingArea
from fleet_import.warehouse import PostgresWarehouse


@dataclass
class Runtime:
    settings: Settings
    ctx: ImportContext
    outbox: OutboxRepository
    publisher: Publisher


def build_runtime(
    settings: Settings | None = None,
    *,
    events: EventSink = _no_event,
    progress: Progress = _no_progress,
    step_overrides: Mapping[str, Callable[..., Any]] | None = None,
) -> Runtime:
    settings = settings or Settings()
    if settings.warehouse != "postgres":
        raise InvalidInput(f"unknown warehouse backend {settings.warehouse!r} (expected postgres)")
    if not settings.staging_uri:
        raise InvalidInput(
            "FLEET_STAGING_URI is not set: name an s3://bucket/prefix/ (or a local directory) "
            "for normalised files and rejects"
        )
    s3 = s3_client(settings.s3_endpoint_url)
    repo = BatchRepository(settings.database_url)
    outbox = OutboxRepository(settings.database_url)
    warehouse = PostgresWarehouse(settings.effective_warehouse_url)
    staging = StagingArea(settings.staging_uri, s3)
    publisher = Publisher(
        repo,
        outbox,
        warehouse,
        events=events,
        refresh_sql=settings.refresh_sql,
        run_warehouse_sql=warehouse.execute if settings.refresh_sql else None,
        staging=staging,
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
        normalize_workers=settings.normalize_workers,
        publisher=publisher,
        events=events,
        progress=progress,
        workdir=workdir,
    )
    return Runtime(settings, ctx, outbox, publisher)
