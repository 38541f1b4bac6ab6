"""redshift_connector connections to Redshift: opening them, naming and ending their
sessions, and the one place where what they raise becomes a WarehouseError."""

from __future__ import annotations

import logging
import re
import ssl
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import redshift_connector
from botocore.exceptions import BotoCoreError, ClientError

from fleet_import.bounded_connection import (
    KEEPALIVE_COUNT,
    KEEPALIVE_IDLE_SECONDS,
    KEEPALIVE_INTERVAL_SECONDS,
)
from fleet_import.error_table import classify, client_error_code, network_kind, sqlstate_kind
from fleet_import.errors import ErrorKind, WarehouseError
from fleet_import.warehouse.base import CommitOutcomeUnknown, WarehouseSession
from fleet_import.warehouse.sql import Statement

log = logging.getLogger(__name__)
Cursor = Any
"""A redshift_connector cursor."""

INTERNAL_ERRORS = (KeyError, IndexError, struct.error, UnicodeDecodeError)
"""What redshift_connector raises outside its own hierarchy when its state or a message is
not what it expected: 2.1.9-2.1.12 raise KeyError from the prepared-statement cache after
DDL or ROLLBACK (its issue #273; fixed in 2.1.13, the version pinned), and its message
parsing can fail on struct.unpack, an index or a decode. The session's state is not to be
trusted after one: the caller drops the connection, and the work is retried on a new one."""
DRIVER_ERRORS = (redshift_connector.Error, OSError, *INTERNAL_ERRORS)
"""What redshift_connector raises: its own errors, socket errors it lets through, and its
internal failures."""
_IAM_ERRORS = (BotoCoreError, ClientError)
"""What its IAM login lets through untranslated: botocore's errors (GetClusterCredentials)."""
_LOST = ("BrokenPipe", "connection is closed")
"""How redshift_connector words a connection that ended under it; it gives no code."""
BACKEND = "redshift"
"""What the errors translated here carry, so their next step names FLEET_REDSHIFT_*."""


KEEPALIVES = {
    "tcp_keepalive": True,
    "tcp_keepalive_idle": KEEPALIVE_IDLE_SECONDS,
    "tcp_keepalive_interval": KEEPALIVE_INTERVAL_SECONDS,
    "tcp_keepalive_count": KEEPALIVE_COUNT,
}
"""A network gone silent (packets dropped, no reset) while an answer is awaited ends in about
a minute (30 s idle, 3 probes 10 s apart: the same bounds as our psycopg connections,
fleet_import.bounded_connection) instead of the kernel's two hours. An answer that
never comes on a connection TCP still sees alive ends at the driver's socket `timeout`
(FLEET_WAREHOUSE_REPLY_TIMEOUT_SECONDS, given in `connect_kwargs`)."""


def connect(connect_kwargs: Mapping[str, Any]) -> Any:
    """A connection with autocommit off: every statement runs in the caller's transaction."""
    try:
        conn = redshift_connector.connect(**{**KEEPALIVES, **connect_kwargs})
        conn.autocommit = False
        return conn
    except _IAM_ERRORS as exc:
        raise iam_error(exc) from None
    except DRIVER_ERRORS as exc:
        raise translate(exc, connecting=True) from None


def retryable(error: Exception) -> bool:
    """Worth replaying the transaction: a translated error of a transient kind. Anything
    else (a session sink's refusal, a bug) ends the work at once."""
    if isinstance(error, CommitOutcomeUnknown):  # the stamp decides, never a replay
        return False
    return isinstance(error, WarehouseError) and error.transient


def iam_error(exc: BotoCoreError | ClientError) -> WarehouseError:
    """A failed request for the cluster's temporary credentials (IAM login). It carries only
    settings (cluster, region, database user, the loader's AWS identity), so what is not
    transient (throttling, a 5xx, no answer) needs an operator: configuration, never
    terminal, whatever the code."""
    kind = classify(exc)
    code = (client_error_code(exc)[0] or None) if isinstance(exc, ClientError) else None
    if kind is ErrorKind.TERMINAL:
        kind = ErrorKind.CONFIGURATION
    return WarehouseError(
        f"warehouse IAM login failed ({type(exc).__name__}): {exc}",
        kind=kind,
        code=code,
        backend=BACKEND,
    )


_INTERNAL = "XX000"  # Redshift's internal errors: 1023, load errors


def translate(exc: BaseException, *, connecting: bool = False) -> WarehouseError:
    """Driver errors become ours, of the kind the classification table gives them; the
    message carries SQLSTATE and text, never parameters.

    Without the server's fields (SQLSTATE), redshift_connector raised on the client side: a
    socket error or a connection that ended under it is transient (the server rolled back);
    anything else refused while `connecting` is the connection's settings (IAM without SSL,
    a server refusing SSL, no password, an unknown authentication method): configuration;
    after that, a misuse of the driver: terminal."""
    if isinstance(exc, _IAM_ERRORS):
        return iam_error(exc)
    if isinstance(exc, INTERNAL_ERRORS):
        return WarehouseError(
            f"warehouse driver failed internally ({type(exc).__name__}: {exc}); "
            "retried on a new connection",
            kind=ErrorKind.TRANSIENT,
            backend=BACKEND,
        )
    if isinstance(exc, OSError):
        kind = _socket_kind(exc, connecting)
        return WarehouseError(f"warehouse connection failed: {exc}", kind=kind, backend=BACKEND)
    fields = exc.args[0] if exc.args and isinstance(exc.args[0], dict) else {}
    if not fields:
        return _client_side(exc, connecting)
    state, message = fields.get("C") or None, fields.get("M", str(exc))
    if state == _INTERNAL and fields.get("D"):
        # Redshift's own errors say what went wrong only in the detail ("1023" alone tells
        # an operator nothing); it names tables and transactions, never row values.
        message = f"{message}: {fields['D'].strip()}"
    return WarehouseError(
        f"warehouse error ({type(exc).__name__}, SQLSTATE {state}): {message}",
        kind=sqlstate_kind(state, message),
        code=state,
        backend=BACKEND,
    )


