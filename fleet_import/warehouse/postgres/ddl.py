"""PostgreSQL types and table definitions of the curated tables. Identifiers are composed
with psycopg.sql; the registry's DDL is the shared one (warehouse.sql) in PostgreSQL types."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from psycopg import sql

from fleet_import.contracts.model import Column, DatasetContract
from fleet_import.warehouse.base import STAMP_COLUMNS
from fleet_import.warehouse.sql import SQL_TYPES, Dialect, split_table

PG_TYPES: Mapping[str, str] = {"string": "text", **SQL_TYPES}
"""Contract column type -> PostgreSQL type, spelled as format_type() reports it."""


def pg_type(column: Column) -> str:
    """The column's PostgreSQL type as format_type() reports it: `numeric(p,s)` for a
    decimal, which keeps every digit the contract allows and no more."""
    spec = column.decimal
    return PG_TYPES[column.type] if spec is None else f"numeric({spec[0]},{spec[1]})"


_STAMP_TYPES = ("text", "text", "uuid")
_MAX_IDENTIFIER_BYTES = 63

DIALECT = Dialect(
    registry_types={
        "tenant_id": "TEXT",
        "source_scope": "TEXT",
        "dataset": "TEXT",
        "batch_id": "UUID",
        "target_table": "TEXT",
    },
    now="now()",
    enforces_keys=True,
)


def table_identifier(target_table: str) -> sql.Identifier:
    return sql.Identifier(*split_table(target_table))


def expected_columns(contract: DatasetContract) -> list[tuple[str, str, bool]]:
    """(name, type, not null) of the contract's curated table, in order: the columns drift
    added (`evolved_columns`) come after the stamp columns, where ADD COLUMN put them."""
    evolved = set(contract.evolved_columns)
    columns = [(c.name, pg_type(c), not c.nullable) for c in contract.columns]
    return (
        [column for column in columns if column[0] not in evolved]
        + [
            (name, pg_type, True)
            for name, pg_type in zip(STAMP_COLUMNS, _STAMP_TYPES, strict=True)
        ]
        + [column for column in columns if column[0] in evolved]
    )


def table_matches(contract: DatasetContract, found: list[tuple[str, str, bool]]) -> bool:
    """Whether a table's (name, type, not null) columns are the contract's. Nullable ones
    beyond them were added by drift for another delivery (warehouse.evolution): a load that
    does not name them leaves them NULL."""
    expected = expected_columns(contract)
    return found[: len(expected)] == expected and not any(
        not_null for _, _, not_null in found[len(expected) :]
    )


def index_name(contract: DatasetContract) -> str:
    """`<table>_slice_ix`, shortened to PostgreSQL's 63 bytes with a digest when needed."""
    relation = split_table(contract.target_table)[1]
    name = f"{relation}_slice_ix"
    if len(name) <= _MAX_IDENTIFIER_BYTES:
        return name
    digest = hashlib.blake2s(relation.encode(), digest_size=4).hexdigest()
    return f"{relation[:45]}_{digest}_slice_ix"


def create_table_sql(contract: DatasetContract) -> sql.Composed:
    columns = [
        sql.SQL("{} {}{}").format(
            sql.Identifier(name), sql.SQL(pg_type), sql.SQL(" NOT NULL" if not_null else "")
        )
        for name, pg_type, not_null in expected_columns(contract)
    ]
    return sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
        table_identifier(contract.target_table), sql.SQL(", ").join(columns)
    )


def create_index_sql(contract: DatasetContract) -> sql.Composed:
    """Slices are found through the registry's batch id: a uuid index costs a COPY about
    half what a (tenant_id, source_scope) text index does (collated comparisons per row)."""
    return sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} ({})").format(
        sql.Identifier(index_name(contract)),
        table_identifier(contract.target_table),
        sql.Identifier(STAMP_COLUMNS[2]),
    )
