"""Slice guards: a delivery that would shrink a slice past its contract's guard, or empty
it, does not commit; its batch is held for review (review, not overwrite).

Judged just before the commit, from the slice registry's counts (what the replaced slice's
commit recorded: no scan of a curated table on Redshift), against the rows the new slice is
about to hold. The first load of a scope has nothing to compare with and is not guarded.
A run may override the guards (`GuardOverride`). The override is recorded on the batch, so
a batch continued after its executor died keeps it; an approval's waiver names the content
it approves, and waives nothing for any other content.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fleet_import.contracts.model import DEFAULT_MIN_ROWS_RATIO
from fleet_import.errors import FleetImportError, InvalidInput, PreCommitError
from fleet_import.importing.context import Claimed, Failed, ImportContext
from fleet_import.importing.leased_batch import LeasedBatch
from fleet_import.s3.delivery import DeliveryIdentity
from fleet_import.s3.delivery_manifest import (
    MANIFEST_NAME,
    DeliveryManifestMismatch,
    read_delivery_manifest,
    read_listed_manifest,
)
from fleet_import.s3.sources import DiscoveryError, Manifest
from fleet_import.store.details import BatchDetails, Failure, FailureKind

log = logging.getLogger(__name__)

HELD_EVENT = "fleet.batch.held"
MANIFEST_RULE = "manifest record_count"


@dataclass(frozen=True)
class GuardOverride:
    """A run's say over the contracts' guards: none at all (`waived`), or another
    `min_rows_ratio` for every dataset. An approval waives them for one content only:
    `content` is the held batch's (manifest fingerprint, contract versions)."""

    waived: bool = False
    min_rows_ratio: float | None = None
    content: Mapping[str, Any] | None = None
    reason: str = ""
    no_gate: bool = False
    """`--no-gate`: the content gate (importing.gate) is not run for this batch."""
    gate_waived: bool = False
    """An approval's or a rollback's: the gate runs and records, its errors hold nothing."""

    def __post_init__(self) -> None:
        ratio = self.min_rows_ratio
        if ratio is not None and not 0 <= ratio <= 1:
            raise InvalidInput(f"min_rows_ratio must be within 0..1, not {ratio!r}")

    @classmethod
    def for_run(
        cls, no_guard: bool, min_rows_ratio: float | None, no_gate: bool = False
    ) -> GuardOverride | None:
        """A run's options (`--no-guard`, `--min-rows-ratio`, `--no-gate`) as an override;
        None: none."""
        if not no_guard and min_rows_ratio is None and not no_gate:
            return None
        reasons = ["no_guard"] if no_guard else []
        if min_rows_ratio is not None:
            reasons.append(f"min_rows_ratio {min_rows_ratio:g} for this run")
        if no_gate:
            reasons.append("no_gate")
        return cls(
            waived=no_guard,
            min_rows_ratio=min_rows_ratio,
            reason=", ".join(reasons),
            no_gate=no_gate,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "waived": self.waived,
            "min_rows_ratio": self.min_rows_ratio,
            "content": dict(self.content) if self.content is not None else None,
            "reason": self.reason,
            "no_gate": self.no_gate,
            "gate_waived": self.gate_waived,
        }

    @classmethod
    def from_json(cls, raw: object) -> GuardOverride | None:
        if not isinstance(raw, Mapping):
            return None
        content = raw.get("content")
        return cls(
            waived=bool(raw.get("waived")),
            min_rows_ratio=raw.get("min_rows_ratio"),
            content=content if isinstance(content, Mapping) else None,
            reason=str(raw.get("reason") or ""),
            no_gate=bool(raw.get("no_gate")),
            gate_waived=bool(raw.get("gate_waived")),
        )


