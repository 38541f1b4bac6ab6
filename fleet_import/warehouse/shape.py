"""A curated table's shape against its contract: which columns differ, how each would be
changed (in place, by a deep copy, or not at all), and which SQL predicate finds the values
a change could not cast. Pure: each dialect (postgres/migration.py, redshift/migration.py)
says what its warehouse can do in place and spells the types; `warehouse.migration` reads
the tables and runs the change.

A change is refused when it would lose or invent data: a column the contract dropped (its
values would go), a NOT NULL column the table lacks (no value to give it), or a type no cast
here converts faithfully (text to a number, a timestamp to a boolean, ...)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Literal

from fleet_import.contracts.model import Column, DatasetContract
from fleet_import.errors import WarehouseError
from fleet_import.warehouse.base import STAMP_COLUMNS
from fleet_import.warehouse.sql import quote_identifier

How = Literal["in place", "deep copy", "refused"]
State = Literal["missing", "matches", "differs"]
MIGRATE_COMMAND = "fleet-import tables migrate"
EXAMPLES_SHOWN = 5
"""Values that do not cast, shown per column (with their rows' stamps)."""
_INT64_LIMIT = "9223372036854775807"
_NUMBER = re.compile(r"(bigint|integer|smallint|double precision|real|numeric(\(\d+,\d+\))?)")
_TEXT = re.compile(r"(text|character varying(\(\d+\))?)")


@dataclass(frozen=True)
class TableColumn:
    """A column as the table has it or as the contract wants it, in the dialect's spelling
    (`numeric(12,2)`, `character varying(68)`); `not_null` None where the dialect does not
    compare nullability (Redshift's tables are checked by name and type only)."""

    name: str
    type: str
    not_null: bool | None = None

    def spelled(self) -> str:
        return f"{self.name} {self.type}{' NOT NULL' if self.not_null else ''}"


@dataclass(frozen=True)
class ColumnChange:
    """One column that differs: what the table has (None: it lacks the column), what the
    contract wants (None: the contract no longer names it), and how it would change."""

    column: str
    has: str | None
    wants: str | None
    how: How
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "column": self.column,
            "has": self.has,
            "wants": self.wants,
            "how": self.how,
            "reason": self.reason,
        }

    def spelled(self) -> str:
        what = f"{self.column}: {self.has or '(missing)'} -> {self.wants or '(dropped)'}"
        return f"{what}, {self.how}{f' ({self.reason})' if self.reason else ''}"


@dataclass(frozen=True)
class TablePlan:
    """What a curated table holds against its dataset's contract, and what migrate does."""

    dataset: str
    table: str
    contract_version: str
    state: State
    changes: tuple[ColumnChange, ...] = ()
    reordered: bool = False
    """The contract's columns are all there, in another order: only a deep copy reorders."""

    @property
    def method(self) -> How | None:
        """None when nothing is to change (the table matches, or is created by the first load)."""
        if self.state != "differs":
            return None
        hows = {change.how for change in self.changes}
        if "refused" in hows:
            return "refused"
        return "deep copy" if "deep copy" in hows or self.reordered else "in place"

    def to_json(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "table": self.table,
            "contract_version": self.contract_version,
            "state": self.state,
            "method": self.method,
            "reordered": self.reordered,
            "changes": [change.to_json() for change in self.changes],
        }

    def spelled(self) -> str:
        if self.state == "missing":
            return f"{self.table}: missing (the first load creates it)"
        if self.state == "matches":
            return f"{self.table}: matches dataset {self.dataset!r}"
        parts = [change.spelled() for change in self.changes]
        if self.reordered:
            parts.append("columns in another order")
        return f"{self.table}: {self.method}: " + "; ".join(parts)


@dataclass(frozen=True)
class Uncastable:
    """Values of one column that the change would not carry over faithfully."""

    table: str
    column: str
    wants: str
    count: int
    examples: list[dict[str, Any]] = field(default_factory=list)
    """{value, tenant_id, source_scope, ingestion_batch_id} of a few of them."""

    def to_json(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "column": self.column,
            "wants": self.wants,
            "count": self.count,
            "examples": self.examples,
        }

    def spelled(self) -> str:
        shown = ", ".join(
            f"{e['value']!r} ({e['tenant_id']} {e['source_scope']} batch {e['ingestion_batch_id']})"
            for e in self.examples
        )
        return f"{self.table}.{self.column}: {self.count} value(s) do not fit {self.wants}: {shown}"


class TableMigrationNeeded(WarehouseError):
    """A curated table does not hold its contract's shape: `fleet-import tables migrate`."""

    def __init__(self, detail: str, *, tenant_id: str | None = None) -> None:
        self.detail = detail
        option = f" --tenant {tenant_id}" if tenant_id else ""
        super().__init__(
            f"{detail}: run `{MIGRATE_COMMAND}{option}` to see the plan, then "
            f"`{MIGRATE_COMMAND}{option} --apply`"
        )

    def for_tenant(self, tenant_id: str) -> TableMigrationNeeded:
        return TableMigrationNeeded(self.detail, tenant_id=tenant_id)


class MigrationRefused(WarehouseError):
    """The table was left as it was: values that do not cast, or a change no cast makes."""

    def __init__(self, message: str, uncastable: Sequence[Uncastable] = ()) -> None:
        super().__init__(message)
        self.uncastable = list(uncastable)


# -- planning ------------------------------------------------------------------------------

InPlace = Callable[[TableColumn, TableColumn], bool]
"""in_place(has, wants): whether the dialect changes this column without a copy."""


