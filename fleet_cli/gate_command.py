"""`fleet-import gate show BATCH`: what the content gate found for a batch (issue 49), each
check with its figure and threshold, and the profile beside the replaced slice's."""

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
    resolve_batch_id,
    store_settings,
)
from fleet_cli.guard import foreseen_errors

gate_app = typer.Typer(
    no_args_is_help=True,
    help="The content gate: `fleet-import gate show BATCH` (checks, drift, profile).",
)


@gate_app.command("show")
def gate_show(
    batch_id: Annotated[str, typer.Argument(help="the batch id, or a unique prefix of it")],
    as_json: JsonOption = False,
    database_url: DatabaseOption = None,
) -> None:
    """Each check and drift rule of the batch (pass/warn/error, the figure, the threshold,
    the file of failing rows) and its profile beside the replaced slice's.

    Example: fleet-import gate show 1f0c3a9e
    """
    store = store_settings(database_url)
    from fleet_import.importing.gate_results import gate_view
    from fleet_import.store.gates import GateRepository
    from fleet_import.store.repository import BatchRepository

    repo = BatchRepository.from_settings(store)
    with foreseen_errors():
        parsed = resolve_batch_id(batch_id, repo)
        batch = repo.get(parsed)
        if batch is None:
            raise fail(f"no batch {batch_id}")
        view = gate_view(GateRepository.from_settings(store), batch)
    if as_json:
        typer.echo(json.dumps({"batch_id": str(parsed), **view.to_json()}, indent=2))
        return
    console.print(Text(f"batch {parsed}: content gate"))
    for line in view.lines():
        console.print(Text(line))