def _client_side(exc: BaseException, connecting: bool) -> WarehouseError:
    text = str(exc.args[0]) if exc.args else type(exc).__name__
    cause = next((arg for arg in exc.args[1:] if isinstance(arg, OSError)), None)
    if cause is not None:  # "communication error", with the socket's error
        kind = _socket_kind(cause, connecting)
    elif isinstance(exc, redshift_connector.OperationalError) or text.startswith(_LOST):
        kind = sqlstate_kind(None, connection=True)  # timed out, or ended under us
    else:
        kind = ErrorKind.CONFIGURATION if connecting else ErrorKind.TERMINAL
    detail = f"{text} ({cause})" if cause is not None else text
    what = "driver error" if kind is ErrorKind.TERMINAL else "connection failed"
    return WarehouseError(f"warehouse {what}: {detail}", kind=kind, backend=BACKEND)


def _socket_kind(exc: OSError, connecting: bool) -> ErrorKind:
    """A TLS handshake refused while connecting (a protocol or cipher the endpoint does not
    take) needs an operator; mid-session any TLS error is the path's, transient."""
    handshake = isinstance(exc, ssl.SSLError) and not isinstance(exc, _TLS_CUT_SHORT)
    return ErrorKind.CONFIGURATION if connecting and handshake else network_kind(exc)


_TLS_CUT_SHORT = (ssl.SSLEOFError, ssl.SSLZeroReturnError)

SERVERLESS_HOST = re.compile(
    r"[^.]+\.[0-9]+\.[^.]+\.redshift-serverless\.amazonaws\.com(\.cn)?", re.IGNORECASE
)
"""A workgroup endpoint: `{workgroup}.{account}.{region}.redshift-serverless.amazonaws.com`."""


def is_serverless(connect_kwargs: Mapping[str, Any], serverless: bool | None = None) -> bool:
    """Whether the endpoint is a Redshift Serverless workgroup, decided once per warehouse:
    as configured (`serverless`, or the driver's own `is_serverless`, which
    FLEET_REDSHIFT_SERVERLESS sets), else by the workgroup endpoint's host name."""
    if serverless is not None:
        return serverless
    if connect_kwargs.get("is_serverless"):
        return True
    return bool(SERVERLESS_HOST.fullmatch(str(connect_kwargs.get("host") or "")))


@dataclass(frozen=True)
class SessionCatalog:
    """Where a session's identity is read, and how a frozen holder's session is ended.

    A provisioned cluster has STV_SESSIONS (`process`, `starttime`). Serverless refuses STL
    and STV tables (AWS "System view mapping for migrating to SYS views"), so there the
    session is `pg_backend_pid()` and its row of SYS_SESSION_HISTORY (`session_id`,
    `start_time`, `status` active | timed out | closed), which exists on both. Either way
    PG_TERMINATE_BACKEND ends it (a session of the same user, or any for a superuser)."""

    serverless: bool

    def identify(self, cursor: Cursor) -> WarehouseSession | None:
        """This session, named uniquely (pid and start time); None if the catalog does not
        show it yet: then only the lease fence guards the slice (see docs/redshift.md)."""
        if not self.serverless:
            row = _run(cursor, _STV_IDENTITY).fetchone()
        else:
            (pid,) = _run(cursor, "SELECT pg_backend_pid()").fetchone()
            row = _run(cursor, (_SYS_IDENTITY, [int(pid)])).fetchone()
        if not row:
            log.warning("this warehouse session is not in the session catalog yet")
            return None
        pid, started = row
        return WarehouseSession(int(pid), _iso(started))

    def end(self, cursor: Cursor, session: WarehouseSession) -> bool:
        """Terminate that session if it is still the one that started then (its transaction
        rolls back and its table locks are released); True if one was ended."""
        if not self.serverless:
            statement = (_STV_END, [int(session.pid), session.started])
            return bool(_run(cursor, statement).fetchall())
        # SYS views are kept apart from the leader's function: look first, then end.
        found = _run(cursor, (_SYS_ACTIVE, [int(session.pid), session.started])).fetchall()
        if not found:
            return False
        _run(cursor, ("SELECT pg_terminate_backend(%s)", [int(session.pid)])).fetchall()
        return True


PROVISIONED = SessionCatalog(serverless=False)
SERVERLESS = SessionCatalog(serverless=True)

_STV_IDENTITY = "SELECT process, starttime FROM stv_sessions WHERE process = pg_backend_pid()"
_STV_END = (
    "SELECT pg_terminate_backend(process) FROM stv_sessions "
    "WHERE process = %s AND starttime = %s::timestamp"
)
_SYS_IDENTITY = (
    "SELECT session_id, start_time FROM sys_session_history "
    "WHERE session_id = %s ORDER BY start_time DESC LIMIT 1"
)
_SYS_ACTIVE = (
    "SELECT session_id FROM sys_session_history WHERE session_id = %s "
    "AND start_time = %s::timestamp AND TRIM(status) = 'active'"
)


def _iso(value: Any) -> str:
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


def _run(cursor: Cursor, statement: str | Statement) -> Cursor:
    text, params = (statement, None) if isinstance(statement, str) else statement
    cursor.execute(text, params or None)
    return cursor