@dataclass(frozen=True)
class Breach:
    """One dataset of a new slice that a guard stops."""

    dataset: str
    current_rows: int
    new_rows: int
    rule: str
    """`allow_empty false` or `min_rows_ratio R` (then at least ceil(R x current) rows)."""

    def describe(self) -> str:
        if self.rule == MANIFEST_RULE:
            return (
                f"{self.dataset}: the delivery manifest declares {self.current_rows:,} rows, "
                f"{self.new_rows:,} were loaded or rejected ({self.rule})"
            )
        return (
            f"{self.dataset} would go from {self.current_rows:,} rows to {self.new_rows:,} "
            f"({self.rule})"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "current_rows": self.current_rows,
            "new_rows": self.new_rows,
            "rule": self.rule,
        }


class SliceHeld(FleetImportError):
    """A slice guard stopped the load before its commit: the batch waits for review."""

    def __init__(self, breaches: list[Breach], content: Mapping[str, Any]) -> None:
        super().__init__("; ".join(breach.describe() for breach in breaches))
        self.breaches = breaches
        self.content = dict(content)

    def facts(self) -> dict[str, Any]:
        """What the held batch records beyond its breaches and content (a subclass's)."""
        return {}


class ApprovedContentChanged(PreCommitError):
    """The folder no longer holds the content the approval was given for."""


def approve_command(batch_id: object) -> str:
    """What an operator runs to load a held batch anyway (said wherever a hold is told)."""
    return f"fleet-import batches approve {batch_id}"


_APPROVE_HINT = "; to load it anyway: "


def held_error(failure: Failure, reviewed: bool) -> str:
    """A failure's text as it stands now: a held batch once reviewed (approved or
    rejected) no longer says the command that would approve it."""
    error = failure.error
    if failure.kind == FailureKind.HELD and reviewed:
        return error.split(_APPROVE_HINT, 1)[0]
    return error


def content_of(ctx: ImportContext, manifest: Manifest) -> dict[str, Any]:
    """The delivery's identity (`DeliveryIdentity`: what the import, the takeover and the
    sweep call the same content), as an approval records the content it approves."""
    identity = DeliveryIdentity.of(manifest, ctx.contracts)
    return {"fingerprint": identity.fingerprint, "contract_versions": identity.versions}


def _manifest_name(ctx: ImportContext) -> str:
    return ctx.settings.delivery_manifest_name if ctx.settings is not None else MANIFEST_NAME


def check_delivery_manifest(ctx: ImportContext, listing: Manifest) -> dict[str, Any] | None:
    """Verify the folder against its own manifest, if it holds one: raises naming the
    missing, short or unlisted files; else what it declares, for the batch's details."""
    name = _manifest_name(ctx)
    declared = read_delivery_manifest(ctx.s3, listing, name)
    if declared is None:
        return None
    problems = declared.mismatches(listing)
    if problems:
        raise DeliveryManifestMismatch(
            f"{listing.folder} does not match its manifest {name}: {'; '.join(problems)}"
        )
    return {"name": name, "declared_rows": declared.declared_rows()}


def explain_refusal(ctx: ImportContext, refused: DiscoveryError) -> None:
    """A folder discovery refused, held against its own manifest if it holds one: raises
    naming the manifest and the files it lists that are missing or short, the cause a
    `no file for required dataset` hides (the file that never arrived was that dataset's
    only one). Returns when there is no manifest, or it has nothing to add."""
    name = _manifest_name(ctx)
    if refused.folder is None or not refused.sizes:
        return
    declared = read_listed_manifest(ctx.s3, refused.folder, refused.sizes, name)
    problems = declared.missing_or_short(refused.folder, refused.sizes) if declared else []
    if problems:
        raise DeliveryManifestMismatch(
            f"{refused.folder} does not match its manifest {name}: {'; '.join(problems)}"
            f" (so: {'; '.join(refused.problems)})"
        ) from refused


def record_override(ctx: ImportContext, claimed: Claimed, override: GuardOverride | None) -> None:
    """Keep the run's override on its batch, where the guard check reads it."""
    if override is not None:
        ctx.repo.update_details(
            claimed.batch_id, claimed.owner, BatchDetails.patch(guard=override.to_json())
        )


