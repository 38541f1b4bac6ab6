"""Schema drift during an import (contracts.drift): the effective contracts a batch reads its
files with, and what a delivery's new columns do once every file is normalized.

The effective contract of a dataset under `evolve` or `review` is the declared one plus the
columns drift added to its curated table before (warehouse.evolution reads them back): both
the claim (already loaded?) and the batch use it, so a table that evolved is a new contract
version to the normalized-file cache and to the already-loaded check.

After normalization, the new columns of such a dataset's files (the union, typed from the
Parquet schema or `new_column_type`) are:
- under `evolve`: added to the curated table (each ADD COLUMN in a transaction of its own,
  before the slice opens, so never inside its locked commit), then the files are normalized
  again under the evolved contract, so their values load;
- under `review`: normalized under the would-be contract too (its outputs cached, so the
  approval reads no file again), then the batch is held (`DriftHeld`: the slice guards'
  held state, `batches approve`). `apply_held_drift` is the approval's half: it adds the
  held columns, then the approval loads the cached content as any approval does.
Under `ignore` the contract's columns load; `ignored_columns` names the others for the
batch's details and the `fleet.schema.drift` event, once per batch.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from fleet_import.contracts.drift import adds_columns, evolved, new_columns
from fleet_import.contracts.model import ContractSet, DatasetContract
from fleet_import.errors import FleetImportError, PreCommitError
from fleet_import.importing.context import ImportContext
from fleet_import.importing.guards import SliceHeld, content_of
from fleet_import.importing.leased_batch import LeasedBatch
from fleet_import.importing.normalized_files import NormalizedEntry, bucket_of, normalize_object
from fleet_import.publication.events import emit_quietly, event_payload
from fleet_import.s3.delivery import DeliveryIdentity
from fleet_import.s3.sources import Manifest
from fleet_import.store.batch_state import hold_of
from fleet_import.store.details import BatchDetails
from fleet_import.store.models import Batch
from fleet_import.warehouse.base import (
    SOURCE_LINE_COLUMN,
    SOURCE_LINE_COUNT_COLUMN,
    STAMP_COLUMNS,
)
from fleet_import.warehouse.evolution import EvolvingWarehouse

log = logging.getLogger(__name__)

DRIFT_EVENT = "fleet.schema.drift"
_RESERVED = frozenset({*STAMP_COLUMNS, SOURCE_LINE_COLUMN, SOURCE_LINE_COUNT_COLUMN})

Drift = dict[str, dict[str, str]]
"""dataset -> its new columns (name -> contract type)."""


class DriftHeld(SliceHeld):
    """The delivery's new columns wait for review (`on_new_columns: review`)."""

    def __init__(self, drift: Drift, content: Mapping[str, Any]) -> None:
        columns = "; ".join(
            f"{dataset}: {', '.join(f'{name} {kind}' for name, kind in found.items())}"
            for dataset, found in drift.items()
        )
        FleetImportError.__init__(self, f"new columns under on_new_columns review: {columns}")
        self.breaches = []
        self.content = dict(content)
        self.drift = drift

    def facts(self) -> dict[str, Any]:
        return {"drift": self.drift}  # HeldFacts.drift


class ApprovedDriftChanged(PreCommitError):
    """The table no longer takes the columns a held batch's approval would add."""


def effective_contracts(contracts: ContractSet, warehouse: object, tenant_id: str) -> ContractSet:
    """The contracts with the columns drift added to this tenant's tables (`contracts`
    itself when none of them adds columns, or the warehouse cannot evolve tables)."""
    if not any(adds_columns(c) for c in contracts.values()) or not isinstance(
        warehouse, EvolvingWarehouse
    ):
        return contracts
    return ContractSet(
        evolved(contract, warehouse.added_columns(tenant_id, contract))
        if adds_columns(contract)
        else contract
        for contract in contracts.values()
    )


