"""Redshift types and table definitions: curated tables without keys (Redshift would not
enforce them; slices are found by their stamps), strings as VARCHAR sized in bytes. The
registry's DDL is the shared one (warehouse.sql) in Redshift types."""

from __future__ import annotations

from fleet_import.contracts import Column, DatasetContract
from fleet_import.warehouse.base import STAMP_COLUMNS
from fleet_import.warehouse.sql import (
    REGISTRY_TABLE,
    SQL_TYPES,
    Dialect,
    Statement,
    quote_identifier,
    split_table,
    table_name,
)

VARCHAR_MAX_BYTES = 65535
_BYTES_PER_CHAR = 4  # Redshift VARCHAR lengths are bytes; UTF-8 needs up to 4 per character
_STAMP_LENGTHS = (256, 1024, 36)  # tenant_id, source_scope, ingestion_batch_id (a uuid)
_STRING_TYPE = "character varying"  # a VARCHAR column, as information_schema spells it

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


def column_type(column: Column) -> str:
    if column.type != "string":
        return SQL_TYPES[column.type].upper()
    if column.max_length is None:
        return f"VARCHAR({VARCHAR_MAX_BYTES})"
    return f"VARCHAR({min(column.max_length * _BYTES_PER_CHAR, VARCHAR_MAX_BYTES)})"


def expected_columns(contract: DatasetContract) -> list[tuple[str, str]]:
    """(name, information_schema data_type) of the contract's curated table, in order."""
    spelled = [_STRING_TYPE if c.type == "string" else SQL_TYPES[c.type] for c in contract.columns]
    return [*zip(contract.column_names, spelled, strict=True)] + [
        (name, _STRING_TYPE) for name in STAMP_COLUMNS
    ]


def column_definitions(contract: DatasetContract, *, stamps: bool) -> list[str]:
    columns = [
        f"{quote_identifier(c.name)} {column_type(c)}{'' if c.nullable else ' NOT NULL'}"
        for c in contract.columns
    ]
    if stamps:
        columns += [
            f"{quote_identifier(name)} VARCHAR({length}) NOT NULL"
            for name, length in zip(STAMP_COLUMNS, _STAMP_LENGTHS, strict=True)
        ]
    return columns


def create_table_sql(contract: DatasetContract) -> str:
    """The curated table. No keys: Redshift would not enforce them, and slices are found by
    their stamps."""
    columns = ", ".join(column_definitions(contract, stamps=True))
    return f"CREATE TABLE IF NOT EXISTS {table_name(contract.target_table)} ({columns})"


def table_columns_sql(schema: str, relation: str) -> Statement:
    return (
        "SELECT column_name, data_type FROM information_schema.columns "
        "WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position",
        [schema, relation],
    )


def registry_exists_sql() -> Statement:
    return (
        "SELECT COUNT(*) FROM information_schema.tables "
        "WHERE table_schema = %s AND table_name = %s",
        list(split_table(REGISTRY_TABLE)),
    )
