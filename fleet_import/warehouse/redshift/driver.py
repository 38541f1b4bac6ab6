"""redshift_connector connections to Redshift: opening them, naming and ending their
sessions, and the one place where what they raise becomes a WarehouseError."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import redshift_connector

from fleet_import.warehouse.base import WarehouseError
from fleet_import.warehouse.sql import Statement

_SERIALIZATION_STATES = frozenset({"40001"})
# Redshift reports serializable isolation violations as "1023" in the message text (its
# SQLSTATE is the generic XX000), so this one case is recognised by its error number.
_SERIALIZATION_CODE = "1023"
_TRANSIENT_CLASSES = frozenset({"08", "40", "57"})

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
    """Driver errors become ours; the message carries SQLSTATE and text, never parameters."""
    if isinstance(exc, redshift_connector.InterfaceError | redshift_connector.OperationalError):
        fields = exc.args[0] if exc.args and isinstance(exc.args[0], dict) else {}
        if not fields:  # a lost or refused connection: the server rolled back
            return WarehouseError(f"warehouse connection failed: {exc.args[:1]}", transient=True)
    if isinstance(exc, OSError):
        return WarehouseError(f"warehouse connection failed: {exc}", transient=True)
    fields = exc.args[0] if exc.args and isinstance(exc.args[0], dict) else {}
    state, message = fields.get("C", ""), fields.get("M", str(exc))
    transient = (
        state in _SERIALIZATION_STATES
        or state[:2] in _TRANSIENT_CLASSES
        or message.lstrip().startswith(_SERIALIZATION_CODE)
    )
    return WarehouseError(
        f"warehouse error ({type(exc).__name__}, SQLSTATE {state or None}): {message}",
        transient=transient,
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