def check_slice_guards(
    leased: LeasedBatch, manifest: Manifest, summary: Mapping[str, Any]
) -> None:
    """Raise SliceHeld if the new slice (`summary["rows_to_load"]` per dataset) breaches a
    guard against the slice it replaces, or a file's rows differ from what the delivery's
    manifest declares; ApprovedContentChanged if an approval's content is not this."""
    ctx, batch_id = leased.ctx, leased.batch_id
    new_rows: Mapping[str, int] = summary["rows_to_load"]
    record = leased.read().record
    override = GuardOverride.from_json(record.guard)
    content = content_of(ctx, manifest)
    approved = override.content if override is not None else None
    if approved is not None and dict(approved) != content:
        raise ApprovedContentChanged(
            f"{override.reason or 'the approval'} was given for other content: the folder "
            f"changed since (fingerprint {content['fingerprint']}, approved "
            f"{approved.get('fingerprint')}); nothing was loaded"
        )
    if override is not None and override.waived:
        log.info("slice guards of batch %s waived: %s", batch_id, override.reason or "by the run")
        return
    current = ctx.warehouse.registered_counts(leased.tenant_id, leased.scope)
    ratio = override.min_rows_ratio if override is not None else None
    breaches = [
        breach
        for dataset, current_rows in sorted(current.items())
        if (breach := _breach(ctx, dataset, current_rows, new_rows.get(dataset, 0), ratio))
    ]
    declared = record.delivery_manifest or {}
    breaches += _count_breaches(manifest, declared.get("declared_rows") or {}, summary)
    if breaches:
        raise SliceHeld(breaches, content)


def _count_breaches(
    manifest: Manifest, declared: Mapping[str, int], summary: Mapping[str, Any]
) -> list[Breach]:
    """Files whose loaded plus rejected rows differ from their manifest's record_count."""
    bucket = manifest.folder.removeprefix("s3://").split("/", 1)[0]
    breaches = []
    for file in summary.get("files", []):
        url = f"s3://{bucket}/{file['key']}"
        if url in declared and file["rows"] + file["rejects"] != declared[url]:
            counted = file["rows"] + file["rejects"]
            breaches.append(Breach(url, declared[url], counted, MANIFEST_RULE))
    return breaches


def _breach(
    ctx: ImportContext, dataset: str, current_rows: int, new_rows: int, ratio: float | None
) -> Breach | None:
    contract = ctx.contracts.get(dataset)
    allow_empty = contract.allow_empty if contract is not None else False
    if ratio is None:
        ratio = contract.min_rows_ratio if contract is not None else DEFAULT_MIN_ROWS_RATIO
    if current_rows == 0:
        return None  # nothing to lose
    if new_rows == 0 and not allow_empty:
        return Breach(dataset, current_rows, new_rows, "allow_empty false")
    if new_rows < ratio * current_rows and not (new_rows == 0 and allow_empty):
        return Breach(dataset, current_rows, new_rows, f"min_rows_ratio {ratio:g}")
    return None


def hold_batch(batch: LeasedBatch, held: SliceHeld) -> Failed:
    """End the batch held for review (not a data error, so no `fleet.batch.failed`: a
    `fleet.batch.held`, emitted as every batch event is, after the store says so): its
    normalized files stay staged for an approval to load; the scope is free again."""
    approve = approve_command(batch.batch_id)
    error = f"held for review: {held}{_APPROVE_HINT}{approve}"
    log.warning("batch %s %s", batch.batch_id, error)
    facts = {
        "held": {
            "breaches": [b.to_json() for b in held.breaches],
            "content": held.content,
            **held.facts(),
        }
    }
    told = {"breaches": facts["held"]["breaches"], **held.facts(), "approve": approve}
    return batch.fail(FailureKind.HELD, error, facts, event=HELD_EVENT, told=told)
