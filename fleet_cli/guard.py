"""What every command does before and around its work: settings checked before anything
starts (exit CONFIGURATION_ERROR), the services it needs probed, and a foreseen error printed
as one line with the next step. A traceback only for a bug, or with --debug / FLEET_DEBUG=1.

Prefect is imported only once the settings passed: a configuration error answers in well
under a second."""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Collection, Iterator
from contextlib import contextmanager

import typer
from rich.console import Console
from rich.text import Text

from fleet_import.checks.settings import IMPORTS, SettingsInvalid, Uses, check_settings
from fleet_import.config import Settings

CONFIGURATION_ERROR = 78
"""sysexits.h's EX_CONFIG: the settings are wrong and nothing was started (README's exit-code table;
flows/reporting.py ExitCode.CONFIGURATION_ERROR is the same number)."""
FAILED = 1
DEBUG_VARIABLE = "FLEET_DEBUG"
# Prefect's temporary API (no PREFECT_API_URL) migrates its SQLite database on first start:
# tens of seconds on a busy 2-core machine, past Prefect's default wait (flows/demo.py).
EPHEMERAL_STARTUP_TIMEOUT_SECONDS = "120"
_EPHEMERAL_TIMEOUT_VARIABLE = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"
# Its telemetry service would report to Prefect's servers; without a way out (a firewall, no
# network) it logs an ERROR into the run's output (flows/demo.py turns it off too).
_ANALYTICS_VARIABLE = "PREFECT_SERVER_ANALYTICS_ENABLED"
_PREFECT_PROBE_TIMEOUT_SECONDS = 5.0
_POINT_AT_A_SERVER = (
    "start one (`prefect server start`) and set PREFECT_API_URL=http://127.0.0.1:4200/api"
)

err_console = Console(stderr=True)


def debugging() -> bool:
    return os.environ.get(DEBUG_VARIABLE, "").lower() not in ("", "0", "false", "no")


def error_line(message: str) -> None:
    """One line on stderr, never wrapped (scripts grep it), never parsed as markup."""
    err_console.print(Text.assemble(("error:", "red"), " ", message), soft_wrap=True)


def warning_line(message: str) -> None:
    """A note the user should read, on stderr, one line: something chosen for them."""
    err_console.print(Text.assemble(("warning:", "yellow"), " ", message), soft_wrap=True)


def debug_traceback(exc: BaseException | None) -> None:
    """With --debug / FLEET_DEBUG=1, a foreseen error's traceback, printed before its line."""
    if exc is not None and debugging():
        traceback.print_exception(exc, file=sys.stderr)


def require_settings(
    uses: Collection[Uses], *, flow: bool = False, **overrides: object
) -> Settings:
    """The settings in force (blocks.settings_in_force: the environment, then Prefect
    blocks, then the defaults; `overrides`: a command's options over them), or every problem
    printed and CONFIGURATION_ERROR. A command that runs a `flow` says itself that the
    Prefect API does not answer."""
    from blocks.settings_in_force import settings_in_force

    resolved, problems = settings_in_force(tell=warning_line, say_unread=not flow)
    given = {k: v for k, v in overrides.items() if v is not None}
    settings = resolved.settings.model_copy(update=given) if given else resolved.settings
    try:
        check_settings(uses, settings=settings)
    except SettingsInvalid as exc:
        debug_traceback(exc)
        problems = [*problems, *exc.problems]
    if problems:
        for problem in problems:
            error_line(str(problem))
        raise typer.Exit(CONFIGURATION_ERROR) from None
    return settings


def prefect_ready() -> None:
    """Before a flow runs in this process: a configured API must answer; with none, the
    temporary one Prefect starts gets a start-up wait that holds on a busy machine, and no
    telemetry. An operator's own values win."""
    url = os.environ.get("PREFECT_API_URL")
    if not url:
        os.environ.setdefault(_EPHEMERAL_TIMEOUT_VARIABLE, EPHEMERAL_STARTUP_TIMEOUT_SECONDS)
        os.environ.setdefault(_ANALYTICS_VARIABLE, "false")
        return
    import httpx

    try:
        httpx.get(url.rstrip("/") + "/health", timeout=_PREFECT_PROBE_TIMEOUT_SECONDS)
    except httpx.HTTPError as exc:
        debug_traceback(exc)
        error_line(
            f"the Prefect API at PREFECT_API_URL does not answer ({type(exc).__name__}): "
            f"start it, or fix PREFECT_API_URL; unset it to run on a temporary local API"
        )
        raise typer.Exit(FAILED) from None


def services_ready(settings: Settings) -> None:
    """Before Prefect starts: an operational database that does not answer or was never
    migrated, or a warehouse that does not answer, is said in one line now rather than
    after the temporary API's start-up."""
    from fleet_import.checks.services import check_operational_database, check_warehouse

    for check in check_operational_database(settings.database_url):
        if check.ok is False:
            reason = check.reason
            if not reason.startswith("operational database"):
                reason = f"operational database: {reason}"
            debug_traceback(check.error)
            error_line(f"{reason}: {check.fix}")
            raise typer.Exit(FAILED)
    for reachable in check_warehouse(settings, reachable_only=True):
        if reachable.ok is False:
            debug_traceback(reachable.error)
            error_line(f"{reachable.reason}: {reachable.fix}")
            raise typer.Exit(FAILED)


def ready_to_run(
    uses: Collection[Uses] = IMPORTS, *, flow: bool = True, **overrides: object
) -> Settings:
    """What every command that imports, resumes, approves or rolls back does first: its
    settings (CONFIGURATION_ERROR), then, for one that runs a flow in this process, the
    Prefect API, then the operational database and the warehouse, each failure one line."""
    settings = require_settings(uses, flow=flow, **overrides)
    for field, value in overrides.items():  # the flow in this process reads the environment
        if value is not None:
            os.environ[f"FLEET_{field.upper()}"] = str(value)
    if flow:
        prefect_ready()
    services_ready(settings)
    return settings


def _prefect_advice(exc: BaseException) -> str | None:
    """Prefect's own failures to reach an API; matched by type where it has one. Its
    temporary server's start-up timeout is a bare RuntimeError: matched by its text."""
    if isinstance(exc, RuntimeError) and "ephemeral Prefect API" in str(exc):
        wait = os.environ.get(_EPHEMERAL_TIMEOUT_VARIABLE, "?")
        return f"the temporary Prefect API did not start within {wait} s: {_POINT_AT_A_SERVER}"
    import httpx

    if isinstance(exc, httpx.TransportError):
        return (
            f"the Prefect API does not answer ({type(exc).__name__}): "
            "check PREFECT_API_URL, or unset it to run on a temporary local API"
        )
    return None


@contextmanager
def foreseen_errors(code: int = FAILED) -> Iterator[None]:
    """A fleet-import error or a Prefect API that does not answer: one line and `code`.
    Anything else is a bug and keeps its traceback."""
    try:
        yield
    except (typer.Exit, typer.Abort, KeyboardInterrupt):
        raise
    except Exception as exc:
        from fleet_import.explain import explain

        line = explain(exc) or _prefect_advice(exc)
        if line is None:
            raise
        debug_traceback(exc)
        error_line(line)
        raise typer.Exit(code) from None
