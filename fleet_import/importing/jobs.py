"""What a step's task carries to another process (a Dask worker normalizing a file): a small
picklable job description, never the ImportContext (its connections, generator and callbacks
do not travel). In the process that made the job its own context is used; elsewhere one is
built from the job's settings (runtime.remote_context), once per settings per process."""

from __future__ import annotations

import os
import uuid
import weakref
from dataclasses import dataclass

from fleet_import.config import Settings
from fleet_import.contracts.model import DatasetContract
from fleet_import.importing.context import ImportContext
from fleet_import.importing.normalized_files import NormalizedEntry, normalize_one
from fleet_import.importing.runtime import remote_context
from fleet_import.s3.sources import SourceObject

# The contexts of this process that made jobs, by key; weak, so a job keeps none alive.
_LOCAL_CONTEXTS: weakref.WeakValueDictionary[str, ImportContext] = weakref.WeakValueDictionary()


@dataclass(frozen=True)
class NormalizeJob:
    """One file of a batch's delivery to normalize."""

    batch_id: uuid.UUID
    tenant_id: str
    """Whose staging prefix the normalized output goes to."""
    bucket: str
    obj: SourceObject
    context_key: str
    """The context in the process that made the job (pid and object id)."""
    settings: Settings | None
    """What the context was built from; None for a context a test built (it stays home)."""
    contract: DatasetContract | None = None
    """The file's contract as the batch reads it: with columns drift added to its table
    (importing.drift), which a context rebuilt from settings would not know."""

    @classmethod
    def of(
        cls,
        ctx: ImportContext,
        batch_id: uuid.UUID,
        tenant_id: str,
        bucket: str,
        obj: SourceObject,
    ) -> NormalizeJob:
        key = f"{os.getpid()}:{id(ctx)}"
        _LOCAL_CONTEXTS[key] = ctx
        contract = ctx.contracts[obj.dataset]
        return cls(batch_id, tenant_id, bucket, obj, key, ctx.settings, contract)


def job_context(job: NormalizeJob) -> ImportContext:
    """The context the job runs against here."""
    ctx = _LOCAL_CONTEXTS.get(job.context_key)
    if ctx is not None:
        return ctx
    if job.settings is None:
        raise TypeError("a context built without settings cannot leave its process")
    return remote_context(job.settings)


def run_normalize_job(job: NormalizeJob) -> NormalizedEntry:
    """The normalize step, mapped over a delivery's files."""
    return normalize_one(
        job_context(job), job.batch_id, job.tenant_id, job.bucket, job.obj, job.contract
    )
