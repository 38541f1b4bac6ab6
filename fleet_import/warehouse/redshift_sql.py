"""SQL of the Redshift warehouse: pure functions returning (text, positional parameters).

Identifiers are validated by the contracts and quoted here; values are always `%s`
parameters (redshift_connector's `format` paramstyle), except the COPY source and IAM role,
which Redshift accepts only as literals: they are quoted here, and the role is an ARN, never
a credential. Everything except COPY and GETDATE() is also valid PostgreSQL, so the test
emulator only rewrites those two.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from fleet_import.contracts import Column, DatasetContract
from fleet_import.warehouse.base import STAMP_COLUMNS

REGISTRY_TABLE = "curated.ingestion_slices"
VARCHAR_MAX_BYTES = 65535
_BYTES_PER_CHAR = 4  # Redshift VARCHAR lengths are bytes; UTF-8 needs up to 4 per character
_STAMP_LENGTHS = (256, 1024, 36)  # tenant_id, source_scope, ingestion_batch_id (a uuid)

RS_TYPES: Mapping[str, str] = {
    "int64": "BIGINT",
    "float64": "DOUBLE PRECISION",
    "bool": "BOOLEAN",
    "timestamptz": "TIMESTAMPTZ",
    "date": "DATE",
}
"""Contract column type -> Redshift type (strings are VARCHAR, see `column_type`)."""

Statement = tuple[str, list[object]]


def quote_identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def table_name(target_table: str) -> str:
    """`schema.table` -> `"schema"."table"`; a bare name (temp tables) is quoted alone."""
    return ".".join(quote_identifier(part) for part in target_table.split(".", 1))


def quote_literal(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


def column_type(column: Column) -> str:
    if column.type != "string":
        return RS_TYPES[column.type]
    if column.max_length is None:
        return f"VARCHAR({VARCHAR_MAX_BYTES})"
    return f"VARCHAR({min(column.max_length * _BYTES_PER_CHAR, VARCHAR_MAX_BYTES)})"


def expected_columns(contract: DatasetContract) -> list[tuple[str, str]]:
    """(name, information_schema data_type) of the contract's curated table, in order."""
    spelled = {
        "string": "character varying",
        "int64": "bigint",
        "float64": "double precision",
        "bool": "boolean",
        "timestamptz": "timestamp with time zone",
        "date": "date",
    }
    return [(c.name, spelled[c.type]) for c in contract.columns] + [
        (name, "character varying") for name in STAMP_COLUMNS
    ]


def _column_definitions(contract: DatasetContract, *, stamps: bool) -> list[str]:
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


def create_schema_sql(schema: str) -> str:
    return f"CREATE SCHEMA IF NOT EXISTS {quote_identifier(schema)}"


def create_table_sql(contract: DatasetContract) -> str:
    """The curated table. No keys: Redshift would not enforce them, and slices are found by
    their stamps."""
    columns = ", ".join(_column_definitions(contract, stamps=True))
    return f"CREATE TABLE IF NOT EXISTS {table_name(contract.target_table)} ({columns})"


def create_registry_sql() -> str:
    return (
        f"CREATE TABLE IF NOT EXISTS {table_name(REGISTRY_TABLE)} ("
        '"tenant_id" VARCHAR(256) NOT NULL, "source_scope" VARCHAR(1024) NOT NULL, '
        '"dataset" VARCHAR(256) NOT NULL, "batch_id" VARCHAR(36) NOT NULL, '
        '"row_count" BIGINT NOT NULL, "committed_at" TIMESTAMPTZ NOT NULL, '
        '"target_table" VARCHAR(512) NOT NULL)'
    )


def table_columns_sql(schema: str, relation: str) -> Statement:
    return (
        "SELECT column_name, data_type FROM information_schema.columns "
        "WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position",
        [schema, relation],
    )


def staging_table(contract: DatasetContract, purpose: str = "stage") -> str:
    return f"fleet_{purpose}_{contract.name}"


def create_staging_sql(contract: DatasetContract) -> str:
    """A session temp table with the contract's columns only, in order: what COPY fills
    from the staged Parquet by position."""
    columns = ", ".join(_column_definitions(contract, stamps=False))
    return f"CREATE TEMP TABLE {table_name(staging_table(contract))} ({columns})"


def create_keys_sql(contract: DatasetContract) -> str:
    keys = {c.name: c for c in contract.columns}
    columns = ", ".join(
        f"{quote_identifier(k)} {column_type(keys[k])}" for k in contract.natural_key
    )
    return f"CREATE TEMP TABLE {table_name(staging_table(contract, 'discard'))} ({columns})"


