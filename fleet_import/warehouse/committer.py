"""What the warehouse backends share beyond the protocol: checking a slice's datasets,
creating their tables once per instance, `commit_slice` as open, load every file, commit,
reading the slice registry, and the counters a backend's writers add to. Each backend adds
its SQL dialect, its driver and its writer; a writer is given what it uses (a connect
callable, counters, ...) and never sees its warehouse."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Self, TypeVar

from fleet_import.contracts.model import DatasetContract
from fleet_import.errors import WarehouseError
from fleet_import.warehouse.base import (
    DatasetLoad,
    Fence,
    Progress,
    SessionSink,
    SliceCommit,
    SliceWriter,
    check_loads,
)
from fleet_import.warehouse.shape import TableMigrationNeeded
from fleet_import.warehouse.sql import (
    Dialect,
    Statement,
    count_slice_sql,
    delete_slice_sql,
    register_slices_sql,
    registered_counts_sql,
    registered_slices_sql,
    registry_rows_sql,
)

Cursor = Any
"""A DB-API cursor of either driver (psycopg's, redshift_connector's)."""
T = TypeVar("T")


def run(cursor: Cursor, statement: str | Statement) -> Cursor:
    """Execute a statement (text alone, or text and its parameters); returns the cursor."""
    text, params = (statement, None) if isinstance(statement, str) else statement
    cursor.execute(text, params or None)
    return cursor


def read_registry(
    cursor: Cursor, exists_sql: Statement, tenant_id: str, source_scope: str
) -> list[tuple[Any, ...]]:
    """(dataset, target_table, batch_id) of the scope's registered datasets; none before
    the registry exists (`exists_sql` is the dialect's test for it)."""
    exists = run(cursor, exists_sql).fetchone()
    if not (exists and exists[0]):
        return []
    rows = run(cursor, registered_slices_sql(tenant_id, source_scope)).fetchall()
    return [tuple(row) for row in rows]


@dataclass(frozen=True)
class RegisteredSlice:
    """One slice as the registry holds it: its batch, rows per dataset and commit time."""

    tenant_id: str
    source_scope: str
    batch_id: uuid.UUID
    row_counts: dict[str, int]
    committed_at: dt.datetime


def registered_slices(rows: Iterable[Sequence[Any]]) -> list[RegisteredSlice]:
    """Registry rows (tenant, scope, dataset, batch, rows, committed at), a slice's datasets
    together, as one RegisteredSlice per (tenant, scope). A slice's datasets are registered
    in one transaction: one batch, one commit time (the latest, should they differ)."""
    slices: dict[tuple[str, str], RegisteredSlice] = {}
    for tenant_id, scope, dataset, batch_id, count, committed_at in rows:
        key = (str(tenant_id), str(scope))
        seen = slices.get(key)
        if seen is None:
            seen = slices[key] = RegisteredSlice(
                key[0], key[1], uuid.UUID(str(batch_id)), {}, committed_at
            )
        elif committed_at > seen.committed_at:
            seen = slices[key] = replace(seen, committed_at=committed_at)
        seen.row_counts[str(dataset)] = int(count)
    return list(slices.values())


@dataclass
class WriterCounters:
    """What a warehouse's writers did, kept by the warehouse that reports it: tests and
    benchmarks read it to prove a resumed batch loaded nothing, or how often Redshift
    replayed a transaction. Shared by every writer of one warehouse (`+=` from threads is
    good enough for counters read after the work)."""

    copies: int = 0
    """COPY statements run (a resumed batch must run none)."""
    replays: int = 0
    """Slice transactions run again after a transient failure."""


@dataclass(frozen=True)
class SliceRequest:
    """A slice replacement as `open_slice` was asked for it."""

    tenant_id: str
    source_scope: str
    batch_id: uuid.UUID
    contracts: Mapping[str, DatasetContract]
    """The slice's datasets by name, in the order given."""
    progress: Progress | None = None
    on_session: SessionSink | None = None
    fence: Fence | None = None

    def check_fence(self) -> None:
        """Before each warehouse step and the COMMIT: raises to end the slice (base.Fence)."""
        if self.fence is not None:
            self.fence()

    @property
    def scope(self) -> tuple[str, str]:
        return self.tenant_id, self.source_scope


class OpenSlice:
    """What every backend's writer shares: its request, the rows it loaded per dataset, and
    closing (rolling back unless committed) when used as a context manager."""

    def __init__(self, request: SliceRequest) -> None:
        self._request = request
        self.row_counts: dict[str, int] = dict.fromkeys(request.contracts, 0)
        self._registered: dict[str, str] = {}
        """dataset -> target table of the slice as registered before this batch."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        raise NotImplementedError

    def _check_declared(self, contract: DatasetContract) -> None:
        if contract.name not in self._request.contracts:
            raise WarehouseError(f"dataset {contract.name!r} was not declared for this slice")

    def _clear_previous(self, cursor: Cursor, registered: Iterable[Sequence[Any]]) -> None:
        """Delete the scope's slice, registered as (dataset, target_table, batch_id) rows,
        from every table that holds it now or will hold it: the slice is replaced as a
        whole, so no later delete can touch rows this batch wrote (a dataset may have moved
        to another table, or left the slice)."""
        rows = list(registered)
        self._registered = {dataset: table for dataset, table, _ in rows}
        owners = sorted({owner for _, _, owner in rows})
        if not owners:
            return
        targets = (c.target_table for c in self._request.contracts.values())
        for table in sorted({*self._registered.values(), *targets}):
            run(cursor, delete_slice_sql(table, *self._request.scope, owners))

    def _register_sql(self, dialect: Dialect, batch_id: object) -> list[Statement]:
        """The statements that make this batch the slice's owner, as `commit()` runs them."""
        request = self._request
        datasets = {
            name: (self.row_counts[name], contract.target_table)
            for name, contract in request.contracts.items()
        }
        return register_slices_sql(dialect, *request.scope, batch_id, datasets, self._registered)


class CommitsThroughOpenSlice:
    """`commit_slice` as one `open_slice` that loads every dataset and commits: what every
    backend means by it (and the tests' in-memory warehouse), written once."""

    def commit_slice(
        self,
        *,
        tenant_id: str,
        source_scope: str,
        batch_id: uuid.UUID,
        datasets: Sequence[DatasetLoad],
        progress: Progress | None = None,
    ) -> SliceCommit:
        with self.open_slice(
            tenant_id=tenant_id,
            source_scope=source_scope,
            batch_id=batch_id,
            contracts=[d.contract for d in datasets],
            progress=progress,
        ) as writer:
            for load in datasets:
                writer.load_files(load.contract, load.files)
            return writer.commit()


class SliceCommitter(CommitsThroughOpenSlice):
    """The shared half of a backend. The backend provides `ensure_tables` (recording what
    it created in `_ensured`), `_begin` (its writer, given what it needs), a transaction,
    and the statement that tells whether the registry exists yet; it reports its writers'
    `counters`."""

    _ensured: set[tuple[str, str]]
    counters: WriterCounters
    replays_slices: ClassVar[bool] = False
    """Whether the backend's writer replays its own transaction after a transient error.
    Then it is the slice's one retry layer, and the caller does not retry the slice again."""

    def ensure_tables(self, contracts: Iterable[DatasetContract]) -> None:
        raise NotImplementedError

    def check_tables(self, tenant_id: str, contracts: Iterable[DatasetContract]) -> None:
        """Once per instance and contract version, as `open_slice` ensures them."""
        missing = [
            c for c in contracts if (c.target_table, c.contract_version) not in self._ensured
        ]
        if not missing:
            return
        try:
            self.ensure_tables(missing)
        except TableMigrationNeeded as exc:
            raise exc.for_tenant(tenant_id) from None

    def _in_transaction(self, work: Callable[[Cursor], T]) -> T:
        """Run `work` on a cursor of a new transaction, and commit."""
        raise NotImplementedError

    def _registry_exists_sql(self) -> Statement:
        raise NotImplementedError

    def _begin(self, request: SliceRequest) -> SliceWriter:
        """The backend's writer for this slice, constructed with its dependencies."""
        raise NotImplementedError

    @property
    def copies(self) -> int:
        """COPY statements run by this instance's writers (a resumed batch must run none)."""
        return self.counters.copies

    @property
    def replays(self) -> int:
        """Slice transactions this instance's writers ran again after a transient failure."""
        return self.counters.replays

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
        """Start replacing the scope's slice: files are loaded one by one (as they are
        normalized), and only `commit()` makes the new slice visible (see SliceWriter)."""
        check_loads([DatasetLoad(c, ()) for c in contracts])
        missing = [
            c for c in contracts if (c.target_table, c.contract_version) not in self._ensured
        ]
        if missing:
            self.ensure_tables(missing)
        by_name = {c.name: c for c in contracts}
        request = SliceRequest(
            tenant_id, source_scope, batch_id, by_name, progress, on_session, fence
        )
        return self._begin(request)

    def _registry(self, cursor: Cursor, tenant_id: str, source_scope: str) -> list[tuple[Any, ...]]:
        return read_registry(cursor, self._registry_exists_sql(), tenant_id, source_scope)

    def slice_owner(self, tenant_id: str, source_scope: str) -> uuid.UUID | None:
        rows = self._in_transaction(lambda cursor: self._registry(cursor, tenant_id, source_scope))
        owners = sorted({str(owner) for _, _, owner in rows})
        if len(owners) > 1:
            raise WarehouseError(
                f"slice {tenant_id}/{source_scope} is stamped by several batches: {owners}"
            )
        return uuid.UUID(owners[0]) if owners else None

    def registered_counts(self, tenant_id: str, source_scope: str) -> dict[str, int]:
        """Rows per dataset as the slice registry recorded them at the slice's commit."""

        def work(cursor: Cursor) -> dict[str, int]:
            exists = run(cursor, self._registry_exists_sql()).fetchone()
            if not (exists and exists[0]):
                return {}
            rows = run(cursor, registered_counts_sql(tenant_id, source_scope)).fetchall()
            return {str(dataset): int(count) for dataset, count in rows}

        return self._in_transaction(work)

    def slice_registry(self, tenant_id: str | None = None) -> list[RegisteredSlice]:
        """Every slice the registry holds in this database (or one tenant's): none before
        the registry exists."""

        def work(cursor: Cursor) -> list[RegisteredSlice]:
            exists = run(cursor, self._registry_exists_sql()).fetchone()
            if not (exists and exists[0]):
                return []
            return registered_slices(run(cursor, registry_rows_sql(tenant_id)).fetchall())

        return self._in_transaction(work)

    def slice_counts(self, tenant_id: str, source_scope: str) -> dict[str, int]:
        def work(cursor: Cursor) -> dict[str, int]:
            return {
                dataset: run(
                    cursor, count_slice_sql(table, tenant_id, source_scope, owner)
                ).fetchone()[0]
                for dataset, table, owner in self._registry(cursor, tenant_id, source_scope)
            }

        return self._in_transaction(work)
