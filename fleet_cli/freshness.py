"""`fleet-import freshness`: each tenant's freshness SLOs and whether the delivery due was
loaded, as the `check-freshness` flow judges them (without remembering or telling anything:
the flow's events stay the flow's)."""

from __future__ import annotations

import datetime as dt
import json
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from fleet_cli.guard import error_line, foreseen_errors, require_settings
from fleet_import.checks.settings import FRESHNESS

if TYPE_CHECKING:  # the check reads the store and S3: only the command itself needs them
    from fleet_import.freshness.check import Verdict

_console = Console()


def freshness(
    as_json: Annotated[bool, typer.Option("--json", help="print JSON and nothing else")] = False,
    at: Annotated[
        str | None,
        typer.Option(
            "--at",
            help="judge as of this time (ISO 8601, e.g. 2026-07-22T06:30+02:00); default now",
        ),
    ] = None,
) -> None:
    """Each tenant and dataset with a freshness SLO: last loaded, expected by, state.

    States: fresh; missing (no folder); arrived, incomplete (not complete by the sweep's
    rule); arrived, not loaded; late (S3 not searched); off. The SLOs come from
    FLEET_FRESHNESS and the tenant registry's overrides.freshness. Exit codes: 0 the table
    (late or not); 1 the store or S3 failed; 2 a bad --at; 78 a bad setting.

    Example: fleet-import freshness --json
    """
    from fleet_import.freshness.runtime import freshness_runtime

    now = parse_moment(at)
    settings = require_settings(FRESHNESS)
    with foreseen_errors():
        runtime = freshness_runtime(settings)
        verdicts = runtime.judge(now)
    if as_json:
        typer.echo(json.dumps([v.to_json() for v in verdicts], indent=2))
        return
    if not verdicts:
        _console.print(
            "no freshness SLOs: FLEET_FRESHNESS names no default and no registered tenant "
            "has overrides.freshness (or no tenant is known yet)"
        )
        return
    table = Table(
        "tenant", "dataset", "last loaded", "expected by", "state", "found",
        title=f"freshness at {_when(now)}",
    )
    for verdict in verdicts:
        table.add_row(*_row(verdict))
    _console.print(table)


def _row(verdict: Verdict) -> list[Text]:
    from fleet_import.freshness.check import FRESH, OFF

    style = {FRESH: "green", OFF: "dim"}.get(verdict.state, "red")
    return [
        Text(verdict.tenant_id),
        Text(verdict.dataset),
        Text(_when(verdict.last_loaded) or "never"),
        Text(_when(verdict.expected_by)),
        Text(verdict.state, style),
        Text(verdict.found),
    ]


def parse_moment(at: str | None, option: str = "--at") -> dt.datetime:
    """An ISO 8601 time given as `option`, in UTC (UTC when it names no zone); now if None."""
    if at is None:
        return dt.datetime.now(dt.UTC)
    try:
        moment = dt.datetime.fromisoformat(at)
    except ValueError:
        error_line(f"{option} {at!r}: expected an ISO 8601 time like 2026-07-22T06:30+02:00")
        raise typer.Exit(2) from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)).astimezone(dt.UTC)


def _when(moment: dt.datetime | None) -> str:
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M UTC") if moment else ""
