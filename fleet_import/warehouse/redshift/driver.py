"""redshift_connector connections to Redshift: opening them, naming and ending their
sessions, and the one place where what they raise becomes a WarehouseError."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import redshift_connector

from fleet_import.error_table import network_kind, sqlstate_kind
from fleet_import.warehouse.base import WarehouseError
from fleet_import.warehouse.sql import Statement

DRIVER_ERRORS = (redshift_connector.Error, OSError)
"""What redshift_connector raises: its own errors, and socket errors it lets through."""


def connect(connect_kwargs: Mapping[str, Any]) -> Any:
    """A connection with autocommit off: every statement runs in the caller's transaction."""
    try:
        conn = redshift_connector.connect(**connect_kwargs)
        conn.autocommit = False
        return conn
    except DRIVER_ERRORS as exc:
        raise translate(exc) from None


def translate(exc: BaseException) -> WarehouseError:
    """Driver errors become ours, of the kind the classification table gives them; the
    message carries SQLSTATE and text, never parameters."""
    if isinstance(exc, OSError):
        return WarehouseError(f"warehouse connection failed: {exc}", kind=network_kind(exc))
    fields = exc.args[0] if exc.args and isinstance(exc.args[0], dict) else {}
    # Without the server's fields, an interface or operational error is a lost or refused
    # connection: the server rolled back.
    lost = isinstance(exc, redshift_connector.InterfaceError | redshift_connector.OperationalError)
    if lost and not fields:
        kind = sqlstate_kind(None, connection=True)
        return WarehouseError(f"warehouse connection failed: {exc.args[:1]}", kind=kind)
    state, message = fields.get("C") or None, fields.get("M", str(exc))
    return WarehouseError(
        f"warehouse error ({type(exc).__name__}, SQLSTATE {state}): {message}",
        kind=sqlstate_kind(state, message),
        code=state,
    )


def session_identity_sql() -> str:
    """This session's process id and start time (STV_SESSIONS), which name it uniquely."""
    return "SELECT process, starttime FROM stv_sessions WHERE process = pg_backend_pid()"


def end_session_sql(pid: int, started: str) -> Statement:
    """Terminate that session if it is still the one that started then (PG_TERMINATE_BACKEND:
    its transaction rolls back and its table locks are released)."""
    return (
        "SELECT pg_terminate_backend(process) FROM stv_sessions "
        "WHERE process = %s AND starttime = %s::timestamp",
        [int(pid), started],
    )
