"""Redshift types and table definitions: curated tables without keys (Redshift would not
enforce them; slices are found by their stamps), strings as VARCHAR sized in bytes (the
contract's `Column.max_bytes`), sorted by tenant and scope, spread evenly. The registry's
DDL is the shared one (warehouse.sql) in Redshift types."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fleet_import.contracts.model import Column, DatasetContract
from fleet_import.warehouse.base import STAMP_COLUMNS
from fleet_import.warehouse.shape import TableMigrationNeeded
from fleet_import.warehouse.sql import (
    REGISTRY_TABLE,
    SQL_TYPES,
    Dialect,
    Statement,
    quote_identifier,
    split_table,
    table_name,
)

_STAMP_LENGTHS = (256, 1024, 36)  # tenant_id, source_scope, ingestion_batch_id (a uuid)
_STRING_TYPE = "character varying"  # a VARCHAR column, as information_schema spells it
TABLE_ATTRIBUTES = 'DISTSTYLE EVEN SORTKEY ("tenant_id", "source_scope")'
"""How a curated table is laid out on the cluster.

SORTKEY (tenant_id, source_scope): every statement a slice runs (the replace's DELETE, the
count that proves it, readers of one tenant) filters on these two; sorted by them, Redshift
skips every block whose zone map lies outside the slice instead of scanning the table.

