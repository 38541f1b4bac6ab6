"""`fleet-import tables migrate`: the curated tables of one warehouse database brought to the
shapes the contracts in force declare (fleet_import.warehouse.migration)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from fleet_cli.guard import error_line, foreseen_errors, require_settings
from fleet_import.checks.settings import Uses
from fleet_import.config import Settings

if TYPE_CHECKING:  # pyarrow and the drivers: only the commands themselves need them
    from fleet_import.warehouse.base import Warehouse
    from fleet_import.warehouse.shape import TablePlan

tables_app = typer.Typer(
    no_args_is_help=True,
    help="The curated tables against the contracts: `fleet-import tables migrate`.",
)
_console = Console()

WAREHOUSE_USES = frozenset({Uses.DATABASE, Uses.WAREHOUSE, Uses.S3, Uses.CONTRACTS})
USAGE_ERROR = 2
PLANNED = 3
"""`tables migrate` without --apply found changes to make."""

TenantOption = Annotated[
    str | None, typer.Option("--tenant", help="the tenant whose warehouse database to use")
]
DatabaseOption = Annotated[
    str | None, typer.Option("--database", help="the warehouse database to use, by name")
]
JsonOption = Annotated[bool, typer.Option("--json", help="print JSON and nothing else")]


def chosen_database(settings: Settings, tenant: str | None, database: str | None) -> str | None:
    """The database --tenant or --database names (None: the shared one)."""
    from fleet_import.scope import validate_tenant_id
    from fleet_import.tenants.databases import own_database
    from fleet_import.tenants.registry import registry_in_force

    if tenant and database:
        error_line("give --tenant or --database, not both")
        raise typer.Exit(USAGE_ERROR)
    if database is not None:
        return database
    if tenant is None:
        return None
    validate_tenant_id(tenant)
    return own_database(settings, tenant, registry_in_force(settings.tenants))


def database_warehouse(settings: Settings, database: str | None) -> Warehouse:
    from fleet_import.importing.runtime import warehouse_of
    from fleet_import.s3.client import settings_s3_client

    s3 = settings_s3_client(settings) if settings.warehouse == "redshift" else None
    return warehouse_of(settings, s3, database)


def migrate_option(tenant: str | None, database: str | None) -> str:
    """The options that name the same database again in a printed command."""
    if tenant:
        return f" --tenant {tenant}"
    return f" --database {database}" if database else ""


@tables_app.command("migrate")
def tables_migrate(
    tenant: TenantOption = None,
    database: DatabaseOption = None,
    apply: Annotated[
        bool, typer.Option("--apply", help="make the changes (without it: print the plan)")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Plan, and with --apply make, the changes that bring each curated table of a warehouse
    database (the shared one, the tenant's, or the one named) to its contract's shape.

    A type the warehouse changes in place is changed so (PostgreSQL: ALTER COLUMN ... TYPE
    ... USING; Redshift: widening a VARCHAR); anything else is a deep copy (new table,
    INSERT ... SELECT with the casts, swap by rename), in one transaction that holds the
    table's lock, so no slice commit interleaves. Stamps and the slice registry are kept.
    Values that do not cast are refused before anything changes, with a few of them and
    their rows' stamps. Exit codes: 0 every table matches (or --apply brought it there);
    1 a table was refused or the migration failed (that table is as it was); 2 usage error;
    3 changes planned, not made (run again with --apply); 78 configuration error, or a
    contract file that does not load.

    Example: fleet-import tables migrate --tenant acme --apply
    """
    from fleet_import.contracts.files import contracts_in_force
    from fleet_import.importing.drift import effective_contracts
    from fleet_import.warehouse.migration import (
        Migrated,
        apply_plan,
        migration_for,
        plan_tables,
    )
    from fleet_import.warehouse.shape import MigrationRefused

    settings = require_settings(WAREHOUSE_USES)
    records: list[dict[str, Any]] = []
    failed = planned = False
    with foreseen_errors():
        name = chosen_database(settings, tenant, database)
        warehouse = database_warehouse(settings, name)
        # The columns drift added to the tables (on_new_columns evolve) are the contracts'
        # own now: a migration keeps them.
        contracts = list(
            effective_contracts(contracts_in_force(settings.contracts), warehouse, tenant or "")
            .values()
        )
        migration = migration_for(warehouse)
        plans = plan_tables(migration, contracts)
        for contract, plan in zip(contracts, plans, strict=True):
            record: dict[str, Any] = plan.to_json()
            if plan.method is not None and apply:
                try:
                    done = apply_plan(migration, contract)
                except MigrationRefused as exc:
                    record.update(applied=False, error=str(exc))
                    record["uncastable"] = [u.to_json() for u in exc.uncastable]
                    failed = True
                else:
                    record.update(applied=isinstance(done, Migrated))
                    if isinstance(done, Migrated):
                        record["rows"] = done.rows
            elif plan.method is not None:
                planned = True
                failed = failed or plan.method == "refused"
            records.append(record)
    if as_json:
        typer.echo(json.dumps({"database": name, "apply": apply, "tables": records}, indent=2))
    else:
        _print(records, plans, apply, migrate_option(tenant, database))
    if failed:
        raise typer.Exit(1)
    if planned:
        raise typer.Exit(PLANNED)


def _print(records: list[dict[str, Any]], plans: list[TablePlan], apply: bool, option: str) -> None:
    for record, plan in zip(records, plans, strict=True):
        _console.print(Text(plan.spelled()), soft_wrap=True)
        if "error" in record:
            error_line(record["error"])
        elif record.get("applied"):
            _console.print(Text(f"  migrated ({plan.method}): {record['rows']:,} rows kept"))
    if not apply and any(p.method not in (None, "refused") for p in plans):
        from fleet_import.warehouse.shape import MIGRATE_COMMAND

        _console.print(Text(f"run `{MIGRATE_COMMAND}{option} --apply` to make these changes"))
