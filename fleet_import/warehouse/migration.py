"""`fleet-import tables migrate`: plan, and with `apply` make, the changes that bring each
curated table of one warehouse database to the shape its contract declares.

A plan reads each table's columns and compares them with the contract (warehouse.shape). An
applied change runs in one transaction of the table's warehouse that first takes the lock
a slice commit takes on the table (the dialect's `lock`), so no slice commit interleaves,
then re-plans under that lock, refuses values that would not cast (naming table, column,
count and a few values with their rows' stamps) before anything changes, and then changes
the table: in place where the dialect can, else by a deep copy — a new table in the
contract's shape, `INSERT ... SELECT` with the casts, row counts compared, the old table
dropped and the new one renamed into its place. Stamp columns and the slice registry are
not touched: every slice stays owned by the batch that wrote it. A crash anywhere before
the COMMIT leaves the old table as it was, serving readers; running migrate again starts
over (a leftover new table is dropped first).

Tables that do not exist yet are left to the first load, which creates them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from fleet_import import failpoints
from fleet_import.contracts.model import Column, DatasetContract
from fleet_import.errors import WarehouseError
from fleet_import.warehouse.base import STAMP_COLUMNS, Warehouse
from fleet_import.warehouse.committer import Cursor, run
from fleet_import.warehouse.postgres.migration import PostgresMigration
from fleet_import.warehouse.postgres.warehouse import PostgresWarehouse
from fleet_import.warehouse.redshift.migration import RedshiftMigration
from fleet_import.warehouse.redshift.warehouse import RedshiftWarehouse
from fleet_import.warehouse.shape import (
    MigrationRefused,
    TableColumn,
    TablePlan,
    Uncastable,
    invalid_predicate,
    plan_table,
    uncastable_sql,
)
from fleet_import.warehouse.sql import quote_identifier, split_table, table_name

BEFORE_SWAP_FAILPOINT = "migrate_before_swap"
"""Hit after the new shape is written (copied, or altered in place), before the swap and
the COMMIT: a test kills migrate here."""
_NEW_SUFFIX = "__migrating"
_RELATION_BYTES = 63


class Migration(Protocol):
    """What a warehouse dialect gives a migration (postgres/ and redshift/ `migration`)."""

    in_place_in_transaction: bool

    def transaction(self, work: Any) -> Any: ...
    def read_columns(self, cursor: Cursor, contract: DatasetContract) -> list[TableColumn]: ...
    def expected(self, contract: DatasetContract) -> list[TableColumn]: ...
    def in_place(self, has: TableColumn, wants: TableColumn) -> bool: ...
    def max_bytes(self, column: Column) -> int | None: ...
    def lock(self, cursor: Cursor, contract: DatasetContract) -> None: ...
    def column_type(self, column: Column) -> str: ...
    def in_place_sql(self, contract: DatasetContract, found: list[TableColumn]) -> list[str]: ...
    def widen(self, contract: DatasetContract, found: list[TableColumn]) -> None: ...
    def create_sql(self, contract: DatasetContract) -> str: ...
    def after_swap_sql(self, contract: DatasetContract) -> list[str]: ...


@dataclass(frozen=True)
class Migrated:
    """A table brought to its contract's shape, holding the same `rows` as before."""

    plan: TablePlan
    rows: int

    def to_json(self) -> dict[str, Any]:
        return {**self.plan.to_json(), "rows": self.rows}


def migration_for(warehouse: Warehouse) -> Migration:
    """The dialect of one warehouse database (not a TenantWarehouses: pick its database)."""
    if isinstance(warehouse, PostgresWarehouse):
        return PostgresMigration(warehouse)
    if isinstance(warehouse, RedshiftWarehouse):
        return RedshiftMigration(warehouse)
    raise WarehouseError(f"no table migration for {type(warehouse).__name__}")


def plan_tables(migration: Migration, contracts: Iterable[DatasetContract]) -> list[TablePlan]:
    """Each contract's table against it, in the contracts' order (one read transaction)."""
    contracts = list(contracts)

    def work(cursor: Cursor) -> list[TablePlan]:
        return [_plan(migration, cursor, contract) for contract in contracts]

    return migration.transaction(work)


def _plan(migration: Migration, cursor: Cursor, contract: DatasetContract) -> TablePlan:
    found = migration.read_columns(cursor, contract)
    return plan_table(contract, found, migration.expected(contract), in_place=migration.in_place)


