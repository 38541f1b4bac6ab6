"""`fleet-import contracts show`: the dataset contracts in force (the Fleet datasets and
FLEET_CONTRACTS), each with its version, columns, key and policies, and what each curated
table of a warehouse database holds against them (warehouse.shape's plan)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from fleet_cli.guard import error_line, foreseen_errors, require_settings
from fleet_cli.tables import (
    WAREHOUSE_USES,
    DatabaseOption,
    JsonOption,
    TenantOption,
    chosen_database,
    database_warehouse,
    migrate_option,
)
from fleet_import.contracts.model import DatasetContract
from fleet_import.errors import FleetImportError

if TYPE_CHECKING:  # pyarrow: only the command itself needs it
    from fleet_import.warehouse.shape import TablePlan

contracts_app = typer.Typer(
    no_args_is_help=True,
    help="The dataset contracts in force: `fleet-import contracts show`.",
)
_console = Console()

_SHAPE_FIELDS = frozenset(
    {"name", "file_glob", "columns", "natural_key", "target_table", "formats", "version"}
)
"""Fields shown on their own; every other field of a contract is one of its policies."""


def contract_record(contract: DatasetContract) -> dict[str, Any]:
    """A contract as `contracts show --json` prints it."""
    return {
        "dataset": contract.name,
        "version": str(contract.version),
        "contract_version": contract.contract_version,
        "target_table": contract.target_table,
        "file_glob": contract.file_glob,
        "formats": list(contract.formats),
        "natural_key": list(contract.natural_key),
        "columns": [column.model_dump(mode="json") for column in contract.columns],
        "policies": contract.model_dump(mode="json", exclude=set(_SHAPE_FIELDS)),
    }


def table_record(plan: TablePlan, option: str) -> dict[str, Any]:
    record = plan.to_json()
    from fleet_import.warehouse.shape import MIGRATE_COMMAND

    record["migrate"] = f"{MIGRATE_COMMAND}{option} --apply" if plan.state == "differs" else None
    return record


@contracts_app.command("show")
def contracts_show(
    tenant: TenantOption = None,
    database: DatabaseOption = None,
    as_json: JsonOption = False,
) -> None:
    """The effective contracts and their versions (dataset, version, columns with types,
    key, policies) and, per curated table of the warehouse database (the shared one, the
    tenant's, or the one named), whether it matches its contract or differs (which
    columns, and the `tables migrate` command that changes it).

    Exit codes: 0 shown; 1 the warehouse could not be read (the contracts are still shown);
    2 usage error; 78 configuration error, or a contract file that does not load.

    Example: fleet-import contracts show --tenant acme --json
    """
    from fleet_import.contracts.files import contracts_in_force
    from fleet_import.importing.drift import effective_contracts
    from fleet_import.warehouse.migration import migration_for, plan_tables

    settings = require_settings(WAREHOUSE_USES)
    with foreseen_errors():
        name = chosen_database(settings, tenant, database)
        declared = contracts_in_force(settings.contracts)
    contracts = list(declared.values())
    option = migrate_option(tenant, database)
    error = None
    plans: list[TablePlan] = []
    try:
        warehouse = database_warehouse(settings, name)
        # With the columns drift added to the tables (on_new_columns evolve): in force too.
        contracts = list(effective_contracts(declared, warehouse, tenant or "").values())
        plans = plan_tables(migration_for(warehouse), contracts)
    except FleetImportError as exc:
        error = f"cannot read the curated tables: {exc}"
    if as_json:
        document = {
            "contracts": [contract_record(c) for c in contracts],
            "database": name,
            "tables": [table_record(p, option) for p in plans],
            "error": error,
        }
        typer.echo(json.dumps(document, indent=2))
    else:
        for contract in contracts:
            _print_contract(contract)
        _print_tables(plans, name or _shared_name(settings), option)
    if error is not None:
        if not as_json:
            error_line(error)
        raise typer.Exit(1)


def _shared_name(settings: Any) -> str | None:
    from fleet_import.tenants.databases import shared_database

    try:
        return shared_database(settings)
    except FleetImportError:
        return None


def _print_contract(contract: DatasetContract) -> None:
    record = contract_record(contract)
    _console.print(
        Text.assemble(
            (contract.name, "bold"),
            f"  version {record['version']} ({record['contract_version']}) -> "
            f"{contract.target_table}, key ({', '.join(contract.natural_key)}), files "
            f"{contract.file_glob} as {', '.join(contract.formats)}",
        ),
        soft_wrap=True,
    )
    policies = ", ".join(
        f"{key}={value}" for key, value in record["policies"].items() if key != "description"
    )
    _console.print(Text(f"  policies: {policies}"), soft_wrap=True)
    table = Table("column", "type", "null", "rules", box=None, padding=(0, 2))
    for column in record["columns"]:
        rules = ", ".join(
            f"{key}={value}"
            for key, value in column.items()
            if key not in ("name", "type", "nullable") and _is_rule(value)
        )
        table.add_row(
            Text(column["name"]),
            Text(column["type"]),
            "yes" if column["nullable"] else "no",
            Text(rules),
        )
    _console.print(table)


def _is_rule(value: object) -> bool:
    """A column's field that says something: `min_value=0` does (no negative distance),
    an unset bound, an empty list or a false flag do not. (`0 in (False,)` is true.)"""
    return value is not None and value is not False and value != [] and value != ()


def _print_tables(plans: list[TablePlan], database: str | None, option: str) -> None:
    if not plans:
        return
    _console.print(Text(f"curated tables in {database or 'the shared warehouse database'}:"))
    for plan in plans:
        _console.print(Text(f"  {plan.spelled()}"), soft_wrap=True)
        if plan.state == "differs":
            from fleet_import.warehouse.shape import MIGRATE_COMMAND

            _console.print(Text(f"    run `{MIGRATE_COMMAND}{option} --apply`"), soft_wrap=True)
