"""The `fleet-import` command."""

from __future__ import annotations

import uuid
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from fleet_import.batches import BatchRepository, BatchStatus
from fleet_import.config import Settings
from fleet_import.errors import FleetImportError

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
db_app = typer.Typer(no_args_is_help=True, help="The operational database.")
batches_app = typer.Typer(no_args_is_help=True, help="Inspect ingestion batches.")
app.add_typer(db_app, name="db")
app.add_typer(batches_app, name="batches")

console = Console()
err_console = Console(stderr=True)

DatabaseOption = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        envvar="FLEET_DATABASE_URL",
        help="operational PostgreSQL URL",
        show_envvar=True,
    ),
]


def _database_url(value: str | None) -> str:
    return value or Settings().database_url


def _fail(message: str, code: int = 1) -> typer.Exit:
    err_console.print(f"[red]error:[/red] {message}")
    return typer.Exit(code)


@db_app.command("upgrade")
def db_upgrade(
    revision: Annotated[str, typer.Argument(help="target revision")] = "head",
    database_url: DatabaseOption = None,
) -> None:
    """Migrate the operational database (Alembic)."""
    from sqlalchemy.exc import SQLAlchemyError

    from fleet_import import migrate

    url = _database_url(database_url)
    try:
        migrate.upgrade(url, revision)
    except SQLAlchemyError as exc:
        raise _fail(
            f"migration failed: {type(exc).__name__}: {getattr(exc, 'orig', exc)}"
        ) from None
    console.print(f"operational database at revision {migrate.current(url)}")


@batches_app.command("list")
def batches_list(
    tenant: Annotated[str | None, typer.Option(help="only this tenant")] = None,
    status: Annotated[BatchStatus | None, typer.Option(help="only this status")] = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000)] = 50,
    database_url: DatabaseOption = None,
) -> None:
    """The newest batches first."""
    repo = BatchRepository(_database_url(database_url))
    try:
        batches = repo.list(tenant=tenant, status=status, limit=limit)
    except FleetImportError as exc:
        raise _fail(str(exc)) from None
    table = Table("batch", "tenant", "scope", "status", "phase", "rows", "lease", "created (UTC)")
    for batch in batches:
        details = batch.details
        rows = sum(int(n) for n in details.get("row_counts", {}).values())
        failure = details.get("failure") or {}
        status_text = batch.status.value + (f" ({failure['kind']})" if failure.get("kind") else "")
        lease = batch.execution_lease_id or ""
        table.add_row(
            str(batch.id),
            batch.tenant_id,
            batch.source_scope or (str(batch.business_date) if batch.business_date else ""),
            status_text,
            str(details.get("phase", "")),
            f"{rows:,}",
            lease,
            batch.created_at.strftime("%Y-%m-%d %H:%M:%S"),
        )
    console.print(table)
    if not batches:
        console.print("no batches match")


def parse_batch_id(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise _fail(f"{value!r} is not a batch id (a UUID)", 2) from None


if __name__ == "__main__":
    app()
