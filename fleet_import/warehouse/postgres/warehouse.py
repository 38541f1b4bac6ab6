"""The PostgreSQL warehouse: curated tables in schema `curated`, loaded with binary COPY.

A slice is replaced in one transaction (see writer.py): delete the scope's rows, COPY the new
ones straight into the curated table (stamped in the COPY stream itself, so no staging table
and no second write), upsert the registry. MVCC keeps readers on the old slice until the
commit. Driver errors become WarehouseError in driver.py, and nowhere else.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from functools import partial
from typing import Any, TypeVar

import psycopg

from fleet_import.config import libpq_url
from fleet_import.contracts.model import Column, DatasetContract
from fleet_import.warehouse.base import (
    SliceWriter,
    WarehouseSession,
    check_contract,
)
from fleet_import.warehouse.committer import Cursor, SliceCommitter, SliceRequest, WriterCounters
from fleet_import.warehouse.evolution import add_column_sql, added_after_stamps, check_added
from fleet_import.warehouse.postgres import ddl, driver
from fleet_import.warehouse.postgres.slice_sql import (
    DDL_LOCK_CLASS,
    QUERIES,
    registry_exists_sql,
    relation_exists_sql,
)
from fleet_import.warehouse.postgres.writer import PostgresSliceWriter
from fleet_import.warehouse.shape import TableMigrationNeeded
from fleet_import.warehouse.sql import (
    Statement,
    create_registry_sql,
    create_schemas_sql,
    split_table,
)

# How long end_session waits for the terminated backend to exit (and release its locks).
_TERMINATE_WAIT_MS = 10_000
T = TypeVar("T")


class PostgresWarehouse(SliceCommitter):
    """Warehouse on PostgreSQL. Each method is one transaction on its own connection, so an
    instance may be shared by threads."""

    def __init__(
        self,
        url: str,
        *,
        reply_timeout: float | None = None,
        setting: str = driver.WAREHOUSE_URL,
    ) -> None:
        self._conninfo = libpq_url(url)
        self._reply_timeout = reply_timeout  # driver.BoundedConnection
        self._setting = setting  # the variable `url` came from, which its errors name
        self._ensured: set[tuple[str, str]] = set()
        self.counters = WriterCounters()

    def _begin(self, request: SliceRequest) -> SliceWriter:
        return PostgresSliceWriter(
            request,
            connect=partial(driver.connect, self._conninfo, self._reply_timeout, self._setting),
            counters=self.counters,
            setting=self._setting,
        )

    @contextmanager
    def _transaction(self) -> Iterator[psycopg.Connection[Any]]:
        """One connection, one transaction, committed when the block ends."""
        with (
            driver.translated(self._setting),
            driver.connect(self._conninfo, self._reply_timeout, self._setting) as conn,
        ):
            yield conn

    def _in_transaction(self, work: Callable[[Cursor], T]) -> T:
        with self._transaction() as conn, conn.cursor() as cursor:
            return work(cursor)

    def _registry_exists_sql(self) -> Statement:
        return registry_exists_sql()

    # -- tables --------------------------------------------------------------------------

    def ensure_tables(self, contracts: Iterable[DatasetContract]) -> None:
        contracts = list(contracts)
        for contract in contracts:
            check_contract(contract)
        with self._transaction() as conn:
            conn.execute(QUERIES["lock_ddl"], {"lock_class": DDL_LOCK_CLASS})
            for statement in create_schemas_sql(contracts):
                conn.execute(statement)
            conn.execute(create_registry_sql(ddl.DIALECT))
            for contract in contracts:
                self._ensure_table(conn, contract)
        self._ensured.update((c.target_table, c.contract_version) for c in contracts)

    def _ensure_table(self, conn: psycopg.Connection[Any], contract: DatasetContract) -> None:
        schema, relation = split_table(contract.target_table)
        found = conn.execute(
            QUERIES["table_columns"], {"schema": schema, "relation": relation}
        ).fetchall()
        found = [tuple(row) for row in found]
        if not found:
            conn.execute(ddl.create_table_sql(contract))
        elif not ddl.table_matches(contract, found):
            raise TableMigrationNeeded(
                f"table {contract.target_table} does not match dataset {contract.name!r}: "
                f"has {found}, expected {ddl.expected_columns(contract)}"
            )
        # Only when missing: CREATE INDEX takes a SHARE lock even when the index exists,
        # which would wait for every running load of the table.
        exists = conn.execute(*relation_exists_sql(schema, ddl.index_name(contract))).fetchone()
        if not (exists and exists[0]):
            conn.execute(ddl.create_index_sql(contract))

    # -- columns added by drift (warehouse.evolution) -------------------------------------

    def added_columns(self, tenant_id: str, contract: DatasetContract) -> dict[str, str]:
        schema, relation = split_table(contract.target_table)
        with self._transaction() as conn:
            found = conn.execute(
                QUERIES["table_columns"], {"schema": schema, "relation": relation}
            ).fetchall()
        return added_after_stamps(contract, [(name, sql_type) for name, sql_type, _ in found])

    def add_columns(
        self, tenant_id: str, contract: DatasetContract, columns: Mapping[str, str]
    ) -> None:
        self.ensure_tables([contract])  # a new dataset's first delivery may already drift
        for name, column_type in columns.items():
            with self._transaction() as conn:
                # The DDL lock: two workers adding one column do it one after the other.
                conn.execute(QUERIES["lock_ddl"], {"lock_class": DDL_LOCK_CLASS})
                if name not in self.added_columns(tenant_id, contract):
                    sql_type = ddl.pg_type(Column(name, column_type))
                    conn.execute(add_column_sql(contract, name, sql_type).encode())
        check_added(contract, columns, self.added_columns(tenant_id, contract))

    # -- sessions and operator SQL -------------------------------------------------------

    def end_session(self, session: WarehouseSession) -> bool:
        """Needs the right to signal that backend: the same role, a superuser, or a member
        of pg_signal_backend."""
        params = {"pid": session.pid, "started": session.started, "timeout_ms": _TERMINATE_WAIT_MS}
        with self._transaction() as conn:
            row = conn.execute(QUERIES["end_session"], params).fetchone()
        return bool(row and row[0])

    def execute(self, statement: str) -> None:
        """Run operator-configured SQL (refresh_dependants: materialized-view refreshes)."""
        with self._transaction() as conn:
            conn.execute(statement.encode())