def with_effective_contracts(ctx: ImportContext, tenant_id: str) -> ImportContext:
    """The context with the tenant's effective contracts (itself when they are declared)."""
    contracts = effective_contracts(ctx.contracts, ctx.warehouse, tenant_id)
    if contracts is ctx.contracts:
        return ctx
    return dataclasses.replace(ctx, contracts=contracts)


def _evolved_set(contracts: ContractSet, drift: Drift) -> ContractSet:
    return ContractSet(evolved(c, drift.get(c.name, {})) for c in contracts.values())


def settle_drift(
    batch: LeasedBatch,
    manifest: Manifest,
    entries: Iterable[NormalizedEntry],
    normalize: Callable[[LeasedBatch], Iterable[NormalizedEntry]],
) -> tuple[LeasedBatch, Iterable[NormalizedEntry]]:
    """The batch and entries to load: as they are when no dataset that adds columns is in
    the delivery (then the load streams as files arrive), or when none has new columns;
    else evolved (the batch now reads with the evolved contracts; `normalize` runs the
    normalize step again for it), or DriftHeld raised under `review`."""
    ctx = batch.ctx
    adding = [
        ctx.contracts[name] for name in manifest.by_dataset() if adds_columns(ctx.contracts[name])
    ]
    if not adding:
        return batch, entries
    entries = list(entries)
    drift = _drift_of(adding, entries)
    if not drift:
        return batch, entries
    grown = dataclasses.replace(
        batch, ctx=dataclasses.replace(ctx, contracts=_evolved_set(ctx.contracts, drift))
    )
    files = _files_of(entries, drift)
    if any(ctx.contracts[name].on_new_columns == "review" for name in drift):
        # Normalized under the contracts an approval will load with: cached, read by it.
        for _ in normalize(grown):
            pass
        raise DriftHeld(drift, content_of(grown.ctx, manifest))
    for dataset, columns in drift.items():
        log.warning("batch %s adds columns to %s: %s", batch.batch_id, dataset, columns)
        _evolving(ctx).add_columns(batch.tenant_id, ctx.contracts[dataset], columns)
    report = {
        dataset: {"policy": "evolve", "columns": columns, "files": files[dataset]}
        for dataset, columns in drift.items()
    }
    batch.update_details(
        BatchDetails.patch(
            drift=report,
            # The content this batch loads is read with the evolved contracts.
            contract_versions=DeliveryIdentity.of(manifest, grown.ctx.contracts).versions,
        )
    )
    tell_drift(batch, report)
    return grown, normalize(grown)


def _drift_of(adding: Sequence[DatasetContract], entries: Sequence[NormalizedEntry]) -> Drift:
    drift: Drift = {}
    for contract in adding:
        found = [
            (entry.file.source_key, entry.file.extra_columns)
            for entry in entries
            if entry.file.dataset == contract.name
        ]
        columns = new_columns(contract, found)
        reserved = sorted(_RESERVED & columns.keys())
        if reserved:
            raise PreCommitError(
                f"dataset {contract.name!r}: new columns {', '.join(reserved)} are reserved "
                "for the curated table's own use: rename them in the export"
            )
        if columns:
            drift[contract.name] = columns
    return drift


def _files_of(entries: Iterable[NormalizedEntry], drift: Mapping[str, Any]) -> dict[str, list[str]]:
    files: dict[str, list[str]] = {name: [] for name in drift}
    for entry in entries:
        if entry.file.dataset in files and entry.file.extra_columns:
            files[entry.file.dataset].append(entry.file.source_key)
    return files


def ignored_columns(
    contracts: ContractSet, entries: Iterable[NormalizedEntry]
) -> dict[str, dict[str, Any]]:
    """dataset -> {policy, columns, files} of the columns its files held beyond the contract
    and did not load (`ignore`), one entry per dataset."""
    report: dict[str, dict[str, Any]] = {}
    for entry in entries:
        extra = entry.file.extra_columns
        contract = contracts.get(entry.file.dataset)
        if not extra or contract is None or adds_columns(contract):
            continue
        found = report.setdefault(
            contract.name, {"policy": contract.on_new_columns, "columns": {}, "files": []}
        )
        for name, column_type in extra.items():
            found["columns"].setdefault(name, column_type)
        found["files"].append(entry.file.source_key)
    return report


