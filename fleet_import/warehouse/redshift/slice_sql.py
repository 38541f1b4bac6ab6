"""SQL only Redshift's slices run: session temp tables that COPY fills from staged Parquet on
S3 (timestamps in them as TIMESTAMP, read as UTC), the LOCK that opens the slice's short
write transaction, and the insert that stamps the temp tables' rows into the curated tables.
Deletes, counts and the registry are the shared ones (warehouse.sql).

Values are `%s` parameters (redshift_connector's `format` paramstyle), except the COPY
source and IAM role, which Redshift accepts only as literals: they are quoted here, and the
role is an ARN, never a credential. Everything except COPY and GETDATE() is also valid
PostgreSQL, so the test emulator only rewrites those two.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from fleet_import.contracts.model import Column, DatasetContract
from fleet_import.warehouse.base import STAMP_COLUMNS
from fleet_import.warehouse.redshift.ddl import column_definitions, column_type
from fleet_import.warehouse.sql import Statement, quote_identifier, staging_table, table_name

SESSION_UTC_SQL = "SET timezone TO 'UTC'"
"""The slice's session reads the temp tables' TIMESTAMPs as UTC when it casts them."""

QUERY_GROUP_MAX = 320
"""Redshift keeps a query group this long in SYS_QUERY_HISTORY.query_label (STL_QUERY and
SVL_QLOG cut it to 30 characters: a batch id's first 30 still start with its unique
sequence number)."""


def query_group_sql(batch_id: str) -> str:
    """Every statement of the slice's session runs under its batch's id as query group, so
    SYS_QUERY_HISTORY attributes the cluster's seconds to the batch, hence to its tenant."""
    return f"SET query_group TO {quote_literal(batch_id[:QUERY_GROUP_MAX])}"


def query_seconds_sql(labels: Sequence[str]) -> Statement:
    """The seconds Redshift spent on each query group among `labels` (elapsed_time is in
    microseconds; query_label is blank-padded CHAR)."""
    marks = ", ".join(["%s"] * len(labels))
    return (
        "SELECT TRIM(query_label), SUM(elapsed_time) FROM sys_query_history "
        f"WHERE TRIM(query_label) IN ({marks}) GROUP BY 1",
        list(labels),
    )


def quote_literal(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


def _staging_type(column: Column) -> str:
    """TIMESTAMP for a timestamptz column: COPY loads Parquet's UTC timestamps into it as
    they are; the stamped insert casts them to TIMESTAMPTZ in the session's zone, UTC."""
    return "TIMESTAMP" if column.type == "timestamptz" else column_type(column)


def create_staging_sql(contract: DatasetContract) -> str:
    """A session temp table with the contract's columns only, in order: what COPY fills
    from the staged Parquet by position."""
    columns = ", ".join(column_definitions(contract, _staging_type))
    return f"CREATE TEMP TABLE {table_name(staging_table(contract))} ({columns})"


def create_keys_sql(contract: DatasetContract) -> str:
    """The discard table: the natural key's columns, typed as the curated table's."""
    keys = {c.name: c for c in contract.columns}
    columns = ", ".join(
        f"{quote_identifier(k)} {column_type(keys[k])}" for k in contract.natural_key
    )
    return f"CREATE TEMP TABLE {table_name(staging_table(contract, 'discard'))} ({columns})"


def copy_sql(table: str, manifest_uri: str, iam_role: str) -> str:
    """COPY from a manifest of Parquet files. Authorised by IAM_ROLE alone: no key, secret
    or token ever enters the statement."""
    return (
        f"COPY {table_name(table)} FROM {quote_literal(manifest_uri)} "
        f"IAM_ROLE {quote_literal(iam_role)} FORMAT AS PARQUET MANIFEST"
    )


def discard_staged_sql(contract: DatasetContract) -> str:
    """Delete the staged rows whose natural key is in the discard table. Columns are
    qualified by table name: Redshift's DELETE ... USING takes no alias."""
    staged = table_name(staging_table(contract))
    keys = table_name(staging_table(contract, "discard"))
    match = " AND ".join(
        f"{staged}.{quote_identifier(k)} = {keys}.{quote_identifier(k)}"
        for k in contract.natural_key
    )
    return f"DELETE FROM {staged} USING {keys} WHERE {match}"


def lock_sql(tables: Iterable[str]) -> str:
    """LOCK the tables in one fixed global order (sorted names), so that two slices never
    wait for each other's locks in a cycle (AWS: "Potential deadlock situation for
    concurrent write transactions")."""
    return "LOCK " + ", ".join(table_name(t) for t in sorted(set(tables)))


def insert_stamped_sql(
    contract: DatasetContract, tenant_id: str, source_scope: str, batch_id: str
) -> Statement:
    columns = [quote_identifier(c) for c in contract.column_names]
    values = [
        f"CAST({quote_identifier(c.name)} AS TIMESTAMPTZ)"
        if c.type == "timestamptz"
        else quote_identifier(c.name)
        for c in contract.columns
    ]
    stamps = ", ".join(quote_identifier(c) for c in STAMP_COLUMNS)
    return (
        f"INSERT INTO {table_name(contract.target_table)} ({', '.join(columns)}, {stamps}) "
        f"SELECT {', '.join(values)}, %s, %s, %s FROM {table_name(staging_table(contract))}",
        [tenant_id, source_scope, batch_id],
    )
