"""The `fleet-import` command."""

from __future__ import annotations

import uuid
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from fleet_import.batches import BatchRepository, BatchStatus
from fleet_import.config import Settings
from fleet_import.errors import FleetImportError
from fleet_import.landing import DEFAULT_PATTERN

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
db_app = typer.Typer(no_args_is_help=True, help="The operational database.")
batches_app = typer.Typer(no_args_is_help=True, help="Inspect ingestion batches.")
app.add_typer(db_app, name="db")
app.add_typer(batches_app, name="batches")

# Whatever comes from data (keys, header names, rejected values, state and error messages)
# reaches these consoles as `Text`, which rich never parses for markup or emoji: a file
# named `trips [bold]x.csv` prints as it is named, and `[/bold]` raises no MarkupError.
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
    err_console.print(Text.assemble(("error:", "red"), " ", message))
    return typer.Exit(code)


def _cells(*values: object) -> list[Text]:
    """A table row's values, shown as they are."""
    return [Text(str(value)) for value in values]


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
    console.print(Text(f"operational database at revision {migrate.current(url)}"))


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
            *_cells(
                batch.id,
                batch.tenant_id,
                batch.source_scope or (str(batch.business_date) if batch.business_date else ""),
                status_text,
                details.get("phase", ""),
                f"{rows:,}",
                lease,
                batch.created_at.strftime("%Y-%m-%d %H:%M:%S"),
            )
        )
    console.print(table)
    if not batches:
        console.print("no batches match")


