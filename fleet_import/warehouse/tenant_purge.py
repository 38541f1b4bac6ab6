"""Every row a tenant has in a warehouse database, deleted in one transaction: its rows in
each curated table (by the `tenant_id` stamp, so rows no registry row names go too) and its
slice-registry rows. Readers see the tenant's slices whole until the commit, then none.

Statements are built here, as `warehouse.sql` builds the slice ones; identifiers are
quoted, the tenant id is always a parameter.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fleet_import.contracts.model import DatasetContract
from fleet_import.warehouse.committer import Cursor, SliceCommitter, run
from fleet_import.warehouse.sql import REGISTRY_TABLE, Statement, quote_identifier, table_name


@dataclass(frozen=True)
class RemovedRows:
    """What a tenant's purge took out of one warehouse database."""

    slices: list[dict[str, Any]] = field(default_factory=list)  # the registry rows, as read
    rows: dict[str, int] = field(default_factory=dict)  # table -> rows deleted
    registry_rows: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"slices": self.slices, "rows": self.rows, "registry_rows": self.registry_rows}


def tenant_slices_sql(tenant_id: str) -> Statement:
    return (
        "SELECT source_scope, dataset, target_table, batch_id, row_count "
        f"FROM {table_name(REGISTRY_TABLE)} WHERE tenant_id = %s "
        "ORDER BY source_scope, dataset",
        [tenant_id],
    )


def delete_tenant_rows_sql(target_table: str, tenant_id: str) -> Statement:
    return (
        f"DELETE FROM {table_name(target_table)} WHERE {quote_identifier('tenant_id')} = %s",
        [tenant_id],
    )


def forget_tenant_sql(tenant_id: str) -> Statement:
    return f"DELETE FROM {table_name(REGISTRY_TABLE)} WHERE tenant_id = %s", [tenant_id]


def purge_tenant_rows(
    warehouse: SliceCommitter, tenant_id: str, contracts: Iterable[DatasetContract]
) -> RemovedRows:
    """Delete the tenant's rows from the contracts' tables and every table its registry rows
    name, and its registry rows, in one transaction of `warehouse`."""
    contracts = list(contracts)
    warehouse.ensure_tables(contracts)  # so every table (and the registry) exists

    def work(cursor: Cursor) -> RemovedRows:
        slices = [
            {
                "source_scope": scope,
                "dataset": dataset,
                "target_table": table,
                "batch_id": str(batch_id),
                "row_count": int(count),
            }
            for scope, dataset, table, batch_id, count in run(
                cursor, tenant_slices_sql(tenant_id)
            ).fetchall()
        ]
        named = {s["target_table"] for s in slices}
        tables = sorted(named | {c.target_table for c in contracts})
        rows = {
            table: max(run(cursor, delete_tenant_rows_sql(table, tenant_id)).rowcount, 0)
            for table in tables
        }
        forgotten = max(run(cursor, forget_tenant_sql(tenant_id)).rowcount, 0)
        return RemovedRows(slices, rows, forgotten)

    return warehouse._in_transaction(work)  # noqa: SLF001 - the backends' one transaction
