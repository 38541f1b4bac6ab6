"""The content gate (issue 49): before the slice commit, each dataset's normalized rows (the
local Parquet the load just copied, its duplicate keys left out: no second read of S3) are
profiled and judged by the contract's checks and by drift rules against the profile of the
slice they replace (the batch that owns it now; none for a folder's first load).

An `error` holds the batch for review exactly as a slice guard does (`GateHeld`, a
`SliceHeld`); a `warn` publishes, and is told: the run's final line, the batch's details and
a `fleet.slice.warned` event once the commit is recorded. Results and profiles are stored
per dataset (store.gates); up to 100 failing rows per check are written beside the batch's
rejects. Each dataset is read file by file (importing.gate_dataset), its profile built as
the files arrived during the load (`ProfilePrefetch`). `--no-gate` skips the gate for one
run (recorded in the batch's override); an approval or a rollback runs it and records what
it found, its errors waived.

Drift rules are tuned per dataset in the contract (`profile_drift`) and per tenant in the
registry (`overrides.gate.<dataset>`, the same mapping).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pydantic import ValidationError

from fleet_import.contracts.checks import GateDeclarationError, ProfileDrift
from fleet_import.contracts.describe import describe
from fleet_import.contracts.model import DatasetContract
from fleet_import.errors import ConfigurationError
from fleet_import.importing.gate_dataset import DatasetFiles, ProfilePrefetch, judge_dataset
from fleet_import.importing.gate_results import GateHeld, GateResult
from fleet_import.importing.guards import GuardOverride, content_of
from fleet_import.importing.leased_batch import LeasedBatch
from fleet_import.importing.normalized_files import NormalizedEntry
from fleet_import.importing.profile import drift_results
from fleet_import.publication.events import emit_quietly, event_payload
from fleet_import.s3.sources import Manifest
from fleet_import.store.details import BatchDetails
from fleet_import.store.gates import DatasetGate
from fleet_import.tenants.registry import registry_in_force

log = logging.getLogger(__name__)

WARNED_EVENT = "fleet.slice.warned"
TENANT_OVERRIDE_KEY = "gate"
"""The registry's `overrides.gate`: dataset -> drift rules tuned for that tenant."""


@dataclass(frozen=True)
class GateVerdict:
    """What the gate found for a batch: its results (all datasets) and what skipped it."""

    results: list[GateResult] = field(default_factory=list)
    skipped: str = ""
    waived: str = ""
    """An approval's or a rollback's reason: an operator's decision, whose findings are
    recorded (`gate show`) but neither hold nor are told as warnings."""

    @property
    def warnings(self) -> list[GateResult]:
        return [r for r in self.results if r.outcome == "warn"]

    @property
    def told(self) -> list[GateResult]:
        """The warnings the final line and `fleet.slice.warned` tell."""
        return [] if self.waived else self.warnings

    @property
    def errors(self) -> list[GateResult]:
        return [r for r in self.results if r.outcome == "error"]


def judge_content(
    batch: LeasedBatch,
    manifest: Manifest,
    entries: Sequence[NormalizedEntry],
    duplicates: Mapping[str, pa.Table],
    prefetch: ProfilePrefetch | None = None,
) -> GateVerdict:
    """Profile and judge the slice about to commit; raises GateHeld on an `error` (unless an
    approval or a rollback waived it). Part of the load step, inside its open slice
    transaction: nothing is visible yet."""
    ctx = batch.ctx
    override = GuardOverride.from_json(batch.read().record.guard)
    if override is not None and override.no_gate:
        log.info("content gate of batch %s skipped: %s", batch.batch_id, override.reason)
        batch.update_details(BatchDetails.patch(gate={"skipped": override.reason or "no_gate"}))
        return GateVerdict(skipped=override.reason or "no_gate")
    datasets = _datasets(batch, entries, duplicates)
    baseline_id, baselines = _baselines(batch)
    tuning = _tenant_tuning(ctx, batch.tenant_id)
    known = _referenced(datasets)
    gates, results = [], []
    for dataset, files in sorted(datasets.items()):
        contract = files.contract
        rules = _rules(contract, tuning.get(dataset), batch.tenant_id)
        prefetched = prefetch.profile_of(files) if prefetch is not None else None
        profile, found = _judged(batch, files, known, prefetched)
        found += drift_results(contract, rules, profile, baselines.get(dataset))
        outcome = _worst(found)
        gates.append(DatasetGate(dataset, outcome, profile, [r.to_json() for r in found]))
        results += found
    waived = override is not None and override.gate_waived
    reason = override.reason if override is not None and waived else ""
    verdict = GateVerdict(results, waived=reason or ("waived" if waived else ""))
    if waived and verdict.errors:
        gates = [_waived(gate) for gate in gates]
    if ctx.gates is not None:
        ctx.gates.record_gate(batch.batch_id, gates, baseline_id)
    summary = {
        "outcome": _worst(results),
        "errors": len(verdict.errors),
        "warnings": len(verdict.warnings),
        **({"waived": verdict.waived} if verdict.waived else {}),
    }
    batch.update_details(BatchDetails.patch(gate=summary))
    if verdict.errors and not waived:
        raise GateHeld(verdict.errors, content_of(ctx, manifest))
    return verdict


