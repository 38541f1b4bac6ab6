"""`fleet-import --help` teaches: what the tool does, the commands in the order a new user
needs them, and an example in every command's help."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from fleet_cli.cli import app

COMMANDS = (
    "doctor", "db upgrade", "run", "batches list", "batches show", "batches approve",
    "batches reject", "gate show", "slices list", "slices rollback", "resume",
    "tenants list", "tenants show", "tenants purge", "contracts show", "tables migrate",
    "freshness", "metrics serve", "costs", "relay", "worker", "demo",
)


def _help(*args: str) -> str:
    result = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    return result.output


def test_the_top_help_says_what_the_tool_does_and_lists_commands_in_order_of_use() -> None:
    text = _help()
    assert "Load tenants' S3 delivery folders into curated warehouse tables" in text
    listed = re.findall(r"^│ (\w+) ", text.split("Commands")[1], flags=re.MULTILINE)
    assert listed == [
        "doctor", "db", "run", "batches", "gate", "slices", "resume", "tenants", "contracts",
        "tables", "freshness", "metrics", "costs", "relay", "worker", "demo",
    ]


def test_every_command_has_an_example() -> None:
    for command in COMMANDS:
        assert f"Example: fleet-import {command.split()[0]}" in " ".join(
            _help(*command.split()).split()
        ) or "Example: FLEET_DATABASE_URL=" in _help(*command.split()), command
