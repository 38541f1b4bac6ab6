"""The least-privilege loading user the Redshift tests connect as (docs/redshift.md,
"Database grants"): a login role, no superuser, that may use and create in
the schemas an administrator created beforehand and create session temp tables: nothing
more. Everything it loads it creates, and so owns (LOCK, ALTER COLUMN ... TYPE)."""

from __future__ import annotations

import contextlib

import psycopg

from fleet_import.config import libpq_url
from fleet_import.warehouse.sql import quote_identifier

LOADER = "fleet_redshift_loader"
"""A role of the test server (roles are server-wide); its grants are per test database."""
SCHEMAS = ("curated", "select")
"""What the tests' contracts and the slice registry use, created by the administrator."""


def grant_statements(database: str, user: str = LOADER) -> list[str]:
    """The grants, as an administrator runs them on Redshift (and on the test PostgreSQL)."""
    db = quote_identifier(database)
    statements = [f"GRANT CONNECT, TEMP ON DATABASE {db} TO {user}"]
    for schema in SCHEMAS:
        statements += [
            f"CREATE SCHEMA IF NOT EXISTS {quote_identifier(schema)}",
            f"GRANT USAGE, CREATE ON SCHEMA {quote_identifier(schema)} TO {user}",
        ]
    return statements


def create_loader(database_url: str) -> str:
    """The loading user, with only `grant_statements` in the test's database; its name."""
    with psycopg.connect(libpq_url(database_url), autocommit=True) as conn:
        # Once per server; parallel workers may race to it.
        with contextlib.suppress(psycopg.errors.DuplicateObject, psycopg.errors.UniqueViolation):
            conn.execute(f"CREATE ROLE {LOADER} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE")
        for statement in grant_statements(conn.info.dbname):
            conn.execute(statement)
    return LOADER


def give(conn: psycopg.Connection, user: str, *tables: str) -> None:
    """Tables an administrator created, handed to the loader (docs/redshift.md: its owner)."""
    for table in tables:
        conn.execute(f"ALTER TABLE {table} OWNER TO {user}")
