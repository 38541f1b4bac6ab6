"""One Warehouse over many databases: each tenant's slices go to the database its
`database_of` names (None: the shared one), through one warehouse object (one connection
pool) per database, made on first use.

The pipeline still sees one `Warehouse`: every call that names a tenant is routed by it.
The calls that name none fan out: `end_session` asks each database opened so far (a
session belongs to exactly one), `ensure_tables` and `execute` (operator refresh SQL) run
in the shared database, or in every database opened so far when there is no shared one.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence

from fleet_import.contracts.model import DatasetContract
from fleet_import.warehouse.base import (
    DatasetLoad,
    Fence,
    Progress,
    SessionSink,
    SliceCommit,
    SliceWriter,
    Warehouse,
    WarehouseSession,
)


class TenantWarehouses:
    """The Warehouse protocol, routed per tenant (see the module docstring)."""

    def __init__(
        self,
        database_of: Callable[[str], str | None],
        build: Callable[[str | None], Warehouse],
        *,
        replays_slices: bool,
        shared: bool = True,
    ) -> None:
        self._database_of = database_of
        self._build = build
        self.replays_slices = replays_slices
        self._shared = shared  # False: every tenant has its own database (a URL template)
        self._by_database: dict[str | None, Warehouse] = {}
        self._lock = threading.Lock()

    def database_for(self, tenant_id: str) -> str | None:
        return self._database_of(tenant_id)

    def for_database(self, database: str | None) -> Warehouse:
        with self._lock:
            if database not in self._by_database:
                self._by_database[database] = self._build(database)
            return self._by_database[database]

    def for_tenant(self, tenant_id: str) -> Warehouse:
        return self.for_database(self._database_of(tenant_id))

    def opened(self) -> list[Warehouse]:
        with self._lock:
            return list(self._by_database.values())

    def _untenanted(self) -> list[Warehouse]:
        return [self.for_database(None)] if self._shared else self.opened()

    def ensure_tables(self, contracts: Iterable[DatasetContract]) -> None:
        contracts = list(contracts)
        for warehouse in self._untenanted():
            warehouse.ensure_tables(contracts)

    def check_tables(self, tenant_id: str, contracts: Iterable[DatasetContract]) -> None:
        self.for_tenant(tenant_id).check_tables(tenant_id, contracts)

    def commit_slice(
        self,
        *,
        tenant_id: str,
        source_scope: str,
        batch_id: uuid.UUID,
        datasets: Sequence[DatasetLoad],
        progress: Progress | None = None,
    ) -> SliceCommit:
        return self.for_tenant(tenant_id).commit_slice(
            tenant_id=tenant_id,
            source_scope=source_scope,
            batch_id=batch_id,
            datasets=datasets,
            progress=progress,
        )

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
        return self.for_tenant(tenant_id).open_slice(
            tenant_id=tenant_id,
            source_scope=source_scope,
            batch_id=batch_id,
            contracts=contracts,
            progress=progress,
            on_session=on_session,
            fence=fence,
        )

    def end_session(self, session: WarehouseSession) -> bool:
        return any(warehouse.end_session(session) for warehouse in self._untenanted_or_opened())

    def _untenanted_or_opened(self) -> list[Warehouse]:
        opened = self.opened()
        return opened if opened else self._untenanted()

    def slice_owner(self, tenant_id: str, source_scope: str) -> uuid.UUID | None:
        return self.for_tenant(tenant_id).slice_owner(tenant_id, source_scope)

    def slice_counts(self, tenant_id: str, source_scope: str) -> dict[str, int]:
        return self.for_tenant(tenant_id).slice_counts(tenant_id, source_scope)

    def registered_counts(self, tenant_id: str, source_scope: str) -> dict[str, int]:
        return self.for_tenant(tenant_id).registered_counts(tenant_id, source_scope)

    def added_columns(self, tenant_id: str, contract: DatasetContract) -> dict[str, str]:
        return self.for_tenant(tenant_id).added_columns(tenant_id, contract)  # type: ignore[attr-defined]

    def add_columns(
        self, tenant_id: str, contract: DatasetContract, columns: Mapping[str, str]
    ) -> None:
        self.for_tenant(tenant_id).add_columns(tenant_id, contract, columns)  # type: ignore[attr-defined]

    def execute(self, statement: str) -> None:
        for warehouse in self._untenanted():
            warehouse.execute(statement)  # type: ignore[attr-defined]
