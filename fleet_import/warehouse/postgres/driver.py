"""psycopg connections to the PostgreSQL warehouse, and the one place where what they raise
becomes a WarehouseError."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from fleet_import.bounded_connection import (
    REPLY_LOST,
    ReplyTimeout,
    connect_bounded,
    server_address,
)
from fleet_import.error_table import psycopg_kind
from fleet_import.warehouse.base import WarehouseError
from fleet_import.warehouse.postgres.binary_copy import EncodeError, SourceError


def unreachable(address: str | None = None) -> str:
    """Why the warehouse was not reached, naming the host:port tried when known."""
    at = f" at {address}" if address else ""
    return (
        f"could not reach the warehouse{at} (is it up, is FLEET_WAREHOUSE_URL right, are there "
        "free connections?)"
    )


CONNECTION_HINT = unreachable()


def connect(conninfo: str, reply_timeout: float | None = None) -> psycopg.Connection[Any]:
    """Bounded like every connection of ours (fleet_import.bounded_connection)."""
    try:
        return connect_bounded(conninfo, reply_timeout)
    except psycopg.Error as exc:
        raise translate(exc, address=server_address(conninfo)) from None


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


def translate(exc: psycopg.Error, *, address: str | None = None) -> WarehouseError:
    """Driver errors become ours, of the kind the classification table gives them.
    `address`: the host:port a failed connection tried, named where no SQLSTATE is."""
    state = exc.sqlstate
    # Never the driver's own text without a SQLSTATE: a connection error can quote the
    # connection string, and with it part of a password.
    reason = (exc.diag.message_primary or type(exc).__name__) if state else unreachable(address)
    if isinstance(exc, ReplyTimeout):
        reason = f"{exc} (FLEET_WAREHOUSE_REPLY_TIMEOUT_SECONDS): {REPLY_LOST}"
    code = f", SQLSTATE {state}" if state else ""
    return WarehouseError(
        f"warehouse error ({type(exc).__name__}{code}): {reason}",
        kind=psycopg_kind(exc),
        code=state,
    )
