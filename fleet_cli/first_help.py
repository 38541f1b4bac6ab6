"""What `fleet-import --help` says first: what the tool does, how to start, and the commands
in the order a new user needs them."""

from __future__ import annotations

import click
from typer.core import TyperGroup

TOOL_HELP = """Load tenants' S3 delivery folders into curated warehouse tables (Redshift, or
PostgreSQL for development) under Prefect: one running batch per tenant folder, every row
stamped with its batch, a failed publication resumed without reloading a row.

First time: `fleet-import doctor` checks every setting and connection and says how to fix
what fails; `fleet-import db upgrade` migrates the operational database; then
`fleet-import run --tenant acme s3://fleet-landing/acme/fleet/2026-07-22/`. With nothing
configured, `fleet-import demo` shows it all on embedded services.
"""
# The order a new user needs them in, not the alphabet's.
COMMAND_ORDER = (
    "doctor", "db", "run", "batches", "gate", "slices", "resume", "tenants", "contracts",
    "tables", "freshness", "metrics", "costs", "relay", "worker", "demo",
)


class InOrderOfUse(TyperGroup):
    def list_commands(self, ctx: click.Context) -> list[str]:
        names = super().list_commands(ctx)
        return sorted(names, key=lambda n: COMMAND_ORDER.index(n) if n in COMMAND_ORDER else 99)