def gate_runs(batch: LeasedBatch) -> bool:
    """Whether the gate judges this batch (not `--no-gate`): the load then profiles its
    files as they arrive."""
    override = GuardOverride.from_json(batch.read().record.guard)
    return override is None or not override.no_gate


def tell_warnings(batch: LeasedBatch, verdict: GateVerdict) -> None:
    """Once the commit is recorded: a slice published with warnings, as an event."""
    if verdict.told:
        payload = event_payload(
            batch.tenant_id,
            batch.scope,
            batch.batch_id,
            warnings=[r.to_json() for r in verdict.told],
        )
        emit_quietly(batch.ctx.events, WARNED_EVENT, payload)


def _worst(results: Sequence[GateResult]) -> str:
    outcomes = {r.outcome for r in results}
    return next((o for o in ("error", "warn") if o in outcomes), "pass")


def _waived(gate: DatasetGate) -> DatasetGate:
    if gate.outcome != "error":
        return gate
    return DatasetGate(gate.dataset, "waived", gate.profile, gate.results)


def _baselines(batch: LeasedBatch) -> tuple[uuid.UUID | None, dict[str, Mapping[str, Any]]]:
    """The replaced slice's owner and its profiles by dataset, read from the operational
    store (no warehouse call before the commit); never this delivery's own
    (elementary#1560: a baseline that holds the value it judges)."""
    gates = batch.ctx.gates
    if gates is None:
        return None, {}
    owner, found = gates.baseline_of(batch.batch_id, batch.tenant_id, batch.scope)
    return owner, {gate.dataset: gate.profile for gate in found}


def _tenant_tuning(ctx: Any, tenant_id: str) -> Mapping[str, Any]:
    settings = ctx.settings
    registry = registry_in_force(settings.tenants) if settings is not None else None
    registered = registry.tenants.get(tenant_id) if registry is not None else None
    tuning = registered.overrides.get(TENANT_OVERRIDE_KEY) if registered is not None else None
    return tuning if isinstance(tuning, Mapping) else {}


def _rules(contract: DatasetContract, tuning: object, tenant_id: str) -> ProfileDrift:
    where = f"FLEET_TENANTS: tenants.{tenant_id}.overrides.{TENANT_OVERRIDE_KEY}.{contract.name}"
    fix = "fix the registry's drift rules for this dataset (docs/contracts.md, drift rules)"
    try:
        return contract.profile_drift.tuned(tuning)
    except ValidationError as exc:
        raise ConfigurationError(f"{describe(exc, ProfileDrift, where)}; {fix}") from None
    except GateDeclarationError as exc:
        raise ConfigurationError(f"{where}: {exc}; {fix}") from None


def _judged(
    batch: LeasedBatch,
    files: DatasetFiles,
    known: Mapping[str, pa.Array | None],
    prefetched: dict[str, Any] | None,
) -> tuple[dict[str, Any], list[GateResult]]:
    try:
        return judge_dataset(batch, files, known, prefetched)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise ConfigurationError(
            f"dataset {files.contract.name!r}: a check cannot be evaluated on its column "
            f"types ({exc}); fix the check in its contract (docs/contracts.md, content gate)"
        ) from None


def _referenced(datasets: Mapping[str, DatasetFiles]) -> dict[str, pa.Array | None]:
    """Each `relationships` target's distinct values (None: not in this delivery)."""
    known: dict[str, pa.Array | None] = {}
    for files in datasets.values():
        for check in files.contract.checks:
            if check.type != "relationships" or check.to is None or check.to in known:
                continue
            parent, _, column = check.to.partition(".")
            referenced = datasets.get(parent)
            has = referenced is not None and column in referenced.contract.column_names
            known[check.to] = referenced.distinct(column) if has and referenced else None
    return known

def _datasets(
    batch: LeasedBatch, entries: Sequence[NormalizedEntry], duplicates: Mapping[str, pa.Table]
) -> dict[str, DatasetFiles]:
    """The delivery's files by dataset, with the duplicate keys the load discards."""
    by_dataset: dict[str, list[NormalizedEntry]] = {}
    for entry in entries:
        by_dataset.setdefault(entry.file.dataset, []).append(entry)
    return {
        dataset: DatasetFiles(batch.ctx.contracts[dataset], files, duplicates.get(dataset))
        for dataset, files in by_dataset.items()
    }
