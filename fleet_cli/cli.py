"""The `fleet-import` command."""

from __future__ import annotations

import json
import os
import uuid
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated

import typer
from rich.text import Text

from fleet_cli.common import (
    DatabaseOption,
    JsonOption,
    console,
    fail,
    full_batch_id,
    report_state,
    resolve_batch_id,
    store_settings,
)
from fleet_cli.contracts_show import contracts_app
from fleet_cli.doctor import doctor
from fleet_cli.first_help import TOOL_HELP, InOrderOfUse
from fleet_cli.flow_call import run_flow
from fleet_cli.freshness import freshness
from fleet_cli.gate_command import gate_app
from fleet_cli.guard import DEBUG_VARIABLE, error_line, foreseen_errors, ready_to_run
from fleet_cli.metrics_commands import costs, metrics_app
from fleet_cli.relay_command import relay
from fleet_cli.review_commands import batches_approve, batches_reject, list_held, slices_app
from fleet_cli.tables import tables_app
from fleet_cli.tenants import tenants_app
from fleet_cli.worker_command import worker
from fleet_import.store.models import BatchStatus

if TYPE_CHECKING:
    from collections.abc import Sequence

    from fleet_import.config import Settings
    from fleet_import.importing.gate_results import GateView
    from fleet_import.store.batch_state import HeldSince
    from fleet_import.store.models import Batch

app = typer.Typer(no_args_is_help=True, add_completion=False, help=TOOL_HELP, cls=InOrderOfUse)
app.command("doctor")(doctor)
app.command("freshness")(freshness)
app.command("costs")(costs)
app.command("relay")(relay)
app.command("worker")(worker)


@app.callback()
def main(
    debug: Annotated[
        bool, typer.Option("--debug", help="show tracebacks (also FLEET_DEBUG=1)")
    ] = False,
) -> None:
    if debug:
        os.environ[DEBUG_VARIABLE] = "1"  # the flows run in this process read it too


db_app = typer.Typer(
    no_args_is_help=True,
    help="The operational database: `fleet-import db upgrade` before the first run.",
)
batches_app = typer.Typer(
    no_args_is_help=True,
    help="Inspect ingestion batches: `fleet-import batches list --status failed`.",
)
app.add_typer(db_app, name="db")
app.add_typer(batches_app, name="batches")
app.add_typer(tenants_app, name="tenants")
app.add_typer(tables_app, name="tables")
app.add_typer(contracts_app, name="contracts")
app.add_typer(metrics_app, name="metrics")
app.add_typer(gate_app, name="gate")
app.add_typer(slices_app, name="slices")


@db_app.command("upgrade")
def db_upgrade(
    revision: Annotated[str, typer.Argument(help="target revision")] = "head",
    database_url: DatabaseOption = None,
) -> None:
    """Migrate the operational database (Alembic) to the head revision, or to REVISION.

    Example: FLEET_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/fleet fleet-import db upgrade
    """
    from sqlalchemy.exc import OperationalError, SQLAlchemyError

    from fleet_import.store import migrate

    url = store_settings(database_url).database_url
    try:
        migrate.upgrade(url, revision)
    except SQLAlchemyError as exc:
        hint = ": check FLEET_DATABASE_URL (host:port)" if isinstance(exc, OperationalError) else ""
        raise fail(
            f"migration failed: {type(exc).__name__}: {getattr(exc, 'orig', exc)}{hint}"
        ) from None
    console.print(Text(f"operational database at revision {migrate.current(url)}"))


ListedStatus = StrEnum(  # type: ignore[misc]
    "ListedStatus", {**{s.name: s.value for s in BatchStatus}, "HELD": "held"}
)


