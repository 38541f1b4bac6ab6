"""Test databases: find a PostgreSQL, migrate a template once, clone it per test.

The suite uses FLEET_TEST_DATABASE_URL (default: the local server on 127.0.0.1:5432); where
nothing answers there it starts the embedded server from the pgserver wheel, so the tests
pass on a machine with no PostgreSQL installed.
"""

from __future__ import annotations

import os
import tempfile
import uuid
import warnings
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
from alembic import command
from alembic.config import Config

from fleet_import.config import libpq_url
from tests.no_servers import refuse_servers

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TEST_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
_EMBEDDED_DATADIR = Path(tempfile.gettempdir()) / "fleet-import-test-pgdata"


def with_dbname(url: str, dbname: str) -> str:
    parts = urlsplit(libpq_url(url))
    return urlunsplit(parts._replace(path="/" + dbname))


def answers(url: str) -> bool:
    try:
        with psycopg.connect(libpq_url(url), connect_timeout=3):
            return True
    except psycopg.OperationalError:
        return False


def server_url() -> str:
    refuse_servers("PostgreSQL (FLEET_TEST_DATABASE_URL, or the embedded pgserver)")
    url = os.environ.get("FLEET_TEST_DATABASE_URL", DEFAULT_TEST_URL)
    if answers(url):
        return url
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgserver

        # Shared by every xdist worker and left running: pgserver reuses a live server
        # for the same data directory.
        server = pgserver.get_server(_EMBEDDED_DATADIR, cleanup_mode=None)
    return server.get_uri()


def alembic_config(url: str) -> Config:
    config = Config(str(REPO / "alembic.ini"))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def migrate(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def create_database(admin_url: str, name: str, template: str | None = None) -> str:
    with psycopg.connect(libpq_url(admin_url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        # FILE_COPY: a test's database is a copy of a small template, made in a third of the
        # time WAL_LOG (PostgreSQL 15's default) takes to log every page of it.
        template_sql = f' TEMPLATE "{template}"' if template else ""
        conn.execute(f'CREATE DATABASE "{name}"{template_sql} STRATEGY FILE_COPY')
    return with_dbname(admin_url, name)


def drop_database(admin_url: str, name: str) -> None:
    with psycopg.connect(libpq_url(admin_url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def unique_name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"
