"""The test databases' pool (tests/pgpool.py) hands a test nothing an earlier test left: what
its cleanup undoes is undone, and anything else makes it clone the template afresh."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from tests import pgtools
from tests.pgpool import DatabasePool, fingerprint


@pytest.fixture
def pool(pg_server_url: str, migrated_template: str) -> Iterator[DatabasePool]:
    pool = DatabasePool(pg_server_url, migrated_template)
    yield pool
    pool.close()


def _used(pool: DatabasePool, admin_url: str, *statements: str) -> tuple[str, bool]:
    """A database taken, `statements` run in it, handed back: its name, and whether the pool
    kept it for the next test."""
    name = pool.take()
    with psycopg.connect(pgtools.with_dbname(admin_url, name), autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement.format(db=f'"{name}"'))
    kept = len(pool._free)
    pool.give_back(name)
    return name, len(pool._free) > kept


def test_what_the_cleanup_undoes_is_reused_as_the_template(
    pool: DatabasePool, pg_server_url: str, migrated_template: str
) -> None:
    name, kept = _used(
        pool,
        pg_server_url,
        "CREATE SCHEMA curated",
        "CREATE TABLE curated.t (v int)",
        "CREATE VIEW public.stv_sessions AS SELECT 1 AS process",
        "SELECT nextval('ingestion_batch_number')",
        "INSERT INTO freshness_states (tenant_id, dataset, state) VALUES ('acme', 'trips', 'late')",
        "GRANT CONNECT, TEMP ON DATABASE {db} TO pg_monitor",
    )
    assert kept
    reused = pool.take()
    assert reused != name  # renamed: whatever still holds the old URL reaches nothing
    url = pgtools.with_dbname(pg_server_url, reused)
    assert fingerprint(url) == fingerprint(pgtools.with_dbname(pg_server_url, migrated_template))
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute("SELECT nextval('ingestion_batch_number')").fetchone() == (1,)
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(pgtools.with_dbname(pg_server_url, name)).close()
    pool.give_back(reused)


@pytest.mark.parametrize(
    "statement",
    [
        "CREATE INDEX ix_extra ON ingestion_batches (tenant_id)",
        "ALTER TABLE ingestion_batches ADD COLUMN extra int",
        "ALTER DATABASE {db} SET default_transaction_isolation = 'serializable'",
        "CREATE TYPE public.mood AS ENUM ('late')",
        "GRANT USAGE ON SCHEMA public TO pg_monitor",
        "UPDATE alembic_version SET version_num = 'elsewhere'",
    ],
)
def test_anything_else_left_behind_is_dropped(
    pool: DatabasePool, pg_server_url: str, statement: str
) -> None:
    _, kept = _used(pool, pg_server_url, statement)
    assert not kept


def test_a_session_left_open_is_ended(pool: DatabasePool, pg_server_url: str) -> None:
    name = pool.take()
    url = pgtools.with_dbname(pg_server_url, name)
    with psycopg.connect(url) as left_open:
        left_open.execute(
            "INSERT INTO freshness_states (tenant_id, dataset, state) VALUES ('a', 'trips', 'late')"
        )
        pool.give_back(name)  # its transaction open, as a frozen process's would be
        with pytest.raises(psycopg.OperationalError):
            left_open.execute("SELECT 1")