@batches_app.command("list")
def batches_list(
    tenant: Annotated[str | None, typer.Option(help="only this tenant")] = None,
    status: Annotated[
        ListedStatus | None, typer.Option(help="only this status (held: waiting for review)")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000)] = 50,
    as_json: JsonOption = False,
    database_url: DatabaseOption = None,
) -> None:
    """The newest batches first; a wider terminal shows more columns.

    Example: fleet-import batches list --tenant acme --status failed
    """
    if status == ListedStatus.HELD:  # issue #24: held batches that wait for review
        list_held(tenant, limit, as_json, database_url)
        return
    store = store_settings(database_url)  # the settings first: refused before any import
    from fleet_cli.batch_views import batch_record, batches_table
    from fleet_import.store.repository import BatchRepository

    repo = BatchRepository.from_settings(store)
    with foreseen_errors():
        batches = repo.list(tenant=tenant, status=status and status.value, limit=limit)
        since = held_since(store, batches)
    if as_json:
        typer.echo(json.dumps([batch_record(b, since.get(b.id)) for b in batches], indent=2))
        return
    console.print(batches_table(batches, console, since))
    if not batches:
        console.print("no batches match")


def held_since(store: Settings, batches: Sequence[Batch]) -> dict[uuid.UUID, HeldSince]:
    """What later deliveries say of the held batches among `batches` (one query; none when
    no batch is held): the views' review state reads it."""
    from fleet_import.store.batch_state import is_held
    from fleet_import.store.review_repository import ReviewRepository

    held = [batch.id for batch in batches if is_held(batch)]
    return ReviewRepository.from_settings(store).held_since(held) if held else {}


@batches_app.command("show")
def batches_show(
    batch_id: Annotated[str, typer.Argument(help="the batch id, or a unique prefix of it")],
    as_json: JsonOption = False,
    database_url: DatabaseOption = None,
) -> None:
    """A batch's details, failures and resumes, publication steps and first rejects.

    Example: fleet-import batches show 1f0c3a9e
    """
    store = store_settings(database_url)
    from fleet_cli.batch_views import batch_detail_record, batch_views
    from fleet_import.store.lineage_outbox import LineageOutbox
    from fleet_import.store.outbox import OutboxRepository
    from fleet_import.store.repository import BatchRepository

    repo = BatchRepository.from_settings(store)
    with foreseen_errors():
        parsed = resolve_batch_id(batch_id, repo)
        batch = repo.get(parsed)
        steps = OutboxRepository.from_settings(store).steps(parsed) if batch else []
        lineage = LineageOutbox.from_settings(store).of_batch(parsed) if batch else []
        since = held_since(store, [batch] if batch else []).get(parsed)
        gate = _gate_view(store, batch)
    if batch is None:
        raise fail(f"no batch {batch_id}")
    if as_json:
        record = batch_detail_record(batch, steps, lineage, since)
        typer.echo(json.dumps({**record, "gate": gate.to_json() if gate else None}, indent=2))
        return
    for view in batch_views(batch, steps, lineage, since):
        console.print(view)
    for line in gate.lines() if gate else []:  # the content gate (issue 49)
        console.print(Text(line))


def _gate_view(store: Settings, batch: Batch | None) -> GateView | None:
    from fleet_import.importing.gate_results import gate_view
    from fleet_import.store.gates import GateRepository

    if batch is None:
        return None
    return gate_view(GateRepository.from_settings(store), batch)


