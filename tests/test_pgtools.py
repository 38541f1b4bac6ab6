"""The suite's PostgreSQL (tests/pgtools.py): URLs built from their parts, and the embedded
server a machine without PostgreSQL gets, on a loopback TCP port (issue 53)."""

from __future__ import annotations

import shutil
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest

from tests import pgtools


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://postgres@127.0.0.1:5432/db", "postgresql://r1@127.0.0.1:5432/db"),
        ("postgresql://u:pw@db:6000/x?sslmode=allow", "postgresql://r1@db:6000/x?sslmode=allow"),
        # pgserver's own URL: the host is a socket directory, in the query.
        ("postgresql://postgres:@/postgres?host=/tmp/pg", "postgresql://r1@/postgres?host=/tmp/pg"),
        ("postgresql+psycopg://db/x", "postgresql://r1@db/x"),
    ],
)
def test_with_user_changes_the_login_and_nothing_else(url: str, expected: str) -> None:
    assert pgtools.with_user(url, "r1") == expected


@pytest.fixture
def datadir() -> Iterator[Path]:
    """A data directory of its own; its parent others may traverse, as pgserver's user must
    (pytest's tmp_path is 0700). The server is stopped and the directory deleted after."""
    parent = Path(tempfile.mkdtemp(prefix="fleet-embedded-test-"))
    parent.chmod(0o755)
    yield parent / "pgdata"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgserver

        if (parent / "pgdata" / "postmaster.pid").exists():
            server = pgserver.get_server(parent / "pgdata", cleanup_mode=None)
            pgserver.pg_ctl(["-w", "stop"], pgdata=parent / "pgdata", user=server.system_user)
    shutil.rmtree(parent, ignore_errors=True)


@pytest.mark.server  # starts its own embedded server
def test_the_embedded_server_listens_on_a_loopback_port_beside_its_socket(datadir: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgserver
        from pgserver.utils import PostmasterInfo

    url = pgtools.embedded_server_url(datadir)
    parts = urlsplit(url)
    assert (parts.hostname, parts.username, parts.path) == ("127.0.0.1", "postgres", "/postgres")
    info = PostmasterInfo.read_from_pgdata(datadir)
    with psycopg.connect(url) as conn:
        assert conn.execute("SHOW listen_addresses").fetchone() == ("127.0.0.1",)
    socket = f"postgresql://postgres@/postgres?host={info.socket_dir}&port={info.port}"
    with psycopg.connect(socket) as conn:  # pgserver's socket still answers
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert pgtools.embedded_server_url(datadir) == url  # found running: reused as it is

    # A server pgserver started on its own (a socket, no TCP port: an older suite's, or the
    # demo's way) is restarted with a port.
    server = pgserver.get_server(datadir, cleanup_mode=None)
    pgserver.pg_ctl(["-w", "stop"], pgdata=datadir, user=server.system_user)
    pgserver.pg_ctl(
        ["-w", "-o", '-h ""', "-o", f"-k {info.socket_dir}", "-l", str(datadir / "log"), "start"],
        pgdata=datadir,
        user=server.system_user,
    )
    assert PostmasterInfo.read_from_pgdata(datadir).hostname is None
    again = pgtools.embedded_server_url(datadir)
    assert pgtools.answers(again) and urlsplit(again).hostname == "127.0.0.1"