DISTSTYLE EVEN: rows are dealt round-robin to the cluster's slices. KEY on tenant_id would put
each tenant on one node (tenants differ in size by orders of magnitude: skew, and one node
doing a big tenant's whole load); the datasets share no join column every contract has; ALL
copies every write to every node; AUTO starts small tables as ALL and redistributes them in
the background as they grow, a rewrite we would rather not meet mid-load. Stated, because
changing it later rewrites the table (ALTER DISTSTYLE)."""

TableColumn = tuple[str, str, int | None]
"""(name, data_type, character_maximum_length), as information_schema.columns reports it
(a DECIMAL's data_type with its precision and scale: `numeric(12,2)`)."""

DIALECT = Dialect(
    registry_types={
        "tenant_id": "VARCHAR(256)",
        "source_scope": "VARCHAR(1024)",
        "dataset": "VARCHAR(256)",
        "batch_id": "VARCHAR(36)",
        "target_table": "VARCHAR(512)",
    },
    now="CAST(GETDATE() AS TIMESTAMPTZ)",
    enforces_keys=False,
)


_DECIMAL_TYPE = "numeric({},{})"  # a DECIMAL(p,s), as table_columns_sql spells it


def column_type(column: Column) -> str:
    spec = column.decimal
    if spec is not None:
        return f"DECIMAL({spec[0]},{spec[1]})"
    if column.type != "string":
        return SQL_TYPES[column.type].upper()
    return f"VARCHAR({column.max_bytes})"


def expected_columns(contract: DatasetContract) -> list[TableColumn]:
    """(name, information_schema data_type, width in bytes) of the contract's curated table,
    in order; the width is None for other types than VARCHAR. The columns drift added
    (`evolved_columns`) come after the stamp columns, where ADD COLUMN put them."""
    evolved = set(contract.evolved_columns)
    columns: list[TableColumn] = [
        (c.name, _STRING_TYPE, c.max_bytes)
        if c.type == "string"
        else (c.name, _DECIMAL_TYPE.format(*c.decimal) if c.decimal else SQL_TYPES[c.type], None)
        for c in contract.columns
    ]
    return (
        [column for column in columns if column[0] not in evolved]
        + [
            (name, _STRING_TYPE, length)
            for name, length in zip(STAMP_COLUMNS, _STAMP_LENGTHS, strict=True)
        ]
        + [column for column in columns if column[0] in evolved]
    )


REENCODING = "ZSTD"
"""The encoding a column is given when its own refuses widening (BYTEDICT, RUNLENGTH, TEXT255,
TEXT32K, which ENCODE AUTO, the default of tables created without encodings, may choose for a
low-cardinality VARCHAR such as `status`): ZSTD takes every type and widens in place."""


def reencode_sql(table: str, column: str) -> str:
    """Change a column's compression encoding (AWS ALTER TABLE: "ALTER COLUMN column_name
    ENCODE new_encode_type"; the table stays readable, and its ENCODE AUTO is switched off)."""
    return (
        f"ALTER TABLE {table_name(table)} ALTER COLUMN {quote_identifier(column)} "
        f"ENCODE {REENCODING}"
    )


def widen_sql(contract: DatasetContract, found: Sequence[TableColumn]) -> list[str]:
    """The ALTERs of `widenings`."""
    return [statement for _, statement in widenings(contract, found)]


def widenings(contract: DatasetContract, found: Sequence[TableColumn]) -> list[tuple[str, str]]:
    """(column, ALTER) for each VARCHAR of an existing curated table narrower than the
    contract now allows (a contract that grew). Wider columns are kept: every value fits
    them. Any other difference (names, order, types) no ALTER mends: TableMigrationNeeded,
    naming it.

    Redshift widens a VARCHAR in place (ALTER TABLE ... ALTER COLUMN ... TYPE) but not
    inside a transaction block, and not for some encodings (BYTEDICT, RUNLENGTH, TEXT255,
    TEXT32K): the caller runs these alone and, refused, re-encodes the column first
    (`reencode_sql`)."""
    expected = expected_columns(contract)
    shape = [(name, data_type) for name, data_type, _ in expected]
    # Columns beyond the contract's were added by drift for another delivery
    # (warehouse.evolution): a load that does not name them leaves them NULL.
    found = found[: len(expected)]
    if [(name, data_type) for name, data_type, _ in found] != shape:
        raise TableMigrationNeeded(
            f"table {contract.target_table} does not match dataset {contract.name!r}: has "
            f"{_spelled(found)}, expected {_spelled(expected)}"
        )
    return [
        (
            name,
            f"ALTER TABLE {table_name(contract.target_table)} ALTER COLUMN "
            f"{quote_identifier(name)} TYPE VARCHAR({width})",
        )
        for (name, _, width), (_, _, has) in zip(expected, found, strict=True)
        if width is not None and has is not None and has < width
    ]


def _spelled(columns: Sequence[TableColumn]) -> str:
    return ", ".join(
        f"{name} {data_type}{'' if width is None else f'({width})'}"
        for name, data_type, width in columns
    )


def column_definitions(
    contract: DatasetContract, type_of: Callable[[Column], str] = column_type
) -> list[str]:
    """The contract's columns in order, `"name" TYPE [NOT NULL]`, typed by `type_of`."""
    return [
        f"{quote_identifier(c.name)} {type_of(c)}{'' if c.nullable else ' NOT NULL'}"
        for c in contract.columns
    ]


def create_table_sql(contract: DatasetContract) -> str:
    """The curated table. No keys: Redshift would not enforce them, and slices are found by
    their stamps."""
    stamps = [
        f"{quote_identifier(name)} VARCHAR({length}) NOT NULL"
        for name, length in zip(STAMP_COLUMNS, _STAMP_LENGTHS, strict=True)
    ]
    columns = ", ".join([*column_definitions(contract), *stamps])
    return (
        f"CREATE TABLE IF NOT EXISTS {table_name(contract.target_table)} ({columns}) "
        f"{TABLE_ATTRIBUTES}"
    )


def table_columns_sql(schema: str, relation: str) -> Statement:
    return (
        # A DECIMAL's precision and scale are part of its type: a table of another
        # precision would round or refuse what the contract allows.
        "SELECT column_name, CASE WHEN data_type = 'numeric' THEN 'numeric(' || "
        "CAST(numeric_precision AS VARCHAR) || ',' || CAST(numeric_scale AS VARCHAR) || ')' "
        "ELSE data_type END, character_maximum_length FROM information_schema.columns "
        "WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position",
        [schema, relation],
    )


def registry_exists_sql() -> Statement:
    return (
        "SELECT COUNT(*) FROM information_schema.tables "
        "WHERE table_schema = %s AND table_name = %s",
        list(split_table(REGISTRY_TABLE)),
    )
