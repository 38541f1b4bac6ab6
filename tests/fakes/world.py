"""An ImportContext on the fakes: the in-memory store, outbox and warehouse, S3 on a dict
and the staging area in a local directory, with the default publication steps. What the
driver's branch tests run on, with no server at all."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet_import.importing.context import ImportContext
from fleet_import.publication.publisher import DEFAULT_MAX_ATTEMPTS, Publisher
from fleet_import.retry import Backoff
from fleet_import.s3.staging import StagingArea
from fleet_import.sample_data import fleet_delivery, today_folder
from fleet_import.scope import split_folder
from tests.fakes.outbox import MemoryOutboxRepository
from tests.fakes.s3 import MemoryS3
from tests.fakes.state import MemoryStore
from tests.fakes.store import MemoryBatchRepository
from tests.fakes.warehouse import MemoryWarehouse

LANDING = "fleet-landing"
LEASE_TTL = 30.0


@dataclass
class World:
    store: MemoryStore
    repo: MemoryBatchRepository
    outbox: MemoryOutboxRepository
    warehouse: MemoryWarehouse
    s3: MemoryS3
    publisher: Publisher
    ctx: ImportContext
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def event_names(self) -> list[str]:
        return [name for name, _ in self.events]

    def deliver(self, tenant_id: str = "acme", files: dict[str, bytes] | None = None) -> str:
        """Upload a delivery (a small Fleet one by default); returns its folder."""
        folder = today_folder(LANDING, tenant_id)
        bucket, prefix = split_folder(folder)
        delivery = files if files is not None else fleet_delivery(trips=20, fuel=8, vehicles=4)
        self.s3.put_objects(bucket, {prefix + name: data for name, data in delivery.items()})
        return folder


def memory_world(
    tmp_path: Path, *, lease_ttl: float = LEASE_TTL, max_attempts: int = DEFAULT_MAX_ATTEMPTS
) -> World:
    store = MemoryStore()
    repo, outbox = MemoryBatchRepository(store), MemoryOutboxRepository(store)
    warehouse, s3 = MemoryWarehouse(), MemoryS3()
    s3.create_bucket(LANDING)
    staging = StagingArea(str(tmp_path / "staging"))
    events: list[tuple[str, dict[str, Any]]] = []

    def record(name: str, payload: Any) -> None:
        events.append((name, dict(payload)))

    publisher = Publisher(
        repo,  # type: ignore[arg-type]  # the fakes have the repositories' methods
        outbox,  # type: ignore[arg-type]
        warehouse,
        events=record,
        staging=staging,
        backoff=Backoff((0.0,)),
        max_attempts=max_attempts,
    )
    ctx = ImportContext(
        repo=repo,  # type: ignore[arg-type]
        warehouse=warehouse,
        s3=s3,
        staging=staging,
        lease_ttl=lease_ttl,
        publisher=publisher,
        events=record,
        workdir=tmp_path / "work",
    )
    return World(store, repo, outbox, warehouse, s3, publisher, ctx, events)
