"""Columns the `evolve` drift policy adds to a curated table (contracts.drift): read back
from the table, and added, by both backends.

An added column sits after the stamp columns (ALTER TABLE ADD COLUMN appends), nullable.
What a table holds there is the record of its evolution: the importer reads it to build the
effective contract, so nothing else has to remember it. The ALTER runs in a transaction of
its own, never inside a slice's: PostgreSQL would hold its ACCESS EXCLUSIVE lock on the
curated table (every reader waits) for the whole load, and Redshift allows ADD COLUMN only
outside a transaction block shared with other work on the table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from fleet_import.contracts.model import DatasetContract
from fleet_import.errors import WarehouseError
from fleet_import.warehouse.base import STAMP_COLUMNS
from fleet_import.warehouse.sql import SQL_TYPES, quote_identifier, table_name

_STRING_TYPES = ("text", "character varying")
_CONTRACT_TYPES = {sql_type: name for name, sql_type in SQL_TYPES.items()}


@runtime_checkable
class EvolvingWarehouse(Protocol):
    """A warehouse whose curated tables can gain the columns of a drifted delivery."""

    def added_columns(self, tenant_id: str, contract: DatasetContract) -> dict[str, str]:
        """The columns after the stamp columns of the contract's table in this tenant's
        database (name -> contract type), in table order; none when it does not exist."""
        ...

    def add_columns(
        self, tenant_id: str, contract: DatasetContract, columns: Mapping[str, str]
    ) -> None:
        """Add each column (name -> contract type) the table lacks, nullable, in order, each
        in a transaction of its own; one another worker added meanwhile is taken as it is."""
        ...


def contract_type_of(sql_type: str) -> str | None:
    """The contract type of a column as the catalog spells its type (format_type(), or
    information_schema with a DECIMAL's precision and scale); None for any other type."""
    if sql_type.startswith(_STRING_TYPES):
        return "string"
    if sql_type.startswith("numeric("):
        return "decimal" + sql_type.removeprefix("numeric").replace(" ", "")
    return _CONTRACT_TYPES.get(sql_type)


def added_after_stamps(
    contract: DatasetContract, found: Sequence[tuple[str, str]]
) -> dict[str, str]:
    """The (name, catalog type) columns of a table that follow its stamp columns."""
    names = [name for name, _ in found]
    if STAMP_COLUMNS[-1] not in names:
        return {}
    added = {}
    for name, sql_type in found[names.index(STAMP_COLUMNS[-1]) + 1 :]:
        column_type = contract_type_of(sql_type)
        if column_type is None:
            raise WarehouseError(
                f"table {contract.target_table}: column {name!r} after the stamp columns "
                f"has type {sql_type}, which no contract type maps to"
            )
        added[name] = column_type
    return added


def add_column_sql(contract: DatasetContract, name: str, sql_type: str) -> str:
    return (
        f"ALTER TABLE {table_name(contract.target_table)} "
        f"ADD COLUMN {quote_identifier(name)} {sql_type}"
    )


def check_added(
    contract: DatasetContract, wanted: Mapping[str, str], found: Mapping[str, str]
) -> None:
    """After adding: every wanted column is there with its type (another worker's ADD may
    have given one another type: that is refused, not loaded into)."""
    wrong = [
        f"{name} is {found.get(name, 'missing')}, expected {column_type}"
        for name, column_type in wanted.items()
        if found.get(name) != column_type
    ]
    if wrong:
        raise WarehouseError(
            f"table {contract.target_table} did not evolve as asked: " + "; ".join(wrong)
        )
