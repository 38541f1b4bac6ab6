"""Step 4 of the import: one source file to typed Parquet, or its cached output.

The normalized-file cache is keyed by (source key, etag, contract version): an unchanged
file is never parsed twice, and its staged output and rejects are read back instead.

Staged under the tenant's prefix, `{tenant}/normalized/{dataset}/{digest}.parquet` (and
`.rejects.csv` beside it), so a per-tenant IAM policy or KMS key can cover all a tenant's
staged data. A cache row records where its output is and is read from there: rows made
before the tenant prefix (`normalized/{dataset}/{digest}.parquet`) still resolve, and leave
with their files when retention supersedes them or the tenant is purged. A row that points
into another tenant's prefix is never read (normalized again instead).
"""

from __future__ import annotations

import csv
import hashlib
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

from fleet_import.contracts.model import DatasetContract
from fleet_import.importing.context import ImportContext
from fleet_import.normalize.file import normalize_file, write_rejects
from fleet_import.normalize.output import NormalizedFile
from fleet_import.normalize.rows import Reject
from fleet_import.s3.sources import Manifest, SourceObject, download_object, open_object
from fleet_import.s3.staging import StagingError
from fleet_import.scope import split_folder
from fleet_import.store.models import CachedFile


@dataclass
class NormalizedEntry:
    obj: SourceObject
    file: NormalizedFile
    cache_hit: bool
    seconds: float
    staged: str = ""  # the normalized Parquet's name in the staging area


_LEGACY_PREFIX = "normalized/"
"""Where the cache staged outputs before the tenant prefix: `normalized/{dataset}/{file}`."""


def staged_name(tenant_id: str, dataset: str, digest: str) -> str:
    """A normalized output's name in the staging area; its rejects are `rejects_name_of`."""
    return f"{tenant_id}/normalized/{dataset}/{digest}.parquet"


def rejects_name_of(staged: str) -> str:
    return staged.removesuffix(".parquet") + ".rejects.csv"


def _cached_name(ctx: ImportContext, tenant_id: str, output_uri: str) -> str | None:
    """The staged name a cache row records, if this tenant may read it: under its own
    prefix, or in the layout before tenant prefixes."""
    root = ctx.staging.uri("")
    if not output_uri.startswith(root):
        return None
    name = output_uri.removeprefix(root)
    legacy = name.startswith(_LEGACY_PREFIX) and name.count("/") == 2
    return name if name.startswith(f"{tenant_id}/") or legacy else None


def normalize_one(
    ctx: ImportContext,
    batch_id: uuid.UUID,
    tenant_id: str,
    bucket: str,
    obj: SourceObject,
    contract: DatasetContract | None = None,
) -> NormalizedEntry:
    """One file of the delivery (the step the driver maps over the manifest), read with
    `contract` (default: the context's for its dataset)."""
    workdir = ctx.workdir / str(batch_id)
    workdir.mkdir(parents=True, exist_ok=True)
    contract = contract or ctx.contracts[obj.dataset]
    entry = normalize_object(ctx, batch_id, tenant_id, bucket, obj, contract, workdir)
    if ctx.remote:  # a Dask worker: the loader reads the staged copy (`localised`)
        entry.file.parquet_path.unlink(missing_ok=True)
        entry.file.parquet_path.with_suffix(".csv").unlink(missing_ok=True)
    return entry


def localised(ctx: ImportContext, entry: NormalizedEntry) -> NormalizedEntry:
    """The entry with its Parquet on this machine: as it is when normalized here, else
    fetched from the staging area (normalized on another machine, a Dask worker)."""
    if entry.file.parquet_path.is_file():
        return entry
    local = ctx.staging.get_file(entry.staged, ctx.workdir / "staged" / entry.staged)
    return replace(entry, file=replace(entry.file, parquet_path=local))


def bucket_of(manifest: Manifest) -> str:
    return split_folder(manifest.folder)[0]


def normalize_object(
    ctx: ImportContext,
    batch_id: uuid.UUID,
    tenant_id: str,
    bucket: str,
    obj: SourceObject,
    contract: DatasetContract,
    workdir: Path,
) -> NormalizedEntry:
    """Normalize one source file, or reuse its cached output when key, etag and contract
    version are unchanged."""
    started = time.monotonic()
    source_key = f"s3://{bucket}/{obj.key}"
    digest = hashlib.sha256(
        f"{source_key}\0{obj.etag}\0{contract.contract_version}".encode()
    ).hexdigest()[:32]
    name = staged_name(tenant_id, contract.name, digest)
    local = workdir / f"{digest}.parquet"
    cached = ctx.repo.cached_file(source_key, obj.etag, contract.contract_version)
    cached_name = _cached_name(ctx, tenant_id, cached.output_uri) if cached else None
    if cached is not None and cached_name is not None:
        try:
            ctx.staging.get_file(cached_name, local)
            rejects = []
            if cached.reject_count:
                rejects = read_rejects(
                    ctx.staging.get_file(rejects_name_of(cached_name), local.with_suffix(".csv"))
                )
            file = NormalizedFile(
                source_key, contract.name, local, cached.row_count, cached.reject_count, rejects
            )
            file.aliases = dict(cached.details.get("aliases", {}))
            file.extra_columns = dict(cached.details.get("extra_columns", {}))
            return NormalizedEntry(obj, file, True, time.monotonic() - started, cached_name)
        except StagingError:
            ctx.repo.forget_cached_file(source_key, obj.etag, contract.contract_version)
    if obj.fmt == "parquet":
        source = download_object(ctx.s3, obj, bucket, workdir / f"{digest}.source")
        try:
            file = normalize_file(
                source, source_key=source_key, fmt=obj.fmt, contract=contract, out_path=local
            )
        finally:
            source.unlink(missing_ok=True)
    else:
        with open_object(ctx.s3, obj, bucket) as stream:
            file = normalize_file(
                stream,
                source_key=source_key,
                fmt=obj.fmt,
                contract=contract,
                out_path=local,
                max_line_bytes=ctx.csv_max_line_bytes,
            )
    output_uri = ctx.staging.put_file(local, name)
    if file.rejects:
        rejects_local = local.with_suffix(".csv")
        write_rejects(file.rejects, rejects_local)
        ctx.staging.put_file(rejects_local, rejects_name_of(name))
    ctx.repo.store_cached_file(
        CachedFile(
            source_key,
            obj.etag,
            contract.contract_version,
            contract.name,
            output_uri,
            file.row_count,
            file.reject_count,
            {
                **({"rejects_uri": ctx.staging.uri(rejects_name_of(name))} if file.rejects else {}),
                **({"aliases": file.aliases} if file.aliases else {}),
                **({"extra_columns": file.extra_columns} if file.extra_columns else {}),
            },
        ),
        batch_id,
    )
    return NormalizedEntry(obj, file, False, time.monotonic() - started, name)


def read_rejects(path: Path) -> list[Reject]:
    with path.open(newline="", encoding="utf-8") as handle:
        return [
            Reject(
                row["file"],
                int(row["line"]) if row["line"] else None,
                row["column"] or None,
                row["reason"],
                row["value"] or None,
                # Files staged before rejects named their last line have no such column.
                int(row["last_line"]) if row.get("last_line") else None,
            )
            for row in csv.DictReader(handle)
        ]