def apply_plan(migration: Migration, contract: DatasetContract) -> TablePlan | Migrated:
    """Bring the contract's table to its shape; the plan alone when nothing is to change.
    Raises MigrationRefused (nothing changed) for a refused change or values that do not
    cast."""
    plan = plan_tables(migration, [contract])[0]
    if plan.method is None:
        return plan
    _refuse_refused(plan)
    if plan.method == "in place" and not migration.in_place_in_transaction:
        return _widened(migration, contract, plan)

    def work(cursor: Cursor) -> TablePlan | Migrated:
        migration.lock(cursor, contract)
        found = migration.read_columns(cursor, contract)
        locked = plan_table(
            contract, found, migration.expected(contract), in_place=migration.in_place
        )
        if locked.method is None:  # another migrate got there first
            return locked
        _refuse_refused(locked)
        if locked.method == "in place" and not migration.in_place_in_transaction:
            raise MigrationRefused(f"{contract.target_table} changed meanwhile: run again")
        _refuse_uncastable(migration, cursor, contract, found)
        rows = _count(cursor, contract.target_table)
        if locked.method == "in place":
            for statement in migration.in_place_sql(contract, found):
                run(cursor, statement)
            failpoints.hit(BEFORE_SWAP_FAILPOINT)
        else:
            _deep_copy(migration, cursor, contract, found, rows)
        return Migrated(locked, rows)

    return migration.transaction(work)


def _widened(migration: Migration, contract: DatasetContract, plan: TablePlan) -> Migrated:
    """Changes the dialect makes in place but not in a transaction (Redshift's VARCHAR
    widening): each ALTER alone. Every value fits a wider column."""
    found = migration.transaction(lambda cursor: migration.read_columns(cursor, contract))
    migration.widen(contract, found)
    rows = migration.transaction(lambda cursor: _count(cursor, contract.target_table))
    return Migrated(plan, rows)


def _refuse_refused(plan: TablePlan) -> None:
    if plan.method == "refused":
        refused = "; ".join(c.spelled() for c in plan.changes if c.how == "refused")
        raise MigrationRefused(f"{plan.table} was left as it is: {refused}")


def _refuse_uncastable(
    migration: Migration, cursor: Cursor, contract: DatasetContract, found: list[TableColumn]
) -> None:
    has = {column.name: column for column in found}
    expected = {column.name: column for column in migration.expected(contract)}
    table = table_name(contract.target_table)
    problems: list[Uncastable] = []
    for column in contract.columns:
        got, wants = has.get(column.name), expected[column.name]
        if got is None or got == wants:  # added columns are NULL (NOT NULL ones: refused)
            continue
        quoted = quote_identifier(column.name)
        predicate = invalid_predicate(
            quoted, got.type, column, wants.type, migration.max_bytes(column)
        )
        if predicate is None or predicate == "FALSE":
            continue  # None was refused by the plan already
        count_sql, examples_sql = uncastable_sql(quoted, predicate, table)
        count = int(run(cursor, count_sql).fetchone()[0])
        if count:
            examples = [
                dict(zip(("value", *STAMP_COLUMNS), row, strict=True))
                for row in run(cursor, examples_sql).fetchall()
            ]
            problems.append(
                Uncastable(contract.target_table, column.name, wants.type, count, examples)
            )
    if problems:
        raise MigrationRefused(
            f"{contract.target_table} was left as it is, values do not cast: "
            + "; ".join(p.spelled() for p in problems),
            problems,
        )


def _deep_copy(
    migration: Migration,
    cursor: Cursor,
    contract: DatasetContract,
    found: list[TableColumn],
    rows: int,
) -> None:
    schema, relation = split_table(contract.target_table)
    new_table = f"{schema}.{relation[: _RELATION_BYTES - len(_NEW_SUFFIX)]}{_NEW_SUFFIX}"
    copy = contract.model_copy(update={"target_table": new_table})
    has = {column.name for column in found}
    values = [
        f"CAST({quote_identifier(column.name) if column.name in has else 'NULL'} "
        f"AS {migration.column_type(column)})"
        for column in contract.columns
    ]
    names = [quote_identifier(name) for name in (*contract.column_names, *STAMP_COLUMNS)]
    stamps = [quote_identifier(name) for name in STAMP_COLUMNS]
    run(cursor, f"DROP TABLE IF EXISTS {table_name(new_table)}")  # a leftover of a crash
    run(cursor, migration.create_sql(copy))
    run(
        cursor,
        f"INSERT INTO {table_name(new_table)} ({', '.join(names)}) "
        f"SELECT {', '.join([*values, *stamps])} FROM {table_name(contract.target_table)}",
    )
    copied = _count(cursor, new_table)
    if copied != rows:
        raise WarehouseError(
            f"the copy of {contract.target_table} holds {copied} rows, not {rows}: left as it is"
        )
    failpoints.hit(BEFORE_SWAP_FAILPOINT)
    run(cursor, f"DROP TABLE {table_name(contract.target_table)}")
    run(cursor, f"ALTER TABLE {table_name(new_table)} RENAME TO {quote_identifier(relation)}")
    for statement in migration.after_swap_sql(contract):
        run(cursor, statement)


def _count(cursor: Cursor, table: str) -> int:
    return int(run(cursor, f"SELECT COUNT(*) FROM {table_name(table)}").fetchone()[0])
