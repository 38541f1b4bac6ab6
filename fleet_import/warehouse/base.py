"""What every warehouse backend offers: replace a (tenant, scope) slice in one transaction,
and say which batch owns a slice now. The pipeline sees only this module."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import pyarrow as pa

from fleet_import.contracts.model import DatasetContract
from fleet_import.errors import WarehouseError

STAMP_COLUMNS = ("tenant_id", "source_scope", "ingestion_batch_id")
"""Columns every curated table carries after the contract's, in this order."""
SOURCE_LINE_COLUMN = "_source_line"
"""Trailing column of normalized Parquet files: the row's line in its source file."""
SOURCE_LINE_COUNT_COLUMN = "_source_line_count"
"""The one after it: how many physical lines the row was read from. Neither is loaded."""

Progress = Callable[[str, int], None]
"""progress(dataset, rows loaded so far for that dataset)."""


@dataclass(frozen=True)
class WarehouseSession:
    """The warehouse session a slice is written in. The pipeline records it on the batch
    before the slice takes any lock, so whoever takes an abandoned batch over can end it:
    a frozen or partitioned holder must not keep its successor waiting on its locks. The
    start time makes it unique: a pid alone may be reused by a later session."""

    pid: int
    started: str  # ISO 8601, as the warehouse reports it

    def to_json(self) -> dict[str, object]:
        return {"pid": self.pid, "started": self.started}

    @classmethod
    def from_json(cls, raw: object) -> WarehouseSession | None:
        if not isinstance(raw, Mapping):
            return None
        pid, started = raw.get("pid"), raw.get("started")
        if not isinstance(pid, int) or not isinstance(started, str):
            return None
        return cls(pid, started)


SessionSink = Callable[[WarehouseSession], None]
"""on_session(session): called with each session a slice opens, before it locks anything;
raising from it ends the slice."""

Fence = Callable[[], None]
"""fence(): called before each warehouse step of a slice and just before its COMMIT (each
replay too); raising from it ends the slice, rolled back. The importer's fence is its lease
(store.heartbeat): a worker whose lease may have expired stops touching the warehouse."""


class CommitOutcomeUnknown(WarehouseError):
    """The slice's COMMIT was sent and no answer came (the connection was lost under it):
    whether it committed is for the slice stamp to say (importing.settle). Never replayed:
    the outcome is read back, not guessed."""


@dataclass(frozen=True)
class LoadFile:
    """A normalized Parquet file: the contract's columns in order, then `_source_line` (and,
    in files normalized since rows had line counts, `_source_line_count`)."""

    path: Path
    excluded_lines: frozenset[int] = frozenset()
    """`_source_line` values to drop (rows rejected as duplicate keys after normalizing)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))
        object.__setattr__(self, "excluded_lines", frozenset(self.excluded_lines))


@dataclass(frozen=True)
class DatasetLoad:
    """One dataset's new slice: all of its files, loaded together."""

    contract: DatasetContract
    files: tuple[LoadFile, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "files", tuple(self.files))


@dataclass(frozen=True)
class SliceCommit:
    """What a committed slice holds."""

    batch_id: uuid.UUID
    row_counts: dict[str, int]
    """dataset -> rows now in the slice"""


class SliceWriter(Protocol):
    """A slice replacement in progress. Files are loaded as they become ready; nothing is
    visible until `commit()`, which replaces the slice atomically; closing without it
    discards everything. A context manager. Where the rows wait meanwhile is the backend's:
    PostgreSQL streams them into its open slice transaction, Redshift into session temp
    tables, locking the curated tables only inside `commit()`."""

    row_counts: dict[str, int]

    def load_files(self, contract: DatasetContract, files: Iterable[LoadFile]) -> int:
        """Load the files into the slice; returns rows. `files` may be a generator that
        yields each file when it is ready; it is consumed before this returns."""
        ...

    def discard_keys(self, contract: DatasetContract, keys: pa.Table) -> int: ...

    def commit(self) -> SliceCommit: ...

    def close(self) -> None: ...

    def __enter__(self) -> SliceWriter: ...

    def __exit__(self, *exc_info: object) -> None: ...


@runtime_checkable
class Warehouse(Protocol):
    replays_slices: bool
    """Whether a slice writer replays its own transaction after a transient error (then the
    caller must not retry the slice on top of it)."""

    def ensure_tables(self, contracts: Iterable[DatasetContract]) -> None:
        """Create the curated tables and the slice registry if missing (idempotent)."""
        ...

    def check_tables(self, tenant_id: str, contracts: Iterable[DatasetContract]) -> None:
        """`ensure_tables` in the tenant's database, before a batch is reserved: a table
        that does not hold its contract's shape raises TableMigrationNeeded (warehouse.shape),
        naming the command that migrates it."""
        ...

    def commit_slice(
        self,
        *,
        tenant_id: str,
        source_scope: str,
        batch_id: uuid.UUID,
        datasets: Sequence[DatasetLoad],
        progress: Progress | None = None,
    ) -> SliceCommit:
        """Replace the scope's whole slice with these datasets, stamped with batch_id, in one
        transaction: readers see the old slice or the new one, never a mix."""
        ...

    def open_slice(
        self,
        *,
        tenant_id: str,
        source_scope: str,
        batch_id: uuid.UUID,
        contracts: Sequence[DatasetContract],
        progress: Progress | None = None,
        on_session: SessionSink | None = None,
        fence: Fence | None = None,
    ) -> SliceWriter:
        """Begin replacing the scope's slice with these datasets (see SliceWriter)."""
        ...

    def end_session(self, session: WarehouseSession) -> bool:
        """Terminate that session if it still exists (its transaction rolls back, its locks
        are released); True if one was ended."""
        ...

    def slice_owner(self, tenant_id: str, source_scope: str) -> uuid.UUID | None:
        """The batch whose stamp the slice registry holds for the scope, if any."""
        ...

    def registered_counts(self, tenant_id: str, source_scope: str) -> dict[str, int]:
        """Rows of each registered dataset as the registry recorded them (no table scan)."""
        ...

    def slice_counts(self, tenant_id: str, source_scope: str) -> dict[str, int]:
        """Rows actually in each registered dataset's curated table for the scope."""
        ...


def check_contract(contract: DatasetContract) -> None:
    clash = {*contract.column_names} & {
        *STAMP_COLUMNS,
        SOURCE_LINE_COLUMN,
        SOURCE_LINE_COUNT_COLUMN,
    }
    if clash:
        raise WarehouseError(
            f"dataset {contract.name!r} uses reserved column names {sorted(clash)}"
        )


def check_loads(datasets: Sequence[DatasetLoad]) -> None:
    if not datasets:
        raise WarehouseError("a slice needs at least one dataset")
    names = [d.contract.name for d in datasets]
    tables = [d.contract.target_table for d in datasets]
    if len(set(names)) != len(names) or len(set(tables)) != len(tables):
        raise WarehouseError(f"datasets and their tables must be distinct: {names} -> {tables}")
    for load in datasets:
        check_contract(load.contract)
