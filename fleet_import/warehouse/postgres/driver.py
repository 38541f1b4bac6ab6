"""psycopg connections to the PostgreSQL warehouse, and the one place where what they raise
becomes a WarehouseError."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from fleet_import.error_table import psycopg_kind
from fleet_import.warehouse.base import WarehouseError
from fleet_import.warehouse.postgres.binary_copy import EncodeError, SourceError

_CONNECT_TIMEOUT_SECONDS = 10
KEEPALIVES = {
    "keepalives": 1,
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,
    "tcp_user_timeout": 60_000,
}
"""libpq's TCP bounds for a warehouse gone silent on the network (packets dropped, no reset):
an idle wait (a COMMIT sent, its answer awaited) ends after 30 s + 3 probes 10 s apart, and
data the peer stops acknowledging (mid-COPY) after 60 s (`tcp_user_timeout`, milliseconds).
A long statement the server is still working on is untouched: its kernel answers probes."""
CONNECTION_HINT = (
    "could not reach the warehouse (is it up, is FLEET_WAREHOUSE_URL right, are there free "
    "connections?)"
)


class BoundedConnection(psycopg.Connection[Any]):
    """A connection whose every wait for the server ends after `reply_timeout` seconds
    (psycopg raises a connection error, no SQLSTATE: an answer that never came). It is for
    what TCP cannot see: a peer that acknowledges and never answers (a hung proxy, a load
    balancer holding the connection)."""

    reply_timeout: float | None = None

    def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
        return super().wait(gen, interval, self.reply_timeout if timeout is None else timeout)


def connect(conninfo: str, reply_timeout: float | None = None) -> psycopg.Connection[Any]:
    with translated():
        conn = BoundedConnection.connect(
            conninfo, connect_timeout=_CONNECT_TIMEOUT_SECONDS, **KEEPALIVES
        )
    conn.reply_timeout = reply_timeout
    return conn


@contextmanager
def translated() -> Iterator[None]:
    """The boundary: what the driver raises, and a normalised file that cannot be read or
    encoded, leave as WarehouseError."""
    try:
        yield
    except psycopg.Error as exc:
        raise translate(exc) from None
    except (SourceError, EncodeError) as exc:
        raise WarehouseError(f"cannot load a normalised file: {exc}") from exc


def translate(exc: psycopg.Error) -> WarehouseError:
    """Driver errors become ours, of the kind the classification table gives them."""
    state = exc.sqlstate
    # Never the driver's own text without a SQLSTATE: a connection error can quote the
    # connection string, and with it part of a password.
    reason = (exc.diag.message_primary or type(exc).__name__) if state else CONNECTION_HINT
    return WarehouseError(
        f"warehouse error ({type(exc).__name__}, SQLSTATE {state}): {reason}",
        kind=psycopg_kind(exc),
        code=state,
    )