def parse_batch_id(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise _fail(f"{value!r} is not a batch id (a UUID)", 2) from None  # a usage error


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
            facts.add_row(Text(name, style="bold"), Text(str(value)))
    console.print(facts)
    if steps:
        outbox = Table("seq", "step", "status", "attempts", "last error", title="publication")
        for step in steps:
            outbox.add_row(
                *_cells(
                    step.seq, step.step, step.status, step.attempts, (step.last_error or "")[:80]
                )
            )
        console.print(outbox)
    summary = details.get("summary") or {}
    if summary.get("files"):
        files = Table("file", "dataset", "rows", "rejects", "cache hit", title="files")
        for f in summary["files"]:
            files.add_row(
                *_cells(
                    f["key"],
                    f["dataset"],
                    f"{f['rows']:,}",
                    f["rejects"],
                    "yes" if f["cache_hit"] else "",
                )
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
            title=Text(
                f"first rejects of {rejects['count']:,} (all: {rejects.get('uri')})",
                style="table.title",
            ),
        )
        for r in rejects.get("sample", []):
            table.add_row(
                *_cells(
                    r["file"], r["line"], r["column"], r["reason"], str(r.get("value") or "")[:40]
                )
            )
        console.print(table)


@app.command("run")
def run(
    folder: Annotated[str, typer.Argument(help="s3://bucket/prefix/ of the delivery")],
    tenant: Annotated[str, typer.Option("--tenant", help="the tenant's slug")],
    delivery_key: Annotated[
        str | None, typer.Option(help="idempotency key of this request")
    ] = None,
) -> None:
    """Import a folder now, in this process (the import-s3-folder flow).

    Prints the final state and its message. Exit codes:
    0 succeeded;
    1 failed;
    2 usage error;
    3 skipped: another batch holds the scope, a live worker runs the batch, or it finished;
    4 committed, publication pending: still running until a drain or resume publishes it.
    """
    from flows.import_s3_folder import import_s3_folder

    state = import_s3_folder(
        tenant_id=tenant, folder=folder, delivery_key=delivery_key, return_state=True
    )
    _report(state)


@app.command("resume")
def resume(batch_id: Annotated[str, typer.Argument(help="the batch to resume")]) -> None:
    """Finish a failed publication without copying a row (the resume-publication flow).

    Prints the final state and its message. Exit codes:
    0 succeeded;
    1 failed, or refused (NotResumable);
    2 usage error (not a batch id);
    3 skipped: another batch holds the scope, a live worker runs the batch, or it finished;
    4 committed, publication pending: still running until a drain or resume publishes it.
    """
    from flows.resume_publication import resume_publication

    parse_batch_id(batch_id)
    _report(resume_publication(batch_id=batch_id, return_state=True))


def _report(state) -> None:
    """Print the final state line (one line, for scripts) and exit with its code."""
    from flows.reporting import ExitCode, exit_code_for

    code = exit_code_for(state)
    colour = {ExitCode.SUCCEEDED: "green", ExitCode.FAILED: "red"}.get(code, "yellow")
    console.print(Text.assemble((state.name, colour), ": ", state.message or ""), soft_wrap=True)
    raise typer.Exit(int(code))


@app.command("demo")
def demo() -> None:
    """Run the real flows end to end on an embedded PostgreSQL and S3 (nothing to configure)."""
    from flows.demo import run_demo

    raise typer.Exit(run_demo())


@app.command("relay")
def relay(
    queue_url: Annotated[
        str,
        typer.Option(
            "--queue-url",
            envvar="FLEET_RELAY_QUEUE_URL",
            show_envvar=True,
            help="SQS queue receiving the landing bucket's S3 notifications",
        ),
    ],
    dead_letter_queue_url: Annotated[
        str | None,
        typer.Option(
            "--dead-letter-queue-url",
            envvar="FLEET_RELAY_DEAD_LETTER_QUEUE_URL",
            show_envvar=True,
            help="SQS queue for messages the relay cannot read",
        ),
    ] = None,
    dead_letter_file: Annotated[
        str,
        typer.Option(
            "--dead-letter-file",
            envvar="FLEET_RELAY_DEAD_LETTER_FILE",
            show_envvar=True,
            help="JSON Lines file for unreadable messages (when no dead-letter queue is given)",
        ),
    ] = "fleet-relay-dead-letters.jsonl",
    endpoint_url: Annotated[
        str | None,
        typer.Option(
            "--endpoint-url",
            envvar="FLEET_SQS_ENDPOINT_URL",
            show_envvar=True,
            help="SQS endpoint (moto, LocalStack); AWS if unset",
        ),
    ] = None,
    region: Annotated[
        str | None, typer.Option(help="AWS region; else from the queue URL or AWS_DEFAULT_REGION")
    ] = None,
    landing_prefix: Annotated[
        str,
        typer.Option(
            envvar="FLEET_LANDING_PREFIX",
            show_envvar=True,
            help="key prefix of tenant folders, ending in '/'",
        ),
    ] = "",
    folder_pattern: Annotated[
        str, typer.Option(help="tenant folder layout after the prefix")
    ] = DEFAULT_PATTERN,
    wait_seconds: Annotated[int, typer.Option(min=0, max=20, help="SQS long-poll wait")] = 20,
    once: Annotated[bool, typer.Option("--once", help="one receive, then exit")] = False,
) -> None:
    """Relay S3 notifications from SQS as aws.s3.object.created Prefect events (Ctrl-C stops).

    A message is deleted only after its events were accepted by the Prefect API; messages
    that are not S3 notifications go to the dead-letter queue or file and are deleted.
    """
    import contextlib
    import logging
    import signal
    import threading

    import boto3

    from fleet_import.dead_letters import FileDeadLetter, SqsDeadLetter
    from fleet_import.landing import LandingLayout
    from fleet_import.relay import Relay, queue_region
    from flows.events import PrefectEventEmitter

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        layout = LandingLayout(prefix=landing_prefix, pattern=folder_pattern)
    except FleetImportError as exc:
        raise _fail(str(exc), 2) from None
    sqs = boto3.client(
        "sqs", endpoint_url=endpoint_url, region_name=region or queue_region(queue_url)
    )
    dead_letter = (
        SqsDeadLetter(sqs, dead_letter_queue_url)
        if dead_letter_queue_url
        else FileDeadLetter(dead_letter_file)
    )
    # systemd stops with SIGTERM: stop like Ctrl-C. Interrupting anywhere is safe, because a
    # message is deleted only after its events were accepted (the worst case is a repeat).
    previous_sigterm = signal.signal(signal.SIGTERM, signal.default_int_handler)
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(signal.signal, signal.SIGTERM, previous_sigterm)
        emit = cleanup.enter_context(PrefectEventEmitter())
        relay_ = Relay(
            sqs,
            queue_url,
            emit,
            dead_letter=dead_letter,
            layout=layout,
            wait_seconds=wait_seconds,
        )
        err_console.print(Text(f"relaying {queue_url}; dead letters to {dead_letter!r}"))
        try:
            stats = relay_.poll_once() if once else relay_.run_forever(threading.Event())
        except KeyboardInterrupt:
            stats = relay_.totals
        except Exception as exc:  # --once: a receive error is the answer
            raise _fail(f"relay failed: {type(exc).__name__}: {exc}") from None
    console.print(Text(f"relay: {stats}"))

