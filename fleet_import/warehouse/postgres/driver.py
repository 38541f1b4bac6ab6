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
from fleet_import.errors import WarehouseError
from fleet_import.warehouse.postgres.binary_copy import EncodeError, SourceError

WAREHOUSE_URL = "FLEET_WAREHOUSE_URL"
"""The variable a PostgreSQL warehouse's URL comes from, unless it is the operational
database's (FLEET_DATABASE_URL, when FLEET_WAREHOUSE_URL is not set): Settings.
warehouse_url_setting, which the warehouse's errors name."""


def unreachable(address: str | None = None, setting: str = WAREHOUSE_URL) -> str:
    """Why the warehouse was not reached, naming the host:port tried when known."""
    at = f" at {address}" if address else ""
    return (
        f"could not reach the warehouse{at} (is it up, is {setting} right, are there "
        "free connections?)"
    )


def connect(
    conninfo: str, reply_timeout: float | None = None, setting: str = WAREHOUSE_URL
) -> psycopg.Connection[Any]:
    """Bounded like every connection of ours (fleet_import.bounded_connection)."""
    try:
        return connect_bounded(conninfo, reply_timeout)
    except psycopg.Error as exc:
        raise translate(exc, address=server_address(conninfo), setting=setting) from None


@contextmanager
def translated(setting: str = WAREHOUSE_URL) -> Iterator[None]:
    """The boundary: what the driver raises, and a normalized file that cannot be read or
    encoded, leave as WarehouseError."""
    try:
        yield
    except psycopg.Error as exc:
        raise translate(exc, setting=setting) from None
    except (SourceError, EncodeError) as exc:
        raise WarehouseError(f"cannot load a normalized file: {exc}") from exc


def translate(
    exc: psycopg.Error, *, address: str | None = None, setting: str = WAREHOUSE_URL
) -> WarehouseError:
    """Driver errors become ours, of the kind the classification table gives them.
    `address`: the host:port a failed connection tried, named where no SQLSTATE is;
    `setting`: the variable the warehouse's URL came from, named in what to check."""
    state = exc.sqlstate
    # Never the driver's own text without a SQLSTATE: a connection error can quote the
    # connection string, and with it part of a password.
    reason = (
        (exc.diag.message_primary or type(exc).__name__) if state else unreachable(address, setting)
    )
    if isinstance(exc, ReplyTimeout):
        reason = f"{exc} (FLEET_WAREHOUSE_REPLY_TIMEOUT_SECONDS): {REPLY_LOST}"
    code = f", SQLSTATE {state}" if state else ""
    return WarehouseError(
        f"warehouse error ({type(exc).__name__}{code}): {reason}",
        kind=psycopg_kind(exc),
        code=state,
        setting=setting,
    )
