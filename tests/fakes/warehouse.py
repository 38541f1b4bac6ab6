"""The Warehouse protocol in memory (fleet_import/warehouse/base.py): curated tables as
Arrow tables per (tenant, scope, dataset), and the slice registry beside them.

A slice writer gathers its files in its own "transaction"; `commit()` swaps in the rows and
the registry rows together, under one lock, so a reader sees the old slice or the new one,
never a mix. `faults` injects what a real backend does under stress: a failure at a named
point (`open`, `load`, `commit`, `slice_owner`), or a COMMIT that goes through while its
acknowledgement is lost (`commit_ack`). tests/contract holds it to the same assertions as
the PostgreSQL warehouse.
"""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import count

import pyarrow as pa
import pyarrow.parquet as pq

from fleet_import.contracts.model import DatasetContract
from fleet_import.errors import ErrorKind, WarehouseError
from fleet_import.warehouse.base import (
    SOURCE_LINE_COLUMN,
    DatasetLoad,
    Fence,
    LoadFile,
    Progress,
    SessionSink,
    SliceCommit,
    WarehouseSession,
    check_contract,
    check_loads,
)
from fleet_import.warehouse.committer import CommitsThroughOpenSlice
from fleet_import.warehouse.shape import TableMigrationNeeded

Scope = tuple[str, str]  # (tenant_id, source_scope)


@dataclass(frozen=True)
class RegistryRow:
    """A row of `ingestion_slices`."""

    dataset: str
    target_table: str
    batch_id: uuid.UUID
    row_count: int
    committed_at: dt.datetime


def _spelled(contract: DatasetContract) -> list[tuple[str, str]]:
    return [(field.name, str(field.type)) for field in contract.arrow_schema]


class MemoryWarehouse(CommitsThroughOpenSlice):
    replays_slices = False

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.tables: dict[str, DatasetContract] = {}
        self.registry: dict[Scope, dict[str, RegistryRow]] = {}
        self.rows: dict[Scope, dict[str, pa.Table]] = {}
        """(tenant, scope) -> dataset -> the committed slice's rows (contract columns)."""
        self.faults: dict[str, BaseException] = {}
        self.open_sessions: set[WarehouseSession] = set()
        self.ended_sessions: list[WarehouseSession] = []
        self.copies = 0
        """Files loaded (a resumed batch must load none)."""
        self._pids = count(1000)

    def fault(self, point: str) -> None:
        failure = self.faults.pop(point, None)
        if failure is not None:
            raise failure

    # -- the protocol ------------------------------------------------------------------------

    def ensure_tables(self, contracts: Iterable[DatasetContract]) -> None:
        for contract in contracts:
            check_contract(contract)
            known = self.tables.get(contract.target_table)
            if known is not None and known.arrow_schema != contract.arrow_schema:
                raise TableMigrationNeeded(
                    f"table {contract.target_table} does not match dataset {contract.name!r}: "
                    f"has {_spelled(known)}, expected {_spelled(contract)}"
                )
            self.tables[contract.target_table] = contract

    def check_tables(self, tenant_id: str, contracts: Iterable[DatasetContract]) -> None:
        """As the real warehouses: a table in another shape names the tenant's migration."""
        try:
            self.ensure_tables(contracts)
        except TableMigrationNeeded as exc:
            raise exc.for_tenant(tenant_id) from None

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
    ) -> MemorySliceWriter:
        check_loads([DatasetLoad(c, ()) for c in contracts])
        self.ensure_tables(contracts)
        self.fault("open")
        session = WarehouseSession(next(self._pids), dt.datetime.now(dt.UTC).isoformat())
        with self._lock:
            self.open_sessions.add(session)
        writer = MemorySliceWriter(self, (tenant_id, source_scope), batch_id, contracts, session)
        writer.progress = progress
        writer.fence = fence
        if on_session is not None:
            try:
                on_session(session)
            except BaseException:
                writer.close()
                raise
        return writer

    def end_session(self, session: WarehouseSession) -> bool:
        with self._lock:
            if session not in self.open_sessions:
                return False
            self.open_sessions.discard(session)
            self.ended_sessions.append(session)
            return True

    def slice_owner(self, tenant_id: str, source_scope: str) -> uuid.UUID | None:
        self.fault("slice_owner")
        with self._lock:
            owners = sorted(
                {str(r.batch_id) for r in self.registry.get((tenant_id, source_scope), {}).values()}
            )
        if len(owners) > 1:
            raise WarehouseError(
                f"slice {tenant_id}/{source_scope} is stamped by several batches: {owners}"
            )
        return uuid.UUID(owners[0]) if owners else None

    def slice_counts(self, tenant_id: str, source_scope: str) -> dict[str, int]:
        with self._lock:
            rows = self.rows.get((tenant_id, source_scope), {})
            registered = self.registry.get((tenant_id, source_scope), {})
            return {dataset: rows[dataset].num_rows for dataset in registered}

    def registered_counts(self, tenant_id: str, source_scope: str) -> dict[str, int]:
        with self._lock:
            registered = self.registry.get((tenant_id, source_scope), {})
            return {dataset: row.row_count for dataset, row in registered.items()}

    def execute(self, statement: str) -> None:
        """Operator SQL (refresh_dependants) has nothing to refresh here."""

    # -- what a test reads -------------------------------------------------------------------

    def slice_rows(self, tenant_id: str, source_scope: str, dataset: str) -> pa.Table | None:
        with self._lock:
            return self.rows.get((tenant_id, source_scope), {}).get(dataset)

    def install(
        self, scope: Scope, batch_id: uuid.UUID, tables: dict[str, tuple[str, pa.Table]]
    ) -> None:
        """The commit itself: rows and registry rows replaced in one step."""
        now = dt.datetime.now(dt.UTC)
        with self._lock:
            self.rows[scope] = {dataset: table for dataset, (_, table) in tables.items()}
            self.registry[scope] = {
                dataset: RegistryRow(dataset, target, batch_id, table.num_rows, now)
                for dataset, (target, table) in tables.items()
            }


