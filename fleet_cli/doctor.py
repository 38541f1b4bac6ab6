"""`fleet-import doctor`: every connection an import needs, checked in the order an import
uses them, as `dbt debug` does before the first job. Exit 0 only when every check passes (a
skipped one, not applicable here, does not fail)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from fleet_import.checks.settings import (
    FRESHNESS,
    IMPORTS,
    SettingsInvalid,
    check_settings,
    read_settings,
)
from fleet_import.config import Settings, masked_url

if TYPE_CHECKING:  # the probes import psycopg and botocore: only `doctor` itself needs them
    from fleet_import.checks.services import Check

DEFAULT_LANDING_BUCKET = "fleet-landing"  # the bucket prefect.yaml's trigger matches
_DEFAULT_DATABASE = "the default: FLEET_DATABASE_URL is not set"
_MARKS = {True: ("✓", "green"), False: ("✗", "red"), None: ("–", "dim")}


def _settings() -> tuple[Settings, Check]:
    from fleet_import.checks.services import failed, passed

    settings, problems = read_settings()
    try:
        check_settings(IMPORTS | FRESHNESS, settings=settings)
    except SettingsInvalid as exc:
        problems += exc.problems
    if problems:
        return settings, failed(
            "settings", "; ".join(str(p) for p in problems), "set the variables named"
        )
    return settings, passed("settings", f"warehouse {settings.warehouse}, staging set")


def run_checks(landing_bucket: str, queue_url: str | None) -> Iterator[Check]:
    from fleet_import.checks import services

    settings, settings_check = _settings()
    yield settings_check
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

    Settings; the operational database (reachable, migrated); the warehouse (reachable,
    curated tables, privileges); the landing bucket and the staging area (a small object
    written and deleted); the Prefect API, work pool, deployments, limits and blocks; the
    relay's queue. Exit 0 only when all pass.

    Example: fleet-import doctor --landing-bucket fleet-landing
    """
    console = Console()
    checks: list[Check] = []
    for check in run_checks(landing_bucket, queue_url):
        checks.append(check)
    ok = all(check.ok is not False for check in checks)
    if as_json:
        typer.echo(json.dumps({"ok": ok, "checks": [c.to_json() for c in checks]}, indent=2))
    else:
        console.print(checks_table(checks))
        failures = sum(check.ok is False for check in checks)
        console.print(
            Text("all checks passed", "green") if ok else Text(f"{failures} failed", "red")
        )
    raise typer.Exit(0 if ok else 1)