def drop_table_sql(name: str) -> str:
    return f"DROP TABLE {table_name(name)}"


def copy_sql(table: str, manifest_uri: str, iam_role: str) -> str:
    """COPY from a manifest of Parquet files. Authorised by IAM_ROLE alone: no key, secret
    or token ever enters the statement."""
    return (
        f"COPY {table_name(table)} FROM {quote_literal(manifest_uri)} "
        f"IAM_ROLE {quote_literal(iam_role)} FORMAT AS PARQUET MANIFEST"
    )


def delete_slice_sql(
    target_table: str, tenant_id: str, source_scope: str, owners: Sequence[str]
) -> Statement:
    """A slice's rows all carry its registered batch id (one transaction writes both)."""
    batch = quote_identifier(STAMP_COLUMNS[2])
    tenant, scope = (quote_identifier(c) for c in STAMP_COLUMNS[:2])
    placeholders = ", ".join(["%s"] * len(owners))
    return (
        f"DELETE FROM {table_name(target_table)} WHERE {batch} IN ({placeholders}) "
        f"AND {tenant} = %s AND {scope} = %s",
        [*owners, tenant_id, source_scope],
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


def delete_keys_sql(
    contract: DatasetContract, tenant_id: str, source_scope: str, batch_id: str
) -> Statement:
    """Delete this batch's rows whose natural key is in the discard table. Redshift's
    DELETE ... USING takes no alias, so columns are qualified by table name."""
    target = table_name(contract.target_table)
    keys = table_name(staging_table(contract, "discard"))
    match = " AND ".join(
        f"{target}.{quote_identifier(k)} = {keys}.{quote_identifier(k)}"
        for k in contract.natural_key
    )
    tenant, scope, batch = (f"{target}.{quote_identifier(c)}" for c in STAMP_COLUMNS)
    return (
        f"DELETE FROM {target} USING {keys} WHERE {match} "
        f"AND {batch} = %s AND {tenant} = %s AND {scope} = %s",
        [batch_id, tenant_id, source_scope],
    )


def count_slice_sql(target_table: str, tenant_id: str, source_scope: str, owner: str) -> Statement:
    tenant, scope, batch = (quote_identifier(c) for c in STAMP_COLUMNS)
    return (
        f"SELECT COUNT(*) FROM {table_name(target_table)} "
        f"WHERE {batch} = %s AND {tenant} = %s AND {scope} = %s",
        [owner, tenant_id, source_scope],
    )


def registered_slices_sql(tenant_id: str, source_scope: str) -> Statement:
    return (
        f"SELECT dataset, target_table, batch_id FROM {table_name(REGISTRY_TABLE)} "
        "WHERE tenant_id = %s AND source_scope = %s ORDER BY dataset",
        [tenant_id, source_scope],
    )


def forget_slices_sql(tenant_id: str, source_scope: str) -> Statement:
    """Redshift has no ON CONFLICT: the scope's registry rows are deleted and re-inserted
    inside the slice's transaction."""
    return (
        f"DELETE FROM {table_name(REGISTRY_TABLE)} WHERE tenant_id = %s AND source_scope = %s",
        [tenant_id, source_scope],
    )


def register_slice_sql(
    tenant_id: str,
    source_scope: str,
    dataset: str,
    batch_id: str,
    row_count: int,
    target_table: str,
) -> Statement:
    return (
        f"INSERT INTO {table_name(REGISTRY_TABLE)} "
        "(tenant_id, source_scope, dataset, batch_id, row_count, committed_at, target_table) "
        "VALUES (%s, %s, %s, %s, %s, CAST(GETDATE() AS TIMESTAMPTZ), %s)",
        [tenant_id, source_scope, dataset, batch_id, row_count, target_table],
    )


def registry_exists_sql() -> Statement:
    schema, relation = REGISTRY_TABLE.split(".")
    return (
        "SELECT COUNT(*) FROM information_schema.tables "
        "WHERE table_schema = %s AND table_name = %s",
        [schema, relation],
    )


def session_identity_sql() -> str:
    """This session's process id and start time (STV_SESSIONS), which name it uniquely."""
    return "SELECT process, starttime FROM stv_sessions WHERE process = pg_backend_pid()"


def end_session_sql(pid: int, started: str) -> Statement:
    """Terminate that session if it is still the one that started then (PG_TERMINATE_BACKEND:
    its transaction rolls back and its table locks are released)."""
    return (
        "SELECT pg_terminate_backend(process) FROM stv_sessions "
        "WHERE process = %s AND starttime = %s::timestamp",
        [int(pid), started],
    )
