"""`fleet-import batches approve / reject` and `slices rollback` (issue #24): what an
operator does with a held batch, or with a slice a bad delivery replaced; `slices list`:
what each slice holds now (issue #40)."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.text import Text

from fleet_cli.common import (
    DatabaseOption,
    JsonOption,
    console,
    fail,
    report_state,
    resolve_batch_id,
    store_settings,
)
from fleet_cli.flow_call import run_flow
from fleet_cli.guard import foreseen_errors, ready_to_run, require_settings
from fleet_import.checks.settings import Uses
from fleet_import.errors import FleetImportError, InvalidInput
from fleet_import.scope import validate_tenant_id

slices_app = typer.Typer(
    no_args_is_help=True, help="Curated slices: `fleet-import slices list`, roll one back."
)


def list_held(tenant: str | None, limit: int, as_json: bool, database_url: str | None) -> None:
    """Held batches nobody decided yet, each with its review state (fleet_import.store.
    batch_state): awaiting review (its breaches and the approve command), overtaken or stale
    (what happened since, and no approve command that could only fail)."""
    from fleet_cli.batch_views import batch_record, batches_table
    from fleet_import.importing.drift import held_drift
    from fleet_import.importing.guards import Breach, approve_command
    from fleet_import.store.batch_state import ReviewState, hold_of, review_line, review_state
    from fleet_import.store.review_repository import ReviewRepository

    store = ReviewRepository.from_settings(store_settings(database_url))
    try:
        batches = store.held_batches(tenant, limit)
        since = store.held_since(batch.id for batch in batches)
    except FleetImportError as exc:
        raise fail(str(exc)) from None
    if as_json:
        records = [batch_record(batch, since.get(batch.id)) for batch in batches]
        typer.echo(json.dumps(records, indent=2))
        return
    console.print(batches_table(batches, console, since))
    if not batches:
        console.print("no batches wait for review")
    for batch in batches:
        if review_state(batch, since.get(batch.id)) is not ReviewState.AWAITING:
            line = review_line(batch, since.get(batch.id))
            console.print(Text(f"{batch.id}: {line}"), soft_wrap=True)
            continue
        hold = hold_of(batch)
        for breach in hold.breaches if hold is not None else []:
            described = Breach(**breach).describe()
            console.print(
                Text(f"{batch.id}: {described}; {approve_command(batch.id)}"), soft_wrap=True
            )
        for dataset, columns in held_drift(batch).items():  # issue #25
            spelled = ", ".join(f"{name} {kind}" for name, kind in columns.items())
            console.print(
                Text(
                    f"{batch.id}: {dataset} new columns {spelled} (on_new_columns review); "
                    f"{approve_command(batch.id)}"
                ),
                soft_wrap=True,
            )


def batches_approve(
    batch_id: Annotated[str, typer.Argument(help="the held batch, or a unique prefix of it")],
    database_url: DatabaseOption = None,
) -> None:
    """Load a held batch's exact content (same files, same contract versions) as a new
    batch with its guards waived (the approve-held-batch flow). Refused when the folder
    changed since it was held. A batch held for its new columns (on_new_columns review)
    has them added to the curated table first.

    Exit codes: 0 loaded; 1 failed or refused (NotApproved); 2 usage error;
    3 skipped (another batch holds the scope); 4 committed, publication pending;
    9 refused: the tenant registry no longer admits the batch's tenant (disabled, unknown)
    or folder, nothing written.

    Example: fleet-import batches approve 1f0c3a9e
    """
    settings = ready_to_run(database_url=database_url)
    with foreseen_errors():
        from fleet_import.store.repository import BatchRepository
        from flows.approve_held_batch import approve_held_batch

        parsed = resolve_batch_id(batch_id, BatchRepository.from_settings(settings))
        state = run_flow(lambda: approve_held_batch(batch_id=str(parsed), return_state=True))
    report_state(state)


def batches_reject(
    batch_id: Annotated[str, typer.Argument(help="the held batch, or a unique prefix of it")],
    note: Annotated[str, typer.Option(help="why, kept on the batch")] = "",
    database_url: DatabaseOption = None,
) -> None:
    """Close a held batch without loading it: the slice keeps what it holds.

    Example: fleet-import batches reject 1f0c3a9e
    """
    settings = ready_to_run(flow=False, database_url=database_url)
    from fleet_import.importing.review import NotApproved, reject_held
    from fleet_import.store.repository import BatchRepository
    from fleet_import.store.review_repository import ReviewRepository
    from flows.common import runtime_for_flow

    with foreseen_errors():
        parsed = resolve_batch_id(batch_id, BatchRepository.from_settings(settings))
        rt = runtime_for_flow()
        outcome = reject_held(rt.ctx, ReviewRepository.from_settings(settings), parsed, note)
    if isinstance(outcome, NotApproved):
        raise fail(outcome.reason)
    console.print(Text(f"batch {parsed} rejected: the slice keeps what it holds"))


@slices_app.command("rollback")
def slices_rollback(
    folder: Annotated[str, typer.Argument(help="s3://bucket/prefix/ of the slice's delivery")],
    tenant: Annotated[str, typer.Option("--tenant", help="the tenant's slug")],
    to: Annotated[
        str | None,
        typer.Option(
            "--to",
            help="the batch to roll back to (default: the newest earlier success whose content "
            "the slice does not show and no rollback removed)",
        ),
    ] = None,
    database_url: DatabaseOption = None,
) -> None:
    """Load an earlier succeeded batch's content into the slice again, as a new batch (the
    rollback-slice flow). Refused, with the reason, when its normalized files are gone. By
    default a rollback never goes forward to content a rollback removed (name it with --to);
    the final line says which batch it loaded.

    Exit codes: 0 rolled back; 1 failed or refused (NotRolledBack); 2 usage error;
    3 skipped (another batch holds the scope); 4 committed, publication pending;
    9 refused: the folder is not the tenant's, or the tenant is unknown or disabled in the
    tenant registry, nothing written.

    Example: fleet-import slices rollback --tenant acme s3://fleet-landing/acme/fleet/2026-07-22/
    """
    settings = ready_to_run(database_url=database_url)
    with foreseen_errors():
        from fleet_import.store.repository import BatchRepository
        from flows.rollback_slice import rollback_slice

        repo = BatchRepository.from_settings(settings)
        target = str(resolve_batch_id(to, repo)) if to else None
        state = run_flow(
            lambda: rollback_slice(
                tenant_id=tenant, folder=folder, to_batch_id=target, return_state=True
            )
        )
    report_state(state)


@slices_app.command("list")
def slices_list(
    tenant: Annotated[str | None, typer.Option("--tenant", help="only this tenant")] = None,
    as_json: JsonOption = False,
) -> None:
    """Every slice the slice registry holds: tenant, folder, the batch that owns it (the
    8-digit prefix `batches show` takes; the full id with --json), rows per dataset and when
    it was loaded. Read from the shared warehouse database and each registered tenant's own.

    Example: fleet-import slices list --tenant acme
    """
    if tenant is not None:
        try:
            validate_tenant_id(tenant)
        except InvalidInput as exc:
            raise fail(str(exc), 2) from None
    settings = require_settings({Uses.DATABASE, Uses.WAREHOUSE, Uses.S3})
    from fleet_cli.slice_views import (
        NO_KNOWN_DATABASE,
        nothing_loaded,
        read_slices,
        slice_record,
        slices_table,
    )

    with foreseen_errors():
        slices = read_slices(settings, tenant)
    if slices is None:
        raise fail(NO_KNOWN_DATABASE, 2)
    if as_json:
        typer.echo(json.dumps([slice_record(s) for s in slices], indent=2))
    elif slices:
        console.print(slices_table(slices))
    else:
        console.print(Text(nothing_loaded(tenant)))
