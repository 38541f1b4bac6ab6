"""psycopg connections to the PostgreSQL warehouse, and the one place where what they raise
becomes a WarehouseError."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from fleet_import.warehouse.base import WarehouseError
from fleet_import.warehouse.postgres.binary_copy import EncodeError, SourceError

_CONNECT_TIMEOUT_SECONDS = 10
# SQLSTATEs worth a retry: connection exceptions (08), transaction rollbacks such as
# serialization failures and deadlocks (40), too many connections, server shutting down.
_TRANSIENT_CLASSES = frozenset({"08", "40"})
_TRANSIENT_STATES = frozenset({"53300", "57P01", "57P02", "57P03"})
CONNECTION_HINT = (
    "could not reach the warehouse (is it up, is FLEET_WAREHOUSE_URL right, are there free "
    "connections?)"
)


def connect(conninfo: str) -> psycopg.Connection[Any]:
    with translated():
        return psycopg.connect(conninfo, connect_timeout=_CONNECT_TIMEOUT_SECONDS)


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
    """Driver errors become ours by exception class and SQLSTATE, never by message text."""
    state = exc.sqlstate
    # Serialization failures and deadlocks are class 40; a dropped connection has no state.
    transient = isinstance(exc, psycopg.OperationalError) and (
        state is None or state[:2] in _TRANSIENT_CLASSES or state in _TRANSIENT_STATES
    )
    # Never the driver's own text without a SQLSTATE: a connection error can quote the
    # connection string, and with it part of a password.
    reason = (exc.diag.message_primary or type(exc).__name__) if state else CONNECTION_HINT
    return WarehouseError(
        f"warehouse error ({type(exc).__name__}, SQLSTATE {state}): {reason}",
        transient=transient,
    )
