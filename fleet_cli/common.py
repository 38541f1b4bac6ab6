"""What the command modules share: the consoles, the options every command spells alike,
the operational database's settings, batch ids as an operator types them, and the final
state's line and exit code. Below every command module (cli.py registers them), so none
imports the command back."""

from __future__ import annotations

import re
import uuid
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.text import Text

from fleet_cli.guard import error_line, require_settings
from fleet_import.checks.settings import OPERATIONAL

if TYPE_CHECKING:
    from prefect.states import State

    from fleet_import.config import Settings
    from fleet_import.store.repository import BatchRepository

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
JsonOption = Annotated[
    bool, typer.Option("--json", help="print JSON (full ids, ISO times) and nothing else")
]

# Hex digits, dashes allowed (a pasted piece of an id); four at least, as git asks of a
# commit. All 32 are a full id, looked up as such.
_ID_PREFIX = re.compile(r"[0-9a-fA-F][0-9a-fA-F-]{3,35}")
_UUID_DIGITS = 32
_AMBIGUOUS_SHOWN = 3


def store_settings(value: str | None) -> Settings:
    """The operational database's settings (its URL, its reply bound), checked first
    (CONFIGURATION_ERROR)."""
    return require_settings(OPERATIONAL, database_url=value)


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print `message` as the error line; raise what this returns to exit with `code`."""
    error_line(message)
    return typer.Exit(code)


def parse_batch_id(value: str, expected: str = "a UUID") -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise fail(f"{value!r} is not a batch id ({expected})", 2) from None  # a usage error


def full_batch_id(value: str) -> uuid.UUID | None:
    """A full id; None for a prefix, to look up (`resolve_batch_id`); anything else is a
    usage error, said before any setting is read."""
    if not _ID_PREFIX.fullmatch(value) or len(value.replace("-", "")) >= _UUID_DIGITS:
        return parse_batch_id(value, "a UUID, or a unique prefix of at least 4 hex digits")
    return None


def resolve_batch_id(value: str, repo: BatchRepository) -> uuid.UUID:
    """A full id, or a prefix (as `batches list` prints in 80 columns) naming one batch."""
    full = full_batch_id(value)
    if full is not None:
        return full
    matches = repo.ids_with_prefix(value, limit=_AMBIGUOUS_SHOWN + 1)
    if not matches:
        raise fail(f"no batch id starts with {value!r}", 2)
    if len(matches) > 1:
        some = ", ".join(str(m) for m in matches[:_AMBIGUOUS_SHOWN])
        more = ", ..." if len(matches) > _AMBIGUOUS_SHOWN else ""
        raise fail(f"{value!r} is ambiguous: batches {some}{more}; give more digits", 2)
    return matches[0]


def report_state(state: State) -> None:
    """Print the final state line (one line, for scripts) and exit with its code."""
    from flows.reporting import ExitCode, exit_code_for

    code = exit_code_for(state)
    colour = {ExitCode.SUCCEEDED: "green", ExitCode.FAILED: "red"}.get(code, "yellow")
    console.print(Text.assemble((state.name, colour), ": ", state.message or ""), soft_wrap=True)
    raise typer.Exit(int(code))