def tell_drift(batch: LeasedBatch, report: Mapping[str, Any]) -> None:
    """One `fleet.schema.drift` event for the batch, naming every dataset's new columns."""
    if report:
        payload = event_payload(batch.tenant_id, batch.scope, batch.batch_id, datasets=dict(report))
        emit_quietly(batch.ctx.events, DRIFT_EVENT, payload)


def held_drift(held: Batch) -> Drift:
    """The new columns a held batch waits on (none for a batch a slice guard held)."""
    facts = hold_of(held)
    # In the order they are added (contracts.drift.new_columns): jsonb keeps none.
    return {
        dataset: dict(sorted(columns.items()))
        for dataset, columns in (facts.drift if facts is not None else {}).items()
    }


def apply_held_drift(ctx: ImportContext, tenant_id: str, drift: Drift) -> ImportContext:
    """An approval's first step: add the held batch's new columns to the tenant's tables, as
    `evolve` would; the context then reads with the evolved contracts."""
    effective = with_effective_contracts(ctx, tenant_id)
    for dataset, columns in drift.items():
        contract = effective.contracts.get(dataset)
        if contract is None:
            raise ApprovedDriftChanged(f"dataset {dataset!r} is no longer in the contracts")
        missing = {n: t for n, t in columns.items() if n not in contract.column_names}
        if missing:
            _evolving(ctx).add_columns(tenant_id, contract, missing)
    return with_effective_contracts(ctx, tenant_id)


def held_drift_misfit(
    ctx: ImportContext,
    held_id: uuid.UUID,
    tenant_id: str,
    listing: Manifest,
    contracts: ContractSet,
    drift: Drift,
) -> str | None:
    """Why the held batch's new columns must not be added, or None: the first staged row
    whose value of a new column its declared type does not take (`new_column_type: int64`
    over a text column). Checked before any ALTER TABLE, so a column every row would reject
    is never added (it would stay, and refuse every later delivery that holds it). Reads
    the held batch's normalized output under `contracts` (the would-be ones): staged and
    cached when it was held, normalized again only when the cache lost it."""
    workdir = ctx.workdir / f"approval-check-{held_id}"
    try:
        for dataset, columns in drift.items():
            contract = contracts.get(dataset)
            if contract is None:
                continue
            for obj in listing.by_dataset().get(dataset, []):
                entry = normalize_object(
                    ctx, held_id, tenant_id, bucket_of(listing), obj, contract, workdir
                )
                for reject in entry.file.rejects:
                    if reject.column in columns:
                        line = f" line {reject.line}" if reject.line is not None else ""
                        return (
                            f"new column {dataset}.{reject.column} is declared "
                            f"{columns[reject.column]} but {reject.file}{line} holds "
                            f"{reject.value!r} ({reject.reason}): adding it would reject "
                            "those rows, so nothing was altered; reject the batch, or declare "
                            "the column with its type in the contract and import the folder anew"
                        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return None


def _evolving(ctx: ImportContext) -> EvolvingWarehouse:
    if not isinstance(ctx.warehouse, EvolvingWarehouse):
        raise PreCommitError(
            f"the warehouse ({type(ctx.warehouse).__name__}) cannot add columns to its "
            "tables: on_new_columns evolve and review need one that can"
        )
    return ctx.warehouse


def would_evolve(ctx: ImportContext, tenant_id: str, drift: Drift) -> ContractSet:
    """The contracts an approval of this drift would load with, without touching a table."""
    return _evolved_set(effective_contracts(ctx.contracts, ctx.warehouse, tenant_id), drift)