class MemorySliceWriter:
    """A slice replacement in progress: rows gathered here, invisible until `commit()`."""

    def __init__(
        self,
        warehouse: MemoryWarehouse,
        scope: Scope,
        batch_id: uuid.UUID,
        contracts: Sequence[DatasetContract],
        session: WarehouseSession,
    ) -> None:
        self._warehouse = warehouse
        self._scope = scope
        self._batch_id = batch_id
        self._contracts = {c.name: c for c in contracts}
        self._session = session
        self._tables = {c.name: c.arrow_schema.empty_table() for c in contracts}
        self.row_counts: dict[str, int] = dict.fromkeys(self._contracts, 0)
        self.progress: Progress | None = None
        self.fence: Fence | None = None
        self._open = True

    def __enter__(self) -> MemorySliceWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if not self._open:
            raise WarehouseError("this slice was already committed or rolled back")
        if self._session not in self._warehouse.open_sessions:
            self.close()
            raise WarehouseError(
                f"the slice's session {self._session.pid} was terminated",
                kind=ErrorKind.TRANSIENT,
            )

    def _check_fence(self) -> None:
        """Before each COPY, each discard and the COMMIT, as base.Fence says."""
        if self.fence is not None:
            self.fence()

    def load_files(self, contract: DatasetContract, files: Iterable[LoadFile]) -> int:
        self._check_open()
        if contract.name not in self._contracts:
            raise WarehouseError(f"dataset {contract.name!r} was not declared for this slice")
        loaded = 0
        try:
            for index, file in enumerate(files):
                if index == 0:
                    self._check_fence()  # the real writers ask before their COPY
                self._warehouse.fault("load")
                self._check_open()
                table = pq.read_table(file.path)
                if file.excluded_lines:
                    keep = [
                        line not in file.excluded_lines
                        for line in table[SOURCE_LINE_COLUMN].to_pylist()
                    ]
                    table = table.filter(pa.array(keep, pa.bool_()))
                table = table.select(contract.column_names).cast(contract.arrow_schema)
                self._tables[contract.name] = pa.concat_tables([self._tables[contract.name], table])
                self._warehouse.copies += 1
                loaded += table.num_rows
                self.row_counts[contract.name] += table.num_rows
                if self.progress is not None:
                    self.progress(contract.name, self.row_counts[contract.name])
        except BaseException:
            self.close()
            raise
        return loaded

    def discard_keys(self, contract: DatasetContract, keys: pa.Table) -> int:
        self._check_open()
        if not keys.num_rows:
            return 0
        try:
            self._check_fence()  # the real writers ask before the DELETE
        except BaseException:
            self.close()
            raise
        key_columns = list(contract.natural_key)
        wanted = set(zip(*(keys[c].to_pylist() for c in key_columns), strict=True))
        table = self._tables[contract.name]
        present = zip(*(table[c].to_pylist() for c in key_columns), strict=True)
        keep = [key not in wanted for key in present]
        kept = table.filter(pa.array(keep, pa.bool_()))
        deleted = table.num_rows - kept.num_rows
        self._tables[contract.name] = kept
        self.row_counts[contract.name] -= deleted
        return deleted

    def commit(self) -> SliceCommit:
        self._check_open()
        try:
            self._check_fence()
            self._warehouse.fault("commit")
        except BaseException:
            self.close()
            raise
        tables = {
            name: (self._contracts[name].target_table, table)
            for name, table in self._tables.items()
        }
        self._warehouse.install(self._scope, self._batch_id, tables)
        self.close()
        self._warehouse.fault("commit_ack")  # committed, but the caller never hears so
        return SliceCommit(self._batch_id, dict(self.row_counts))

    def close(self) -> None:
        self._open = False
        with self._warehouse._lock:
            self._warehouse.open_sessions.discard(self._session)
