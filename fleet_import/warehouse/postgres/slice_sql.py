"""SQL only PostgreSQL's slices run: binary COPY straight into the curated table (stamped in
the stream), the discard table filled the same way, and the static statements of
queries.sql. Deletes, counts and the registry are the shared ones (warehouse.sql)."""

from __future__ import annotations

from psycopg import sql

from fleet_import.contracts.model import DatasetContract
from fleet_import.sqlfiles import load_queries
from fleet_import.warehouse.base import STAMP_COLUMNS
from fleet_import.warehouse.postgres.ddl import table_identifier
from fleet_import.warehouse.sql import REGISTRY_TABLE, Statement, split_table, staging_table

QUERIES = load_queries("fleet_import.warehouse.postgres", "queries.sql")
# First keys of the two-key advisory locks (lock_ddl, lock_scope), so ours never meet
# another component's.
DDL_LOCK_CLASS = 0x46574844  # "FWHD"
SCOPE_LOCK_CLASS = 0x46575343  # "FWSC"


def copy_sql(contract: DatasetContract) -> sql.Composed:
    columns = [*contract.column_names, *STAMP_COLUMNS]
    return sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
        table_identifier(contract.target_table),
        sql.SQL(", ").join(map(sql.Identifier, columns)),
    )


def create_keys_sql(contract: DatasetContract) -> sql.Composed:
    """The discard table: the natural key's columns, typed as the curated table's."""
    return sql.SQL("CREATE TEMP TABLE {} ON COMMIT DROP AS SELECT {} FROM {} WITH NO DATA").format(
        sql.Identifier(staging_table(contract, "discard")),
        sql.SQL(", ").join(map(sql.Identifier, contract.natural_key)),
        table_identifier(contract.target_table),
    )


def copy_keys_sql(contract: DatasetContract) -> sql.Composed:
    return sql.SQL("COPY {} FROM STDIN (FORMAT BINARY)").format(
        sql.Identifier(staging_table(contract, "discard"))
    )


def relation_exists_sql(schema: str, relation: str) -> Statement:
    return QUERIES["relation_exists"], {"schema": schema, "relation": relation}


def registry_exists_sql() -> Statement:
    return relation_exists_sql(*split_table(REGISTRY_TABLE))
