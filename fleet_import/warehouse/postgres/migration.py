"""How PostgreSQL brings a curated table to its contract's shape (warehouse.migration runs
it): a type change PostgreSQL makes itself (`ALTER COLUMN ... TYPE ... USING CAST(...)`, one
ALTER TABLE, one rewrite) and nullability are changed in place; a column added or columns
reordered take a deep copy. Either runs in one transaction that holds the DDL advisory lock
(as `ensure_tables` does) and the table in ACCESS EXCLUSIVE mode, which waits for every slice
transaction writing it (each holds ROW EXCLUSIVE from its DELETE to its COMMIT) and makes the
next wait for the migration."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from psycopg import sql

from fleet_import.contracts.model import Column, DatasetContract
from fleet_import.warehouse.committer import Cursor, run
from fleet_import.warehouse.postgres import ddl
from fleet_import.warehouse.postgres.slice_sql import DDL_LOCK_CLASS, QUERIES
from fleet_import.warehouse.postgres.warehouse import PostgresWarehouse
from fleet_import.warehouse.shape import TableColumn
from fleet_import.warehouse.sql import quote_identifier, split_table, table_name

T = TypeVar("T")


class PostgresMigration:
    """The dialect half of a migration on one PostgreSQL warehouse database."""

    in_place_in_transaction = True

    def __init__(self, warehouse: PostgresWarehouse) -> None:
        self._warehouse = warehouse

    def transaction(self, work: Callable[[Cursor], T]) -> T:
        return self._warehouse._in_transaction(work)  # noqa: SLF001 - its one transaction

    def read_columns(self, cursor: Cursor, contract: DatasetContract) -> list[TableColumn]:
        schema, relation = split_table(contract.target_table)
        rows = run(cursor, (QUERIES["table_columns"], {"schema": schema, "relation": relation}))
        return [TableColumn(name, kind, bool(not_null)) for name, kind, not_null in rows.fetchall()]

    def expected(self, contract: DatasetContract) -> list[TableColumn]:
        return [TableColumn(*column) for column in ddl.expected_columns(contract)]

    def in_place(self, has: TableColumn, wants: TableColumn) -> bool:
        return True  # ALTER COLUMN ... TYPE ... USING, SET / DROP NOT NULL

    def max_bytes(self, column: Column) -> int | None:
        return None  # text holds any string

    def lock(self, cursor: Cursor, contract: DatasetContract) -> None:
        run(cursor, (QUERIES["lock_ddl"], {"lock_class": DDL_LOCK_CLASS}))
        run(cursor, f"LOCK TABLE {table_name(contract.target_table)} IN ACCESS EXCLUSIVE MODE")

    def column_type(self, column: Column) -> str:
        return ddl.pg_type(column)

    def widen(self, contract: DatasetContract, found: Sequence[TableColumn]) -> None:
        raise NotImplementedError("PostgreSQL changes columns in the migration's transaction")

    def in_place_sql(self, contract: DatasetContract, found: Sequence[TableColumn]) -> list[str]:
        has = {column.name: column for column in found}
        parts = []
        for column, wants in zip(contract.columns, self.expected(contract), strict=False):
            got, name = has[column.name], quote_identifier(column.name)
            if got.type != wants.type:
                parts.append(
                    f"ALTER COLUMN {name} TYPE {wants.type} USING CAST({name} AS {wants.type})"
                )
            if got.not_null != wants.not_null:
                parts.append(f"ALTER COLUMN {name} {'SET' if wants.not_null else 'DROP'} NOT NULL")
        return [f"ALTER TABLE {table_name(contract.target_table)} {', '.join(parts)}"]

    def create_sql(self, contract: DatasetContract) -> str:
        return _text(ddl.create_table_sql(contract))

    def after_swap_sql(self, contract: DatasetContract) -> list[str]:
        """The slice index (dropped with the old table; its name is the relation's)."""
        return [_text(ddl.create_index_sql(contract))]


def _text(composed: sql.Composed) -> str:
    # Identifiers only (no values), so no connection is needed to spell them.
    return composed.as_string(None)
