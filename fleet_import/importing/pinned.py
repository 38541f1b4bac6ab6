"""A batch that loads stored content instead of what its folder holds now (a rollback):
its details pin the manifest, and discovery reads that instead of listing the folder.
Its files then come from the normalized-file cache, keyed by the pinned etags."""

from __future__ import annotations

import uuid

from fleet_import.importing.context import ImportContext
from fleet_import.s3.sources import Manifest
from fleet_import.store.details import BatchDetails


def pin_manifest(ctx: ImportContext, batch_id: uuid.UUID, owner: str, manifest: Manifest) -> None:
    ctx.repo.update_details(batch_id, owner, BatchDetails.patch(pinned_manifest=manifest.to_json()))


def pinned_manifest(ctx: ImportContext, batch_id: uuid.UUID) -> Manifest | None:
    """The manifest the batch must load, if one is pinned (None: list the folder)."""
    batch = ctx.repo.get(batch_id)
    raw = batch.record.pinned_manifest if batch is not None else None
    return Manifest.from_json(raw) if raw is not None else None
