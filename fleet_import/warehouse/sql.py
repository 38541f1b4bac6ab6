"""SQL the two warehouse dialects write alike, built once: identifier quoting, the slice
registry (one DDL, each dialect's type names substituted), the stamp filter that finds a
slice's rows, and the statements that delete, count and register slices.

Pure functions returning (text, parameters) with `%s` placeholders, which both psycopg and
redshift_connector take. Identifiers are validated by the contracts and quoted here the way
both dialects quote them; values are always parameters.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from fleet_import.contracts.model import DatasetContract
from fleet_import.warehouse.base import STAMP_COLUMNS

Statement = tuple[str, Sequence[object] | Mapping[str, object]]
"""(text, parameters) as a DB-API `execute` takes them."""

REGISTRY_TABLE = "curated.ingestion_slices"

SQL_TYPES: Mapping[str, str] = {
    "int64": "bigint",
    "float64": "double precision",
    "bool": "boolean",
    "timestamptz": "timestamp with time zone",
    "date": "date",
}
"""Contract column type -> SQL type, as PostgreSQL's format_type() and information_schema
(Redshift's too) spell it. Strings are each dialect's own (text, VARCHAR(n))."""

_REGISTRY_KEY = ("tenant_id", "source_scope", "dataset")
_REGISTRY_COLUMNS = (*_REGISTRY_KEY, "batch_id", "row_count", "committed_at", "target_table")


@dataclass(frozen=True)
class Dialect:
    """What the warehouses spell differently in the statements they share."""

    registry_types: Mapping[str, str]
    """Type of each registry column that holds text or a batch id (see `create_registry_sql`)."""
    now: str
    """The current time, as the dialect writes it in an INSERT."""
    enforces_keys: bool
    """PostgreSQL enforces a primary key, so the registry has one and registering upserts;
    Redshift would not enforce it, so a slice's registry rows are deleted and re-inserted."""


def quote_identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def table_name(target_table: str) -> str:
    """`schema.table` -> `"schema"."table"`; a bare name (temp tables) is quoted alone."""
    return ".".join(quote_identifier(part) for part in target_table.split(".", 1))


def split_table(target_table: str) -> tuple[str, str]:
    schema, _, relation = target_table.partition(".")
    return schema, relation


def _columns(names: Iterable[str], qualifier: str = "") -> str:
    return ", ".join(qualifier + quote_identifier(name) for name in names)


# -- schemas and the slice registry ------------------------------------------------------


def create_schema_sql(schema: str) -> str:
    return f"CREATE SCHEMA IF NOT EXISTS {quote_identifier(schema)}"


def schemas_of(contracts: Iterable[DatasetContract]) -> set[str]:
    """The registry's schema and every curated table's."""
    return {split_table(REGISTRY_TABLE)[0], *(split_table(c.target_table)[0] for c in contracts)}


def create_schemas_sql(contracts: Iterable[DatasetContract]) -> list[str]:
    """The registry's schema and every curated table's, each once, in a fixed order."""
    return [create_schema_sql(schema) for schema in sorted(schemas_of(contracts))]


def existing_schemas_sql(schemas: Iterable[str]) -> Statement:
    """Which of `schemas` exist (pg_namespace: PostgreSQL's catalog and Redshift's), whatever
    the user may do in them: a user without CREATE on the database asks before creating."""
    names = sorted(schemas)
    return (
        f"SELECT nspname FROM pg_namespace WHERE nspname IN ({', '.join(['%s'] * len(names))})",
        names,
    )


def create_registry_sql(dialect: Dialect) -> str:
    """One row per (tenant, scope, dataset): the batch whose stamp the slice carries now.
    `target_table` records where the dataset's rows live, so that a later batch without
    this dataset can still delete them."""
    types = {"row_count": "BIGINT", "committed_at": "TIMESTAMPTZ", **dialect.registry_types}
    columns = [f"{quote_identifier(c)} {types[c]} NOT NULL" for c in _REGISTRY_COLUMNS]
    if dialect.enforces_keys:
        columns.append(f"PRIMARY KEY ({_columns(_REGISTRY_KEY)})")
    return f"CREATE TABLE IF NOT EXISTS {table_name(REGISTRY_TABLE)} ({', '.join(columns)})"


def _scope_filter(tenant_id: str, source_scope: str) -> Statement:
    return "tenant_id = %s AND source_scope = %s", [tenant_id, source_scope]


def registered_slices_sql(
    tenant_id: str, source_scope: str, *, for_update: bool = False
) -> Statement:
    """(dataset, target_table, batch_id) of the scope's registered datasets. `for_update`
    (PostgreSQL only) holds the rows until the slice's transaction ends."""
    where, params = _scope_filter(tenant_id, source_scope)
    lock = " FOR UPDATE" if for_update else ""
    return (
        f"SELECT dataset, target_table, batch_id FROM {table_name(REGISTRY_TABLE)} "
        f"WHERE {where} ORDER BY dataset{lock}",
        params,
    )


def registered_counts_sql(tenant_id: str, source_scope: str) -> Statement:
    """(dataset, row_count) of the scope's registered datasets: what the slice holds, as its
    commit recorded it, without counting the curated tables (slice guards compare with it)."""
    where, params = _scope_filter(tenant_id, source_scope)
    return (
        f"SELECT dataset, row_count FROM {table_name(REGISTRY_TABLE)} "
        f"WHERE {where} ORDER BY dataset",
        params,
    )


def registry_rows_sql(tenant_id: str | None = None) -> Statement:
    """Every registry row (one per tenant, scope and dataset), or one tenant's: what
    `fleet-import slices list` shows. Ordered so that a slice's datasets come together."""
    where, params = ("WHERE tenant_id = %s ", [tenant_id]) if tenant_id is not None else ("", [])
    return (
        "SELECT tenant_id, source_scope, dataset, batch_id, row_count, committed_at "
        f"FROM {table_name(REGISTRY_TABLE)} {where}"
        "ORDER BY tenant_id, source_scope, dataset",
        params,
    )


def forget_slices_sql(tenant_id: str, source_scope: str, dataset: str | None = None) -> Statement:
    """The scope's registry rows, or only one dataset's."""
    where, params = _scope_filter(tenant_id, source_scope)
    if dataset is not None:
        where, params = f"{where} AND dataset = %s", [*params, dataset]
    return f"DELETE FROM {table_name(REGISTRY_TABLE)} WHERE {where}", params


def register_slice_sql(
    dialect: Dialect,
    tenant_id: str,
    source_scope: str,
    dataset: str,
    batch_id: object,
    row_count: int,
    target_table: str,
) -> Statement:
    """Stamp the dataset's slice with `batch_id`. Where keys are enforced, an existing row is
    updated in place; elsewhere the caller forgets the scope's rows first."""
    text = (
        f"INSERT INTO {table_name(REGISTRY_TABLE)} ({_columns(_REGISTRY_COLUMNS)}) "
        f"VALUES (%s, %s, %s, %s, %s, {dialect.now}, %s)"
    )
    if dialect.enforces_keys:
        updated = [c for c in _REGISTRY_COLUMNS if c not in _REGISTRY_KEY]
        text += f" ON CONFLICT ({_columns(_REGISTRY_KEY)}) DO UPDATE SET " + ", ".join(
            f"{quote_identifier(c)} = EXCLUDED.{quote_identifier(c)}" for c in updated
        )
    return text, [tenant_id, source_scope, dataset, batch_id, row_count, target_table]


def register_slices_sql(
    dialect: Dialect,
    tenant_id: str,
    source_scope: str,
    batch_id: object,
    datasets: Mapping[str, tuple[int, str]],
    registered: Iterable[str],
) -> list[Statement]:
    """Stamp every dataset of the slice ({dataset: (rows, target table)}) with `batch_id`,
    and forget the `registered` datasets that left it. Where keys are enforced the rows are
    upserted and only the leavers deleted; elsewhere the scope's rows are deleted and
    inserted again, in the slice's transaction."""
    scope = (tenant_id, source_scope)
    stamps = [
        register_slice_sql(dialect, *scope, dataset, batch_id, rows, table)
        for dataset, (rows, table) in datasets.items()
    ]
    if not dialect.enforces_keys:
        return [forget_slices_sql(*scope), *stamps]
    leavers = sorted(set(registered) - datasets.keys())
    return [*stamps, *(forget_slices_sql(*scope, dataset) for dataset in leavers)]


# -- slices --------------------------------------------------------------------------------


def stamp_filter(
    tenant_id: str, source_scope: str, batch_ids: Sequence[object], qualifier: str = ""
) -> Statement:
    """The rows the stamp columns place in the scope's slice under one of `batch_ids`. The
    batch id comes first: curated tables are indexed on it (see postgres.ddl)."""
    tenant, scope, batch = (f"{qualifier}{quote_identifier(c)}" for c in STAMP_COLUMNS)
    test = "= %s" if len(batch_ids) == 1 else f"IN ({', '.join(['%s'] * len(batch_ids))})"
    return (
        f"{batch} {test} AND {tenant} = %s AND {scope} = %s",
        [*batch_ids, tenant_id, source_scope],
    )


def delete_slice_sql(
    target_table: str, tenant_id: str, source_scope: str, owners: Sequence[object]
) -> Statement:
    """A slice's rows all carry its registered batch id (one transaction writes both)."""
    where, params = stamp_filter(tenant_id, source_scope, owners)
    return f"DELETE FROM {table_name(target_table)} WHERE {where}", params


def count_slice_sql(
    target_table: str, tenant_id: str, source_scope: str, owner: object
) -> Statement:
    where, params = stamp_filter(tenant_id, source_scope, [owner])
    return f"SELECT COUNT(*) FROM {table_name(target_table)} WHERE {where}", params


def staging_table(contract: DatasetContract, purpose: str = "stage") -> str:
    """A session temp table of the slice's transaction (not schema-qualified)."""
    return f"fleet_{purpose}_{contract.name}"


def delete_keys_sql(
    contract: DatasetContract, tenant_id: str, source_scope: str, batch_id: object
) -> Statement:
    """Delete this batch's rows whose natural key is in the discard table. Columns are
    qualified by table name: Redshift's DELETE ... USING takes no alias."""
    target = table_name(contract.target_table)
    keys = table_name(staging_table(contract, "discard"))
    match = " AND ".join(
        f"{target}.{quote_identifier(k)} = {keys}.{quote_identifier(k)}"
        for k in contract.natural_key
    )
    where, params = stamp_filter(tenant_id, source_scope, [batch_id], qualifier=f"{target}.")
    return f"DELETE FROM {target} USING {keys} WHERE {match} AND {where}", params


def drop_table_sql(name: str) -> str:
    return f"DROP TABLE {table_name(name)}"
