"""Test databases: find a PostgreSQL, migrate a template once, clone it per test.

The suite uses FLEET_TEST_DATABASE_URL (default: the local server on 127.0.0.1:5432); where
nothing answers there it starts the embedded server from the pgserver wheel, so the tests
pass on a machine with no PostgreSQL installed. The embedded server listens on a loopback
TCP port as well as its Unix socket, and the suite is given its TCP URL: the fault proxy is
a TCP proxy, and a URL of host and port is what every test may take apart and rebuild.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
from alembic import command
from alembic.config import Config

from fleet_import.config import libpq_url
from tests.no_servers import refuse_servers

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TEST_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
_EMBEDDED_DATADIR = Path(tempfile.gettempdir()) / "fleet-import-test-pgdata"
_EMBEDDED_HOST = "127.0.0.1"
_EMBEDDED_START_SECONDS = 60


def with_dbname(url: str, dbname: str) -> str:
    parts = urlsplit(libpq_url(url))
    return urlunsplit(parts._replace(path="/" + dbname))


def with_user(url: str, user: str) -> str:
    """`url` logging in as `user`, without a password (the test servers trust local logins);
    host, port, database and options as they were, whatever form the host takes."""
    parts = urlsplit(libpq_url(url))
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{quote(user, safe='')}@{host}"))


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
    return embedded_server_url()


def embedded_server_url(datadir: Path = _EMBEDDED_DATADIR) -> str:
    """The TCP URL of the embedded server in `datadir`, started if it is not running.

    Shared by every xdist worker and left running for the next session. pgserver starts a
    server on a Unix socket only (`-h ""` on its command line, which no postgresql.conf
    overrides); the first session to find it so restarts it with the wheel's pg_ctl on a
    free loopback port too, keeping its socket."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgserver
        from pgserver.utils import PostmasterInfo, find_suitable_port

    with _exclusively(datadir.with_name(datadir.name + ".lock")):
        url = _listening(PostmasterInfo.read_from_pgdata(datadir))
        if url is None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                # Creates the data directory the first time (initdb, as its own system user
                # when we are root) and starts the server on its socket.
                server = pgserver.get_server(datadir, cleanup_mode=None)
            socket_dir = server.get_postmaster_info().socket_dir
            options = f"-h {_EMBEDDED_HOST} -p {find_suitable_port(_EMBEDDED_HOST)}"
            if socket_dir is not None:
                options += f" -k {socket_dir}"
            pgserver.pg_ctl(
                ["-w", "-l", str(datadir / "log"), "-o", options, "restart"],
                pgdata=datadir,
                user=server.system_user,
                timeout=_EMBEDDED_START_SECONDS,
            )
            url = _listening(PostmasterInfo.read_from_pgdata(datadir))
            assert url is not None, (datadir / "log").read_text()[-2000:]
    return url


def _listening(info: Any) -> str | None:
    """The TCP URL of the server a postmaster.pid describes, if it answers there (a server
    started by pgserver alone has no TCP port; a stale file's process is gone)."""
    if info is None or info.hostname != _EMBEDDED_HOST or not info.port:
        return None
    url = f"postgresql://postgres@{_EMBEDDED_HOST}:{info.port}/postgres"
    return url if answers(url) else None


@contextmanager
def _exclusively(lock_path: Path) -> Iterator[None]:
    """One process at a time (the xdist workers of a session start together)."""
    with lock_path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


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
