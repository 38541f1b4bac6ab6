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


@batches_app.command("show")
def batches_show(
    batch_id: Annotated[str, typer.Argument(help="the batch id")],
    database_url: DatabaseOption = None,
) -> None:
    """A batch's details, its publication steps and its first rejects."""
    from fleet_import.batches.outbox import OutboxRepository

    url = _database_url(database_url)
    parsed = parse_batch_id(batch_id)
    try:
        batch = BatchRepository(url).get(parsed)
        steps = OutboxRepository(url).steps(parsed) if batch else []
    except FleetImportError as exc:
        raise _fail(str(exc)) from None
    if batch is None:
        raise _fail(f"no batch {batch_id}")
    details = batch.details
    facts = Table.grid(padding=(0, 2))
    for name, value in (
        ("batch", batch.id),
        ("tenant", batch.tenant_id),
        ("scope", batch.source_scope),
        ("delivery", batch.delivery_key),
        ("status", batch.status.value),
        ("phase", details.get("phase")),
        ("committed", details.get("redshift_committed")),
        ("rows", details.get("row_counts")),
        (
            "lease",
            f"{batch.execution_lease_id} until {batch.execution_lease_expires_at}"
            if batch.execution_lease_id
            else "free",
        ),
        ("failure", details.get("failure")),
        ("superseded by", details.get("superseded_by")),
        ("publication expired", details.get("publication_expired") or None),
        ("created", batch.created_at),
        ("updated", batch.updated_at),
    ):
        if value is not None:
            facts.add_row(f"[bold]{name}[/bold]", str(value))
    console.print(facts)
    if steps:
        outbox = Table("seq", "step", "status", "attempts", "last error", title="publication")
        for step in steps:
            outbox.add_row(
                str(step.seq),
                step.step,
                str(step.status),
                str(step.attempts),
                (step.last_error or "")[:80],
            )
        console.print(outbox)
    summary = details.get("summary") or {}
    if summary.get("files"):
        files = Table("file", "dataset", "rows", "rejects", "cache hit", title="files")
        for f in summary["files"]:
            files.add_row(
                f["key"],
                f["dataset"],
                f"{f['rows']:,}",
                str(f["rejects"]),
                "yes" if f["cache_hit"] else "",
            )
        console.print(files)
    rejects = details.get("rejects") or {}
    if rejects.get("count"):
        table = Table(
            "file",
            "line",
            "column",
            "reason",
            "value",
            title=f"first rejects of {rejects['count']:,} (all: {rejects.get('uri')})",
        )
        for r in rejects.get("sample", []):
            table.add_row(
                r["file"],
                str(r["line"]),
                str(r["column"]),
                r["reason"],
                str(r.get("value") or "")[:40],
            )
        console.print(table)


def _exit_code_for(state) -> int:
    """0 succeeded, 1 failed, 2 skipped (another batch holds the scope, or nothing to do)."""
    if state.is_failed() or state.is_crashed():
        return 1
    return 0 if state.name in ("Completed", "Committed") else 2


@app.command("run")
def run(
    folder: Annotated[str, typer.Argument(help="s3://bucket/prefix/ of the delivery")],
    tenant: Annotated[str, typer.Option("--tenant", help="the tenant's slug")],
    delivery_key: Annotated[
        str | None, typer.Option(help="idempotency key of this request")
    ] = None,
) -> None:
    """Import a folder now, in this process (the import-s3-folder flow).

    Exit code 0 succeeded, 1 failed, 2 skipped.
    """
    from flows.import_s3_folder import import_s3_folder

    state = import_s3_folder(
        tenant_id=tenant, folder=folder, delivery_key=delivery_key, return_state=True
    )
    _report(state)


@app.command("resume")
def resume(batch_id: Annotated[str, typer.Argument(help="the batch to resume")]) -> None:
    """Finish a failed publication without copying a row (the resume-publication flow)."""
    from flows.resume_publication import resume_publication

    parse_batch_id(batch_id)
    _report(resume_publication(batch_id=batch_id, return_state=True))


def _report(state) -> None:
    code = _exit_code_for(state)
    colour = {0: "green", 1: "red", 2: "yellow"}[code]
    console.print(f"[{colour}]{state.name}[/{colour}]: {state.message or ''}")
    raise typer.Exit(code)


@app.command("demo")
def demo() -> None:
    """Run the real flows end to end on an embedded PostgreSQL and S3 (nothing to configure)."""
    from flows.demo import run_demo

    raise typer.Exit(run_demo())


if __name__ == "__main__":
    app()