@app.command("run")
def run(
    folder: Annotated[str, typer.Argument(help="s3://bucket/prefix/ of the delivery")],
    tenant: Annotated[str, typer.Option("--tenant", help="the tenant's slug")],
    delivery_key: Annotated[
        str | None, typer.Option(help="idempotency key of this request")
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="load even if the slice already holds this content")
    ] = False,
    no_guard: Annotated[
        bool, typer.Option("--no-guard", help="load even a slice the guards would hold")
    ] = False,
    min_rows_ratio: Annotated[
        float | None,
        typer.Option(min=0.0, max=1.0, help="every dataset's min_rows_ratio for this run"),
    ] = None,
    no_gate: Annotated[
        bool, typer.Option("--no-gate", help="skip the content gate (checks, drift) this run")
    ] = False,
) -> None:
    """Import a folder now, in this process (the import-s3-folder flow).

    Prints the final state and its message. Exit codes:
    0 succeeded;
    1 failed;
    2 usage error: an option or argument missing or malformed (the folder, the tenant id);
    3 skipped: another batch holds the scope, a live worker runs the batch, or it finished;
    4 committed, publication pending: still running until a drain or resume publishes it;
    5 already loaded: the slice holds exactly this content (--force loads it again);
    6 held for review: a slice guard or the content gate stopped it (batches approve loads it);
    7 commit unknown: the COMMIT got no answer; the batch stays running until settled;
    9 refused: the folder is not the tenant's, or the tenant is unknown or disabled;
    78 configuration error: the settings are wrong, nothing was started.

    Example: fleet-import run --tenant acme s3://fleet-landing/acme/fleet/2026-07-22/
    """
    _refuse_malformed(tenant, folder)
    ready_to_run()
    with foreseen_errors():
        from flows.common import freeze_startup_heap
        from flows.import_s3_folder import import_s3_folder

        freeze_startup_heap(owned=True)  # this process runs one flow, then exits
        state = run_flow(
            lambda: import_s3_folder(
                tenant_id=tenant, folder=folder, delivery_key=delivery_key, force=force,
                no_guard=no_guard, min_rows_ratio=min_rows_ratio, no_gate=no_gate,
                return_state=True,
            )
        )
    report_state(state)


@app.command("resume")
def resume(
    batch_id: Annotated[str, typer.Argument(help="the batch to resume, or a unique prefix of it")],
) -> None:
    """Finish a failed publication without copying a row (the resume-publication flow).

    Prints the final state and its message. Exit codes:
    0 succeeded;
    1 failed, or refused (NotResumable);
    2 usage error (not a batch id, or a prefix no batch id or several start with);
    3 skipped: another batch holds the scope, a live worker runs the batch, or it finished;
    4 committed, publication pending: still running until a drain or resume publishes it;
    9 refused: the batch's tenant is unknown or disabled, or its folder is not the tenant's.
    78 configuration error: the settings are wrong, nothing was started.

    Example: fleet-import resume 1f0c3a9e
    """
    full = full_batch_id(batch_id)
    settings = ready_to_run()
    with foreseen_errors():
        from fleet_import.store.repository import BatchRepository
        from flows.resume_publication import resume_publication

        parsed = full or resolve_batch_id(batch_id, BatchRepository.from_settings(settings))
        state = run_flow(lambda: resume_publication(batch_id=str(parsed), return_state=True))
    report_state(state)


def _refuse_malformed(tenant: str, folder: str) -> None:
    """A tenant id or folder that can never name a delivery is a usage error (exit 2), every
    one printed, before the settings, Prefect or a database are touched. The core's own
    rules decide (fleet_import.scope), the ones the flow would refuse them by."""
    from fleet_import.errors import InvalidInput
    from fleet_import.scope import source_scope, validate_tenant_id

    problems = []
    for check, value in ((validate_tenant_id, tenant), (source_scope, folder)):
        try:
            check(value)
        except InvalidInput as exc:
            problems.append(str(exc))
    for problem in problems:
        error_line(problem)
    if problems:
        raise typer.Exit(2)


@app.command("demo")
def demo(
    fresh: Annotated[
        bool,
        typer.Option(
            "--fresh", help="delete .fleet-demo (the earlier runs' database and runs) first"
        ),
    ] = False,
) -> None:
    """Run the real flows end to end on an embedded PostgreSQL and S3 (nothing to configure).

    Its state stays in .fleet-demo; a second run adds its batches beside the first's.

    Example: fleet-import demo --fresh
    """
    from flows.demo import run_demo

    raise typer.Exit(run_demo(fresh=fresh))


# After `list` and `show`, the order `batches --help` lists them in (review_commands.py).
batches_app.command("approve")(batches_approve)
batches_app.command("reject")(batches_reject)
