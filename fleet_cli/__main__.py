"""`python -m fleet_cli` is the `fleet-import` command."""

from fleet_cli.cli import app

app()
