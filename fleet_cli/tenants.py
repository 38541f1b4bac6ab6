"""`fleet-import tenants`: the tenant registry (FLEET_TENANTS) as the imports read it, and
offboarding a tenant."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from blocks.settings_in_force import settings_in_force
from fleet_import.config import Settings
from fleet_import.errors import FleetImportError
from fleet_import.scope import Tenant
from fleet_import.tenants.databases import own_database, recorded_tenant, shared_database
from fleet_import.tenants.registry import RegisteredTenant, TenantRegistry, registry_in_force

tenants_app = typer.Typer(no_args_is_help=True, help="The tenant registry (FLEET_TENANTS).")
_console = Console()
_err_console = Console(stderr=True)

JsonOption = Annotated[bool, typer.Option("--json", help="print JSON and nothing else")]


def _fail(message: str, code: int = 1) -> typer.Exit:
    _err_console.print(Text.assemble(("error:", "red"), " ", message))
    return typer.Exit(code)


def _registry(settings: Settings) -> TenantRegistry | None:
    try:
        return registry_in_force(settings.tenants)
    except FleetImportError as exc:
        raise _fail(str(exc), 2) from None


def _record(settings: Settings, registered: RegisteredTenant, registry: TenantRegistry | None):
    """A tenant as the imports see it: the registry's fields, and where its slices go."""
    record: dict[str, Any] = registered.to_json()
    database = own_database(settings, registered.tenant_id, registry)
    record["warehouse_database"] = database or shared_database(settings)
    record["own_database"] = database is not None
    return record


@tenants_app.command("list")
def tenants_list(as_json: JsonOption = False) -> None:
    """Every registered tenant; without a registry, say that any valid slug is a tenant.

    Example: fleet-import tenants list --json  (the registry: FLEET_TENANTS=tenants.yaml)
    """
    settings = settings_in_force()[0].settings
    registry = _registry(settings)
    records = (
        [_record(settings, t, registry) for t in registry.tenants.values()] if registry else []
    )
    if as_json:
        typer.echo(json.dumps({"registry": settings.tenants, "tenants": records}, indent=2))
        return
    if registry is None:
        _console.print(
            "no tenant registry (FLEET_TENANTS is unset): any valid tenant id imports its own "
            "landing folders, with company id = tenant id, into the shared warehouse database"
        )
        return
    table = Table("tenant", "enabled", "company", "database", "landing", title=registry.path)
    for record in records:
        table.add_row(
            Text(record["tenant_id"]),
            "yes" if record["enabled"] else Text("no", "red"),
            Text(record["company_id"]),
            Text(f"{record['warehouse_database']}{' (own)' if record['own_database'] else ''}"),
            Text(", ".join(record["landing_prefixes"]) or "landing layout"),
        )
    _console.print(table)


@tenants_app.command("show")
def tenants_show(
    tenant: Annotated[str, typer.Argument(help="the tenant id")], as_json: JsonOption = False
) -> None:
    """One tenant: company, warehouse database, landing area, enabled, overrides.

    Example: fleet-import tenants show acme
    """
    settings = settings_in_force()[0].settings
    registry = _registry(settings)
    try:
        registered = registry.get(tenant) if registry else RegisteredTenant(Tenant.named(tenant))
    except FleetImportError as exc:
        raise _fail(str(exc), 2) from None
    if registered is None:
        raise _fail(f"tenant {tenant!r} is not in the tenant registry {settings.tenants}")
    record = _record(settings, registered, registry)
    record["registered"] = registry is not None
    record["recorded_database"] = recorded_tenant(settings, registered.tenant, registry).database
    if as_json:
        typer.echo(json.dumps(record, indent=2))
        return
    for label, value in _shown(record, settings.tenants):
        _console.print(Text(f"{label}: {value}"), soft_wrap=True)


def _where_slices_go(record: dict[str, Any]) -> str:
    """The database and why it is that one: `database` null in the record means the registry
    names none, so the slices go to the shared database (or the template's own)."""
    name = record["warehouse_database"]
    if record["database"] is not None:
        return f"{name} (its own, as the tenant registry names it)"
    if record["own_database"]:
        return f"{name} (its own: the warehouse names a database per tenant, {{database}})"
    return f"{name or 'the shared one'} (the shared warehouse database)"


def _shown(record: dict[str, Any], registry: str | None) -> list[tuple[str, str]]:
    """`tenants show` for people: words, not Python values (`--json` has the record)."""
    overrides = record["overrides"]
    shown = [
        ("tenant", record["tenant_id"]),
        ("company", record["company_id"]),
        ("enabled", "yes" if record["enabled"] else "no: every import of it is refused"),
        ("warehouse database", _where_slices_go(record)),
        ("landing", ", ".join(record["landing_prefixes"]) or "the landing layout's folders"),
        ("overrides", ", ".join(f"{k}: {v}" for k, v in overrides.items()) or "none"),
        (
            "registry",
            registry
            if record["registered"]
            else "none (FLEET_TENANTS is unset): any valid tenant id is a tenant",
        ),
    ]
    if record["recorded_database"] != record["warehouse_database"]:
        shown.append(("batches record the database as", str(record["recorded_database"])))
    return shown


@tenants_app.command("purge")
def tenants_purge(
    tenant: Annotated[str, typer.Argument(help="the tenant id")],
    confirm: Annotated[
        bool, typer.Option("--confirm", help="really delete the tenant's slices and staged files")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Offboard a tenant: delete its slices, slice-registry rows and staged files.

    The purge is recorded as a batch of its own. Refused while a batch of the tenant runs,
    or while the registry lists it as enabled. Exit codes: 0 purged; 1 refused or failed;
    2 usage error.

    Example: fleet-import tenants purge globex --confirm
    """
    from fleet_import.contracts.files import contracts_in_force
    from fleet_import.importing.runtime import build_runtime
    from fleet_import.offboarding.purge import PurgeRefused, purge_tenant
    from fleet_import.store.purges import TenantPurges

    if not confirm:
        raise _fail(f"purging {tenant!r} deletes all of its data: pass --confirm", 2)
    settings = settings_in_force()[0].settings
    registry = _registry(settings)
    try:
        registered = registry.get(tenant) if registry else None
        base = registered.tenant if registered else Tenant.named(tenant)
        runtime = build_runtime(settings)
        outcome = purge_tenant(
            recorded_tenant(settings, base, registry),
            purges=TenantPurges.from_settings(settings),
            warehouse=runtime.ctx.warehouse,
            staging=runtime.ctx.staging,
            contracts=contracts_in_force(settings.contracts).values(),
            registry=registry,
        )
    except FleetImportError as exc:
        raise _fail(str(exc)) from None
    if isinstance(outcome, PurgeRefused):
        raise _fail(f"refused: {outcome.reason}")
    record = {
        "tenant_id": outcome.tenant_id,
        "batch_id": str(outcome.batch_id),
        "removed": outcome.removed,
        "error": outcome.error,
    }
    if as_json:
        typer.echo(json.dumps(record, indent=2))
    else:
        warehouse = outcome.removed.get("warehouse", {})
        rows = sum(warehouse.get("rows", {}).values())
        _console.print(
            Text(
                f"purged tenant {tenant}: {rows:,} rows, {warehouse.get('registry_rows', 0)} "
                f"slice-registry rows, {len(outcome.removed.get('staged_files', []))} staged "
                f"files; recorded as batch {outcome.batch_id}"
            )
        )
    if outcome.error:
        raise _fail(f"the purge stopped: {outcome.error} (recorded as batch {outcome.batch_id})")
