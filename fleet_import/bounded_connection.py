"""psycopg connections whose every wait ends: TCP keepalives and a user timeout for a peer
gone silent on the network, and a reply bound for a peer TCP still sees alive. The one
implementation both the operational store and the PostgreSQL warehouse connect with (issue
#26: nothing stuck after an outage)."""

from __future__ import annotations

import os
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg.conninfo import conninfo_to_dict

CONNECT_TIMEOUT_SECONDS = 10
KEEPALIVE_IDLE_SECONDS = 30
KEEPALIVE_INTERVAL_SECONDS = 10
KEEPALIVE_COUNT = 3
TCP_USER_TIMEOUT_SECONDS = 60
KEEPALIVES = {
    "keepalives": 1,
    "keepalives_idle": KEEPALIVE_IDLE_SECONDS,
    "keepalives_interval": KEEPALIVE_INTERVAL_SECONDS,
    "keepalives_count": KEEPALIVE_COUNT,
    "tcp_user_timeout": TCP_USER_TIMEOUT_SECONDS * 1000,
}
"""libpq's TCP bounds for a server gone silent on the network (packets dropped, no reset):
an idle wait (a statement sent, its answer awaited) ends after 30 s + 3 probes 10 s apart,
and data the peer stops acknowledging (mid-COPY) after 60 s (`tcp_user_timeout`,
milliseconds). A long statement the server is still working on is untouched: its kernel
answers probes."""
CONNECT_ARGS = {"connect_timeout": CONNECT_TIMEOUT_SECONDS, **KEEPALIVES}
"""The same bounds for a connection with no reply bound (SQLAlchemy's, for the migrations:
a migration may wait on a lock or rewrite a table for longer than any import statement)."""


REPLY_LOST = "the server, or the network to it, stopped answering mid-statement"
_LIBPQ_DEFAULT_PORT = "5432"


def server_address(conninfo: str) -> str | None:
    """`host:port` a connection to `conninfo` tries (libpq's defaults where it names none;
    each of a multi-host list), never its user or password: what a failed connection names
    in place of the SQLSTATE it does not have. None when the URL does not say it cleanly."""
    try:
        params = conninfo_to_dict(conninfo)
    except psycopg.Error:
        return None
    # A password with an unencoded '@' or '/' is parsed all the same, a piece of it taken for
    # a host or a port ('u:p@SECRET@db' -> host 'SECRET@db'; 'u:1234/x@db' -> host 'u', port
    # '1234'). Only what the URL spells after its user part is named, or nothing.
    after_user = conninfo.rpartition("@")[2]
    named = [str(params.get(key) or "") for key in ("host", "hostaddr", "port")]
    if any(
        part not in after_user or "@" in part
        for value in named
        for part in value.split(",")
        if part
    ):
        return None
    host = named[0] or named[1] or os.environ.get("PGHOST") or ""
    port = named[2] or os.environ.get("PGPORT") or _LIBPQ_DEFAULT_PORT
    hosts, ports = host.split(","), port.split(",")
    if len(ports) != len(hosts):
        ports = ports[:1] * len(hosts)
    return ", ".join(f"{h or 'the local socket'}:{p}" for h, p in zip(hosts, ports, strict=True))


class ReplyTimeout(psycopg.OperationalError):
    """No answer came within the connection's reply bound; the connection was closed (its
    state is unknown: a statement may still be running, or may have committed)."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"no answer within {seconds:g} s")
        self.seconds = seconds


class BoundedConnection(psycopg.Connection[Any]):
    """A connection whose every wait for the server ends after `reply_timeout` seconds with
    ReplyTimeout (a connection error, no SQLSTATE: an answer that never came). It is for what
    TCP cannot see: a peer that acknowledges and never answers (a hung proxy, a load balancer
    holding the connection)."""

    reply_timeout: float | None = None

    def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
        if timeout is not None or not self.reply_timeout:
            return super().wait(gen, interval, timeout)
        try:
            return super().wait(gen, interval, self.reply_timeout)
        except pg_errors._WaitTimeout:  # psycopg's own: "callers should convert it"
            # Closed, so that nothing waits on it again (the rollback on the way out).
            self.close()
            raise ReplyTimeout(self.reply_timeout) from None


def connect_bounded(
    conninfo: str,
    reply_timeout: float | None,
    *,
    connect_timeout: int = CONNECT_TIMEOUT_SECONDS,
    **kwargs: Any,
) -> BoundedConnection:
    """A BoundedConnection with the keepalives; `kwargs` go to psycopg (`row_factory`).
    What psycopg raises is the caller's to translate."""
    conn = BoundedConnection.connect(
        conninfo, connect_timeout=connect_timeout, **KEEPALIVES, **kwargs
    )
    conn.reply_timeout = reply_timeout
    return conn
