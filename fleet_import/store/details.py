"""`ingestion_batches.details`: every key a batch's record holds, declared once and typed.

The JSON on disk is what older versions wrote: every model keeps unknown keys (a newer
writer's additions survive an older reader's round trip) and every field has a default, so
any stored row reads. Writers build their patches with `BatchDetails.patch`, which refuses a
key the record does not declare; readers use the typed fields (`Batch.record`).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError

from fleet_import.errors import DetailsInvalid

# Stored in every batch's details: "normalised" keeps the spelling of the rows written since
# the first release, which the views and the takeover read.
Phase = Literal["reserved", "discovered", "normalised", "committed", "publishing", "published"]
DETAILS_VERSION = 1
# What a reserved batch has always stored; the other fields appear as steps write them.
_WRITTEN_FIRST = frozenset(
    {"version", "phase", "row_counts", "warehouse_committed", "publication", "publication_expired"}
)


class FailureKind(StrEnum):
    FAILED_PRE_COMMIT = "failed_pre_commit"
    FAILED_PUBLICATION = "failed_publication"
    ENQUEUE_FAILED = "enqueue_failed"
    ABANDONED = "abandoned"  # its executor died or froze before commit; taken over
    HELD = "held"  # a slice guard stopped it before commit: waits for review (importing.guards)


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")

    def to_json(self) -> dict[str, Any]:
        """As stored: the keys it was given, the unknown ones kept."""
        return self.model_dump(mode="json", exclude_unset=True)


class Rejects(_Open):
    """What the normalization rejected: the count, a sample and the staged rejects file."""

    count: int = 0
    uri: str | None = None
    by_reason: dict[str, int] = {}
    by_file: dict[str, int] = {}
    by_column: dict[str, int] = {}
    sample: list[dict[str, Any]] = []
    """The first rejects (`normalize.rows.Reject` as JSON): file, line, column, reason, value."""


class FileLoaded(_Open):
    key: str = ""
    dataset: str = ""
    rows: int = 0
    rejects: int = 0
    cache_hit: bool = False
    seconds: float = 0.0
    bytes: int | None = None
    """The staged normalized file's size."""
    aliases: dict[str, str] = {}
    """Columns found by an alias (a renamed export): column -> the header found."""
    extra_columns: dict[str, str] = {}
    """Columns the contract does not name: name -> type."""


class Summary(_Open):
    files: list[FileLoaded] = []
    cache_hits: int = 0
    rows_to_load: dict[str, int] = {}
    seconds: dict[str, Any] = {}
    """Where the time went: `load` (seconds), `copy` (seconds per dataset), ..."""
    gate_warned: str | None = None
    """The content gate's warnings in one line, for the run's final line."""
    recovered_from_stamp: bool = False


class HeldFacts(_Open):
    """Why a batch is held and which content it holds: the slice guards' breaches, or the
    new columns a `review` drift policy waits on."""

    breaches: list[dict[str, Any]] = []
    content: dict[str, Any] | None = None
    """The delivery's identity (`fingerprint`, `contract_versions`) an approval loads."""
    drift: dict[str, dict[str, Any]] = {}
    gate: list[dict[str, Any]] = []
    """The content gate's `error` results (`importing.gate_results.GateResult` as JSON)."""


class GateSummary(_Open):
    """What the content gate found, in figures (its results: `store.gates`)."""

    outcome: str | None = None
    errors: int = 0
    warnings: int = 0
    waived: str | None = None
    """Why its errors did not hold the batch (an approval or a rollback)."""
    skipped: str | None = None
    """Why it did not run (`--no-gate`)."""


class Failure(_Open):
    kind: FailureKind | str
    """One of ours, or a kind a newer version wrote: a view still reads the row."""
    error: str = ""
    at: str | None = None
    held: HeldFacts | None = None
    refused: str | None = None
    """The refusal's kind, for a batch its tenant's admission refused."""


class Review(_Open):
    """An operator's decision on a held batch."""

    decision: Literal["approved", "rejected"] | None = None
    batch_id: str | None = None
    """The batch that loaded the approved content."""
    note: str | None = None
    at: str | None = None


class CommitUnknown(_Open):
    """The slice COMMIT was sent and its answer lost: the stamp decides."""

    error: str = ""
    at: str | None = None
    owner: str | None = None


