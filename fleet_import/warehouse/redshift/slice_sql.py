"""SQL only Redshift's slices run: session temp tables that COPY fills from staged Parquet on
S3, and the insert that stamps their rows into the curated table. Deletes, counts and the
registry are the shared ones (warehouse.sql).

Values are `%s` parameters (redshift_connector's `format` paramstyle), except the COPY
source and IAM role, which Redshift accepts only as literals: they are quoted here, and the
role is an ARN, never a credential. Everything except COPY and GETDATE() is also valid
PostgreSQL, so the test emulator only rewrites those two.
"""

from __future__ import annotations

from fleet_import.contracts import DatasetContract
from fleet_import.warehouse.base import STAMP_COLUMNS
from fleet_import.warehouse.redshift.ddl import column_definitions, column_type
from fleet_import.warehouse.sql import Statement, quote_identifier, staging_table, table_name


def quote_literal(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


def create_staging_sql(contract: DatasetContract) -> str:
    """A session temp table with the contract's columns only, in order: what COPY fills
    from the staged Parquet by position."""
    columns = ", ".join(column_definitions(contract, stamps=False))
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


def insert_stamped_sql(
    contract: DatasetContract, tenant_id: str, source_scope: str, batch_id: str
) -> Statement:
    columns = [quote_identifier(c) for c in contract.column_names]
    stamps = ", ".join(quote_identifier(c) for c in STAMP_COLUMNS)
    return (
        f"INSERT INTO {table_name(contract.target_table)} ({', '.join(columns)}, {stamps}) "
        f"SELECT {', '.join(columns)}, %s, %s, %s FROM {table_name(staging_table(contract))}",
        [tenant_id, source_scope, batch_id],
    )
