"""How Redshift brings a curated table to its contract's shape (warehouse.migration runs it).

Redshift changes one type in place: widening a VARCHAR (`ALTER COLUMN ... TYPE VARCHAR(n)`),
which it refuses inside a transaction block, so those run alone, as `ensure_tables` runs
them. Every other change is a deep copy (AWS "Performing a deep copy"): a new table in the
contract's shape and layout, `INSERT ... SELECT` with the casts, the old table dropped and
the new one renamed into its place, in one transaction that first `LOCK`s the table — the
lock a slice commit takes on it (slice_sql.lock_sql) — so no slice commit interleaves, and
readers see the old table until the COMMIT."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from fleet_import.contracts.model import Column, DatasetContract
from fleet_import.warehouse.committer import Cursor, run
from fleet_import.warehouse.redshift import ddl
from fleet_import.warehouse.redshift.slice_sql import lock_sql
from fleet_import.warehouse.redshift.warehouse import RedshiftWarehouse
from fleet_import.warehouse.shape import TableColumn
from fleet_import.warehouse.sql import split_table

T = TypeVar("T")
_VARCHAR = "character varying("


def _column(name: str, data_type: str, width: int | None) -> TableColumn:
    return TableColumn(name, data_type if width is None else f"{data_type}({width})")


def _width(column: TableColumn) -> int | None:
    if not column.type.startswith(_VARCHAR):
        return None
    return int(column.type.removeprefix(_VARCHAR).rstrip(")"))


class RedshiftMigration:
    """The dialect half of a migration on one Redshift database."""

    in_place_in_transaction = False  # ALTER COLUMN ... TYPE is refused in a transaction block

    def __init__(self, warehouse: RedshiftWarehouse) -> None:
        self._warehouse = warehouse

    def transaction(self, work: Callable[[Cursor], T]) -> T:
        # No statement timeout: the copy takes as long as the table is big.
        return self._warehouse._in_transaction(work, limited=False)  # noqa: SLF001

    def read_columns(self, cursor: Cursor, contract: DatasetContract) -> list[TableColumn]:
        rows = run(cursor, ddl.table_columns_sql(*split_table(contract.target_table)))
        return [_column(*row) for row in rows.fetchall()]

    def expected(self, contract: DatasetContract) -> list[TableColumn]:
        return [_column(*column) for column in ddl.expected_columns(contract)]

    def in_place(self, has: TableColumn, wants: TableColumn) -> bool:
        has_width, wants_width = _width(has), _width(wants)
        return has_width is not None and wants_width is not None and has_width < wants_width

    def max_bytes(self, column: Column) -> int | None:
        return column.max_bytes if column.type == "string" else None

    def lock(self, cursor: Cursor, contract: DatasetContract) -> None:
        run(cursor, lock_sql([contract.target_table]))

    def column_type(self, column: Column) -> str:
        return ddl.column_type(column)

    def in_place_sql(self, contract: DatasetContract, found: Sequence[TableColumn]) -> list[str]:
        raise NotImplementedError("Redshift's in-place changes run alone: see widen")

    def widen(self, contract: DatasetContract, found: Sequence[TableColumn]) -> None:
        """The in-place changes: VARCHARs widened, each statement alone."""
        rows = [
            (c.name, _VARCHAR[:-1], _width(c)) if _width(c) is not None else (c.name, c.type, None)
            for c in found
        ]
        for column, statement in ddl.widenings(contract, rows):
            # its one autocommit ALTER, re-encoding a column whose encoding refuses it
            self._warehouse._widen(contract.target_table, column, statement)  # noqa: SLF001

    def create_sql(self, contract: DatasetContract) -> str:
        return ddl.create_table_sql(contract)

    def after_swap_sql(self, contract: DatasetContract) -> list[str]:
        return []