class BatchDetails(_Open):
    """`ingestion_batches.details`, version 1."""

    version: Literal[1] = DETAILS_VERSION
    phase: Phase | str = "reserved"
    """One of `Phase`; any other text a row holds is shown as it is, never refused."""
    manifest: dict[str, Any] | None = None
    contract_versions: dict[str, str] | None = None
    row_counts: dict[str, int] = {}
    rejects: Rejects | None = None
    summary: Summary | None = None
    warehouse_committed: bool = Field(
        default=False, validation_alias=AliasChoices("warehouse_committed", "redshift_committed")
    )
    """The slice is committed in the warehouse (Redshift or PostgreSQL). Stored batches
    written before the rename say `redshift_committed`; both read, the new one is written."""
    commit_attempted: bool = False
    """The slice COMMIT may have been sent: a failure now settles by the stamp."""
    commit_unknown: CommitUnknown | None = None
    warehouse_session: dict[str, Any] | None = None
    publication: dict[str, Any] = {}
    failure: Failure | None = None
    last_failure: Failure | None = None
    """The failure a resume took the batch out of: the first cause stays visible."""
    resumes: int = 0
    superseded_by: str | None = None
    publication_expired: bool = False
    flow_run_id: str | None = None
    task_run_id: str | None = None
    """The task run that loaded it, for a delivery of a bulk import (its own view)."""
    guard: dict[str, Any] | None = None
    """The run's slice-guard override (`importing.guards.GuardOverride`)."""
    delivery_manifest: dict[str, Any] | None = None
    """The delivery's own manifest file, as declared (`s3.delivery_manifest`)."""
    pinned_manifest: dict[str, Any] | None = None
    """The content an approval or rollback loads instead of listing the folder."""
    drift: dict[str, dict[str, Any]] = {}
    """New columns seen per dataset, and what their policy did with them."""
    review: Review | None = None
    approves: str | None = None
    """The held batch whose content this batch loads."""
    rolled_back_to: str | None = None
    """The earlier batch whose content this rollback loads again."""
    rollback_replaced: str | None = None
    """The batch whose slice the rollback replaced."""
    gate: GateSummary | None = None

    @classmethod
    def parse(cls, raw: object) -> BatchDetails:
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            raise DetailsInvalid(f"batch details do not parse: {exc}") from None

    @classmethod
    def patch(cls, **fields: Any) -> dict[str, Any]:
        """The JSON of only these declared fields, each checked against its type: what an
        `update_details` merges into the stored record. Only what is given is written (no
        defaults filled in), so the stored JSON is what the writer meant."""
        unknown = sorted(set(fields) - set(cls.model_fields))
        if unknown:
            raise TypeError(f"batch details declare no {', '.join(unknown)}")
        try:
            record = cls.model_validate(fields)
        except ValidationError as exc:
            raise DetailsInvalid(f"batch details patch does not parse: {exc}") from None
        return record.model_dump(mode="json", exclude_unset=True)

    def to_json(self) -> dict[str, Any]:
        """As a new batch is stored: the fields every batch has written from the start, and
        those given; no other defaults, so the JSON is what earlier versions wrote."""
        declared = type(self).model_fields
        return {
            key: value
            for key, value in self.model_dump(mode="json").items()
            if key not in declared
            or (value is not None and (key in _WRITTEN_FIRST or key in self.model_fields_set))
        }

    @property
    def held(self) -> HeldFacts | None:
        """What holds the batch, if a failure of kind `held` ended it."""
        if self.failure is None or self.failure.kind != FailureKind.HELD:
            return None
        return self.failure.held or HeldFacts()

    @property
    def summary_json(self) -> dict[str, Any]:
        return self.summary.to_json() if self.summary is not None else {}

    @property
    def rows(self) -> int:
        return sum(self.row_counts.values())

    @property
    def reject_count(self) -> int:
        return self.rejects.count if self.rejects is not None else 0


def warehouse_committed(details: Mapping[str, Any]) -> bool:
    """`warehouse_committed` of raw batch details, read under its old name too: the store's
    fakes read it without parsing a whole record."""
    value = details.get("warehouse_committed", details.get("redshift_committed"))
    return bool(value)