def plan_table(
    contract: DatasetContract,
    found: Sequence[TableColumn],
    expected: Sequence[TableColumn],
    *,
    in_place: InPlace,
) -> TablePlan:
    """Compare a table's columns (`found`, in order) with the contract's (`expected`, the
    contract's columns then the stamps)."""
    plan = {"dataset": contract.name, "table": contract.target_table}
    version = contract.contract_version
    if not found:
        return TablePlan(**plan, contract_version=version, state="missing")
    if list(found) == list(expected):
        return TablePlan(**plan, contract_version=version, state="matches")
    has = {column.name: column for column in found}
    changes: list[ColumnChange] = []
    for column, wants in zip(contract.columns, expected, strict=False):
        change = _column_change(column, has.get(column.name), wants, in_place)
        if change is not None:
            changes.append(change)
    for wants in expected[len(contract.columns) :]:  # the stamps: never changed here
        if has.get(wants.name) != wants:
            got = has.get(wants.name)
            changes.append(
                ColumnChange(
                    wants.name,
                    got.type if got else None,
                    wants.type,
                    "refused",
                    "a stamp column: migrate keeps stamps as they are",
                )
            )
    wanted = {column.name for column in expected}
    for column in found:
        if column.name not in wanted:
            changes.append(
                ColumnChange(
                    column.name,
                    column.type,
                    None,
                    "refused",
                    "the contract no longer names it: its values would be lost",
                )
            )
    common = [column.name for column in found if column.name in wanted]
    reordered = common != [column.name for column in expected if column.name in has]
    return TablePlan(
        **plan,
        contract_version=version,
        state="differs",
        changes=tuple(changes),
        reordered=reordered,
    )


def _column_change(
    column: Column, has: TableColumn | None, wants: TableColumn, in_place: InPlace
) -> ColumnChange | None:
    if has is None:
        if column.nullable:
            return ColumnChange(column.name, None, wants.type, "deep copy", "added, as NULL")
        return ColumnChange(
            column.name, None, wants.type, "refused", "NOT NULL, and the table has no values"
        )
    if has == wants or (has.type == wants.type and wants.not_null is None):
        return None
    spelled_has = has.type + (" NOT NULL" if has.not_null else "")
    spelled_wants = wants.type + (" NOT NULL" if wants.not_null else "")
    if invalid_predicate(quote_identifier(column.name), has.type, column, wants.type) is None:
        return ColumnChange(
            column.name,
            spelled_has,
            spelled_wants,
            "refused",
            f"no cast from {has.type} to {wants.type} here: change the contract back, or "
            "convert the column by hand",
        )
    how: How = "in place" if in_place(has, wants) else "deep copy"
    return ColumnChange(column.name, spelled_has, spelled_wants, how)


# -- values that do not cast ---------------------------------------------------------------


def invalid_predicate(
    quoted: str,
    has_type: str | None,
    column: Column,
    wants_type: str,
    max_bytes: int | None = None,
) -> str | None:
    """SQL true for the rows whose value in `quoted` (of type `has_type`; None: the table
    lacks it) does not fit the contract column (of type `wants_type` in the dialect's
    spelling); "FALSE" when every value fits; None when no cast here converts `has_type`
    to it. `max_bytes`: the VARCHAR width a string must fit (Redshift's), None for text."""
    if has_type is None:
        return "FALSE" if column.nullable else "TRUE"
    same = has_type == wants_type
    cast = "FALSE" if same else _cast_predicate(quoted, has_type, column, max_bytes)
    if cast is None:
        return None
    if not column.nullable:
        cast = f"{quoted} IS NULL" if cast == "FALSE" else f"({cast}) OR {quoted} IS NULL"
    return cast


def _cast_predicate(
    quoted: str, has_type: str, column: Column, max_bytes: int | None
) -> str | None:
    number = _NUMBER.fullmatch(has_type) is not None
    spec = column.decimal
    if column.type == "string":
        if max_bytes is None:
            return "FALSE"
        return f"OCTET_LENGTH(CAST({quoted} AS VARCHAR(65535))) > {max_bytes}"
    if _TEXT.fullmatch(has_type):
        return None  # text to a number, a date, ...: parsing is normalization's job
    if spec is not None and number:
        # What rounds to s digits and still fits p: |v| < 10^(p-s) - 0.5 * 10^-s. NaN and
        # the infinities compare false, so they are refused too.
        precision, scale = spec
        limit = Decimal(10) ** (precision - scale) - Decimal(5).scaleb(-(scale + 1))
        return f"{quoted} IS NOT NULL AND NOT (ABS({quoted}) < {limit:f})"
    if column.type == "int64" and number:
        return (
            f"{quoted} IS NOT NULL AND NOT ({quoted} = ROUND({quoted}) "
            f"AND ABS({quoted}) < {_INT64_LIMIT})"
        )
    if column.type == "float64" and number:
        return "FALSE"
    return None


def uncastable_sql(quoted: str, predicate: str, table_sql: str) -> tuple[str, str]:
    """(count, examples) statements for the rows `predicate` finds in `table_sql`."""
    stamps = ", ".join(quote_identifier(c) for c in STAMP_COLUMNS[:2])
    batch = quote_identifier(STAMP_COLUMNS[2])
    count = f"SELECT COUNT(*) FROM {table_sql} WHERE {predicate}"
    examples = (
        f"SELECT LEFT(CAST({quoted} AS VARCHAR(65535)), 60), {stamps}, "
        f"CAST({batch} AS VARCHAR(36)) FROM {table_sql} WHERE {predicate} "
        f"ORDER BY {stamps}, 4 LIMIT {EXAMPLES_SHOWN}"
    )
    return count, examples
