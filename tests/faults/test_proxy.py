"""The fault proxy itself, against the real PostgreSQL: each fault does what it says, and
after it the proxy forwards again."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from fleet_import.config import libpq_url
from tests import pgtools
from tests.faults.proxy import FaultProxy, postgres_address, proxied_url

pytestmark = [pytest.mark.faults, pytest.mark.faults_sample]


@pytest.fixture
def proxy(pg_server_url: str) -> Iterator[FaultProxy]:
    with FaultProxy(postgres_address(pg_server_url)) as running:
        yield running


@pytest.fixture
def table_db(pg_server_url: str) -> Iterator[str]:
    name = pgtools.unique_name("proxy")
    url = pgtools.create_database(pg_server_url, name)
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        conn.execute("CREATE TABLE marks (id uuid PRIMARY KEY)")
    yield url
    pgtools.drop_database(pg_server_url, name)


def _connect(url: str, proxy: FaultProxy, **kwargs: object) -> psycopg.Connection:
    return psycopg.connect(libpq_url(proxied_url(url, proxy)), connect_timeout=3, **kwargs)


def test_passes_queries_through(proxy: FaultProxy, table_db: str) -> None:
    with _connect(table_db, proxy) as conn:
        assert conn.execute("SELECT 41 + 1").fetchone() == (42,)
        with conn.cursor() as cursor, cursor.copy("COPY marks (id) FROM STDIN") as copy:
            for _ in range(500):
                copy.write_row((uuid.uuid4(),))
        conn.commit()
        assert conn.execute("SELECT count(*) FROM marks").fetchone() == (500,)


def test_reset_all_cuts_open_connections_and_new_ones_work(
    proxy: FaultProxy, table_db: str
) -> None:
    conn = _connect(table_db, proxy)
    conn.execute("SELECT 1")
    proxy.reset_all()
    with pytest.raises(psycopg.OperationalError):
        conn.execute("SELECT 1")
    conn.close()
    with _connect(table_db, proxy) as again:
        assert again.execute("SELECT 1").fetchone() == (1,)


def test_black_hole_accepts_and_never_answers(proxy: FaultProxy, table_db: str) -> None:
    proxy.black_hole()
    started = time.monotonic()
    with pytest.raises(psycopg.OperationalError):
        _connect(table_db, proxy)  # connect_timeout=3: the server's greeting never comes
    assert time.monotonic() - started >= 2.5
    proxy.pass_through()
    with _connect(table_db, proxy) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_delay_and_stall_hold_each_answer(proxy: FaultProxy, table_db: str) -> None:
    with _connect(table_db, proxy) as conn:
        proxy.delay(0.3)
        started = time.monotonic()
        conn.execute("SELECT 1")
        assert time.monotonic() - started >= 0.55  # the query and its answer, each held
        proxy.delay(0)
        proxy.stall(1.5)
        started = time.monotonic()
        conn.execute("SELECT 1")
        assert time.monotonic() - started >= 1.3  # held: a busy host only adds to it


def test_refuse_closes_the_door_for_a_while(proxy: FaultProxy, table_db: str) -> None:
    proxy.refuse(1.5)
    time.sleep(0.2)
    with pytest.raises(psycopg.OperationalError, match="refused"):
        _connect(table_db, proxy)
    time.sleep(1.6)
    with _connect(table_db, proxy) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


@pytest.mark.parametrize("protocol", ["simple", "prepared"])
def test_lost_commit_reply_commits_but_the_client_never_hears(
    proxy: FaultProxy, table_db: str, protocol: str
) -> None:
    """The trigger: the COMMIT reaches the server (the row is there), its answer never
    reaches the client, the connection is cut, and new connections are refused a while.
    `after` picks the transaction: an earlier COMMIT of the same session goes through.
    The door stays shut until `pass_through`: a 1 s window once closed before a slow CI
    host got to the second connect."""
    mark = uuid.uuid4()
    fired = proxy.lose_reply(r"^\s*commit", after=r"insert into marks", then_refuse=600)
    conn = _connect(table_db, proxy, prepare_threshold=0 if protocol == "prepared" else None)
    conn.execute("SELECT 1")
    conn.commit()  # before the INSERT: forwarded and answered
    conn.execute("INSERT INTO marks (id) VALUES (%s)", (mark,))
    with pytest.raises(psycopg.OperationalError):
        if protocol == "prepared":
            conn.execute("COMMIT", prepare=True)
        else:
            conn.commit()
    conn.close()
    assert fired.is_set()
    with pytest.raises(psycopg.OperationalError, match="refused"):
        _connect(table_db, proxy)
    proxy.pass_through()
    with _connect(table_db, proxy) as check:
        assert check.execute("SELECT count(*) FROM marks WHERE id = %s", (mark,)).fetchone() == (1,)


def test_reset_on_and_stall_on_act_on_the_matching_message(
    proxy: FaultProxy, table_db: str
) -> None:
    mark = uuid.uuid4()
    fired = proxy.reset_on(r"insert into marks")
    with _connect(table_db, proxy) as conn:
        conn.execute("SELECT 1")
        with pytest.raises(psycopg.OperationalError):
            conn.execute("INSERT INTO marks (id) VALUES (%s)", (mark,))
    assert fired.is_set()
    proxy.stall_on(r"insert into marks", 1.0)
    with _connect(table_db, proxy) as conn:
        started = time.monotonic()
        conn.execute("INSERT INTO marks (id) VALUES (%s)", (mark,))
        assert time.monotonic() - started >= 0.9
        conn.commit()
        assert conn.execute("SELECT count(*) FROM marks").fetchone() == (1,)


# -- the URLs the proxy is given and gives (issue 53) ---------------------------------------


def test_the_proxy_takes_its_upstream_from_the_urls_parts() -> None:
    assert postgres_address("postgresql://postgres@127.0.0.1:5999/db") == ("127.0.0.1", 5999)
    assert postgres_address("postgresql+psycopg://u:pw@db.internal/fleet") == ("db.internal", 5432)
    assert postgres_address("postgresql://u@/fleet?host=db&port=6000") == ("db", 6000)
    # A Unix socket (pgserver's own URL; libpq's default with no host) is refused, not
    # guessed to be 127.0.0.1:5432, where another server may answer.
    for socket_url in ("postgresql://postgres:@/postgres?host=/tmp/pgdata", "postgresql:///x"):
        with pytest.raises(ValueError, match="needs a PostgreSQL on one TCP host and port"):
            postgres_address(socket_url)


def test_a_proxied_url_names_only_the_proxy() -> None:
    class Proxy:
        port = 4321

    proxy = Proxy()
    tcp = proxied_url("postgresql://postgres@127.0.0.1:5432/db?options=-c%20x%3D1+2", proxy)
    assert tcp == "postgresql://postgres@127.0.0.1:4321/db?options=-c%20x%3D1+2&sslmode=disable"
    # Query parameters naming a server override the URL's host for libpq: dropped.
    socket = proxied_url("postgresql://postgres:@/db?host=/tmp/pgdata&port=5432", proxy)
    assert socket == "postgresql://postgres:@127.0.0.1:4321/db?sslmode=disable"
    kept = proxied_url("postgresql://u:p@db/x?sslmode=require&hostaddr=10.0.0.1", proxy)
    assert kept == "postgresql://u:p@127.0.0.1:4321/x?sslmode=require"
