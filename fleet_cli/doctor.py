"""`fleet-import doctor`: every connection an import needs, checked in the order an import
uses them, as `dbt debug` does before the first job. Exit 0 only when every check passes (a
skipped one, not applicable here, does not fail)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated

import typer
from pydantic import SecretStr
from rich.console import Console
from rich.table import Table
from rich.text import Text

from fleet_import.checks.settings import (
    FRESHNESS,
    IMPORTS,
    SettingProblem,
    SettingsInvalid,
    check_settings,
)
from fleet_import.config import ResolvedSettings, Settings, env_variable, masked_url

if TYPE_CHECKING:  # the probes import psycopg and botocore: only `doctor` itself needs them
    from fleet_import.checks.services import Check

DEFAULT_LANDING_BUCKET = "fleet-landing"  # the bucket prefect.yaml's trigger matches
_DEFAULT_DATABASE = "the default: FLEET_DATABASE_URL is not set"
_MARKS = {True: ("✓", "green"), False: ("✗", "red"), None: ("–", "dim")}


def _settings(resolved: ResolvedSettings, problems: list[SettingProblem]) -> Check:
    from fleet_import.checks.services import failed, passed

    settings = resolved.settings
    try:
        check_settings(IMPORTS | FRESHNESS, settings=settings)
    except SettingsInvalid as exc:
        problems += exc.problems
    if problems:
        return failed("settings", "; ".join(str(p) for p in problems), "set the variables named")
    blocks = sorted({s for s in resolved.sources.values() if s.startswith("block ")})
    read = f"; from {', '.join(blocks)} too" if blocks else ""
    return passed("settings", f"warehouse {settings.warehouse}, staging set{read}")


def shown_value(value: object) -> str:
    """A setting as doctor prints it: secrets masked, URLs without their password."""
    if value is None:
        return "(unset)"
    if isinstance(value, SecretStr):
        return "***"
    text = json.dumps(value) if isinstance(value, list) else str(value)
    return masked_url(text) if "://" in text else text


def settings_rows(resolved: ResolvedSettings) -> list[dict[str, str]]:
    """Every setting, the value a run uses and where it came from (environment, block, default)."""
    return [
        {
            "variable": env_variable(field),
            "value": shown_value(getattr(resolved.settings, field)),
            "source": resolved.source_of(field),
        }
        for field in Settings.model_fields
    ]


def settings_table(rows: list[dict[str, str]]) -> Table:
    table = Table("setting", "value", "source", title="settings in force", title_justify="left")
    for row in rows:
        table.add_row(Text(row["variable"]), Text(row["value"]), Text(row["source"]))
    return table


def run_checks(
    landing_bucket: str,
    queue_url: str | None,
    resolved: ResolvedSettings,
    problems: list[SettingProblem],
) -> Iterator[Check]:
    """The checks of what a run would use: the settings in force, resolved as a run does."""
    from fleet_import.checks import services

    settings = resolved.settings
    yield _settings(resolved, problems)
    yield from _operational_database(settings)
    yield from services.check_warehouse(settings)
    from dataclasses import replace

    from fleet_import.s3.client import S3Limits, s3_client

    # Two attempts: a doctor answers soon; an import gets the full settings.
    s3 = s3_client(settings.s3_endpoint_url, replace(S3Limits.of(settings), max_attempts=2))
    yield services.check_landing_bucket(s3, landing_bucket)
    yield services.check_staging(settings.staging_uri, lambda: s3)
    from fleet_cli.doctor_prefect import check_prefect

    yield from check_prefect(settings)
    if queue_url:
        import boto3

        from fleet_import.intake.relay import queue_region

        sqs = boto3.client(
            "sqs", endpoint_url=settings_sqs_endpoint(), region_name=queue_region(queue_url)
        )
        yield services.check_queue(sqs, queue_url)
    else:
        yield services.Check("relay queue", None, "FLEET_RELAY_QUEUE_URL is not set")


def _operational_database(settings: Settings) -> Iterator[Check]:
    """Its checks, the first (reachable) naming the URL it tried, password masked, and
    whether that is the default: with nothing set, a database on 127.0.0.1 answering must
    not pass for the one meant."""
    from dataclasses import replace

    from fleet_import.checks.services import check_operational_database

    checks = check_operational_database(settings.database_url)
    reachable = next(checks)
    default = "database_url" not in settings.model_fields_set
    if reachable.ok:  # its reason says `at <url>` already
        note = f" ({_DEFAULT_DATABASE})" if default else ""
    else:
        note = f"; tried {masked_url(settings.database_url)}"
        note += f", {_DEFAULT_DATABASE}" if default else ""
    yield replace(reachable, reason=reachable.reason + note)
    yield from checks


def settings_sqs_endpoint() -> str | None:
    """The relay's own option (--endpoint-url), read from the same variable."""
    return os.environ.get("FLEET_SQS_ENDPOINT_URL") or None


def checks_table(checks: list[Check]) -> Table:
    table = Table("", "check", "result", "fix", title="fleet-import doctor", title_justify="left")
    for check in checks:
        mark, colour = _MARKS[check.ok]
        table.add_row(Text(mark, colour), Text(check.name), Text(check.reason), Text(check.fix))
    return table


def doctor(
    landing_bucket: Annotated[
        str,
        typer.Option(
            envvar="FLEET_LANDING_BUCKET",
            show_envvar=True,
            help="the bucket tenants deliver to",
        ),
    ] = DEFAULT_LANDING_BUCKET,
    queue_url: Annotated[
        str | None,
        typer.Option(
            envvar="FLEET_RELAY_QUEUE_URL",
            show_envvar=True,
            help="the relay's SQS queue, checked when given",
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="print JSON (one object per check) and nothing else")
    ] = False,
) -> None:
    """Check every setting and connection an import needs, in order, with the fix for each.

    The settings in force, each with its source (environment, Prefect block, default), as a
    run resolves them; the operational database (reachable, migrated); the warehouse (reachable,
    curated tables, privileges); the landing bucket and the staging area (a small object
    written and deleted); the Prefect API, work pool, deployments, limits and blocks; the
    relay's queue. Exit 0 only when all pass.

    Example: fleet-import doctor --landing-bucket fleet-landing
    """
    from blocks.settings_in_force import settings_in_force
    from fleet_cli.guard import warning_line

    console = Console()
    resolved, problems = settings_in_force(tell=warning_line)
    checks = list(run_checks(landing_bucket, queue_url, resolved, problems))
    ok = all(check.ok is not False for check in checks)
    rows = settings_rows(resolved)
    if as_json:
        report = {"ok": ok, "checks": [c.to_json() for c in checks], "settings": rows}
        typer.echo(json.dumps(report, indent=2))
    else:
        console.print(settings_table(rows))
        console.print(checks_table(checks))
        failures = sum(check.ok is False for check in checks)
        console.print(
            Text("all checks passed", "green") if ok else Text(f"{failures} failed", "red")
        )
    raise typer.Exit(0 if ok else 1)
