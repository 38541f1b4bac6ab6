"""What `fleet-import slices list` reads and prints: the slice registry of every warehouse
database the settings name (the shared one, and each tenant's own), as a table or JSON.

The registry lives in the warehouse, beside the rows it stamps (fleet_import.tenants.
databases): a tenant with its own database has its slices listed from there. Every value
from data is a `Text`, never markup.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rich.table import Column, Table
from rich.text import Text

from fleet_cli.batch_views import SHORT_ID_LENGTH
from fleet_import.config import Settings
from fleet_import.scope import folder_of_scope

if TYPE_CHECKING:  # pyarrow and the drivers: only the command itself needs them
    from fleet_import.warehouse.committer import RegisteredSlice

NO_KNOWN_DATABASE = (
    "the warehouse names a database per tenant ({database}) and no tenant registry lists "
    "the tenants: give --tenant"
)
LOAD_ONE = "`fleet-import run --tenant TENANT FOLDER` loads one"


@dataclass(frozen=True)
class ListedSlice:
    """A registered slice and the warehouse database it was read from (None: the shared
    one, when its name is not known)."""

    slice: RegisteredSlice
    database: str | None


def registry_databases(settings: Settings, tenant: str | None) -> list[str | None]:
    """The warehouse databases whose registries hold the slices asked for (None: the shared
    one): the tenant's, or the shared one and each registered tenant's own, each once."""
    from fleet_cli.tables import chosen_database
    from fleet_import.tenants.databases import own_database, shared_database, templated
    from fleet_import.tenants.registry import registry_in_force

    if tenant is not None:
        return [chosen_database(settings, tenant, None)]
    registry = registry_in_force(settings.tenants)
    shared = None if templated(settings) else shared_database(settings)
    own = {own_database(settings, t, registry) for t in registry.tenants} if registry else set()
    databases: list[str | None] = [] if templated(settings) else [None]
    databases += sorted(name for name in own if name is not None and name != shared)
    return databases


def read_slices(settings: Settings, tenant: str | None) -> list[ListedSlice] | None:
    """The slices of every database `registry_databases` names; None when it names none."""
    from fleet_cli.tables import database_warehouse
    from fleet_import.tenants.databases import shared_database

    databases = registry_databases(settings, tenant)
    if not databases:
        return None
    listed = []
    for database in databases:
        warehouse = database_warehouse(settings, database)
        name = database or shared_database(settings)
        listed += [
            ListedSlice(s, name)
            for s in warehouse.slice_registry(tenant)  # type: ignore[attr-defined]
        ]
    return sorted(listed, key=lambda s: (s.slice.tenant_id, s.slice.source_scope))


def rows_text(row_counts: Mapping[str, int]) -> str:
    """Rows per dataset, one dataset a line: `trips 5,003`."""
    return "\n".join(f"{dataset} {rows:,}" for dataset, rows in sorted(row_counts.items()))


def _loaded(at: dt.datetime) -> str:
    return at.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M")


def slices_table(slices: Sequence[ListedSlice]) -> Table:
    """One row per slice; the whole folder (what `slices rollback` takes) wraps, never cut."""
    table = Table(
        "tenant",
        Column("folder", overflow="fold"),
        "batch",
        "rows",
        Column("loaded UTC", no_wrap=True),
        box=None,
        pad_edge=False,
        header_style="bold",
    )
    for listed in slices:
        s = listed.slice
        table.add_row(
            Text(s.tenant_id),
            Text(folder_of_scope(s.source_scope)),
            Text(str(s.batch_id)[:SHORT_ID_LENGTH]),
            Text(rows_text(s.row_counts)),
            Text(_loaded(s.committed_at)),
        )
    return table


def slice_record(listed: ListedSlice) -> dict[str, Any]:
    """One slice for `--json`: full ids, ISO 8601 UTC times."""
    s = listed.slice
    return {
        "tenant_id": s.tenant_id,
        "folder": folder_of_scope(s.source_scope),
        "source_scope": s.source_scope,
        "batch_id": str(s.batch_id),
        "rows": dict(sorted(s.row_counts.items())),
        "loaded_at": s.committed_at.astimezone(dt.UTC).isoformat(),
        "database": listed.database,
    }


def nothing_loaded(tenant: str | None) -> str:
    """What an empty registry says instead of an empty table."""
    if tenant is not None:
        return f"tenant {tenant} has no slice loaded yet: {LOAD_ONE}"
    return f"no slice loaded yet (the slice registry is empty): {LOAD_ONE}"
