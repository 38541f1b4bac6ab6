"""What every operational-store repository shares: one connection and one transaction per
call, and the single boundary where psycopg errors become ours."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, ClassVar, Self

import psycopg
from psycopg import errors as pg_errors
from psycopg.rows import dict_row

from fleet_import.bounded_connection import (
    REPLY_LOST,
    ReplyTimeout,
    connect_bounded,
    server_address,
)
from fleet_import.config import DEFAULT_DATABASE_REPLY_TIMEOUT_SECONDS, Settings, libpq_url
from fleet_import.error_table import psycopg_kind
from fleet_import.errors import OperationalStoreError

RUNNING_SCOPE_INDEX = "ux_ingestion_batches_running_scope"


def _connection_refused(address: str | None = None) -> str:
    """Why a connection was not made, naming the host:port it tried when known."""
    to = f" to {address}" if address else ""
    return (
        f"could not connect{to} (is the server up, is FLEET_DATABASE_URL right, are there free "
        "connections?)"
    )


CONNECTION_LOST = (
    "the connection was lost mid-statement (the server restarted, or the network cut it)"
)


class ScopeTaken(OperationalStoreError):
    """Another batch holds this scope's running reservation."""


class SqlStore:
    """Subclasses name their `.sql` file's queries; each method runs in `_transaction`, so
    a store may be shared by threads and used from many processes."""

    queries: ClassVar[dict[str, str]]
    idle_in_transaction_seconds: ClassVar[float] = 10.0
    """How long the server lets a store transaction wait on its client between statements
    before it ends the session (and its row locks). A healthy client never waits there more
    than milliseconds; a frozen one (SIGSTOP, a paused VM) caught between its UPDATE and its
    COMMIT held the batch's row for good, and every successor's reservation of the scope
    waited on it until its own reply bound failed it."""

    def __init__(
        self,
        database_url: str,
        reply_timeout: float = DEFAULT_DATABASE_REPLY_TIMEOUT_SECONDS,
    ) -> None:
        self._conninfo = libpq_url(database_url)
        self._reply_timeout = reply_timeout  # FLEET_DATABASE_REPLY_TIMEOUT_SECONDS

    @classmethod
    def from_settings(cls, settings: Settings) -> Self:
        """The store FLEET_DATABASE_URL names, bounded by FLEET_DATABASE_REPLY_TIMEOUT_SECONDS."""
        return cls(settings.database_url, settings.database_reply_timeout_seconds)

    @contextmanager
    def _transaction(self) -> Iterator[psycopg.Connection[dict[str, Any]]]:
        """One connection, one transaction: committed on success, rolled back on error.
        Bounded (fleet_import.bounded_connection): a database that stops answering ends the
        call, never the worker."""
        try:
            conn = connect_bounded(self._conninfo, self._reply_timeout, row_factory=dict_row)
        except psycopg.Error as exc:
            raise translate_driver_error(exc, address=server_address(self._conninfo)) from None
        try:
            with conn:
                # SET LOCAL, not a startup option: a pooler (PgBouncer, RDS Proxy) in
                # transaction mode may refuse startup options, and a session SET would
                # outlive the transaction on a pooled server connection.
                conn.execute(
                    "SELECT set_config('idle_in_transaction_session_timeout', %s, true)",
                    (f"{round(self.idle_in_transaction_seconds * 1000)}ms",),
                )
                yield conn
        except psycopg.Error as exc:
            raise translate_driver_error(exc, connected=True) from None

    def _one(self, name: str, params: Mapping[str, Any]) -> dict[str, Any] | None:
        with self._transaction() as conn:
            return conn.execute(self.queries[name], params).fetchone()

    def _all(self, name: str, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        with self._transaction() as conn:
            return conn.execute(self.queries[name], params).fetchall()


def translate_driver_error(
    exc: psycopg.Error, *, connected: bool = False, address: str | None = None
) -> OperationalStoreError:
    """The single boundary where driver errors become ours: decided by constraint name, or
    given the kind the classification table gives them; never by message text. `connected`:
    the connection was made, so a connection error is one lost, not one refused. `address`:
    the host:port a refused connection tried (`server_address`), named in its message, which
    has no SQLSTATE to show."""
    if (
        isinstance(exc, pg_errors.UniqueViolation)
        and exc.diag.constraint_name == RUNNING_SCOPE_INDEX
    ):
        return ScopeTaken()
    # Never the driver's own text for a connection failure: libpq may quote the connection
    # string, and with a malformed URL part of the password.
    hint = CONNECTION_LOST if connected else _connection_refused(address)
    if isinstance(exc, ReplyTimeout):
        hint = f"{exc} (FLEET_DATABASE_REPLY_TIMEOUT_SECONDS): {REPLY_LOST}"
    reason = exc.diag.message_primary or (
        hint if isinstance(exc, psycopg.OperationalError) else type(exc).__name__
    )
    state = f", SQLSTATE {exc.sqlstate}" if exc.sqlstate else ""
    return OperationalStoreError(
        f"operational database error ({type(exc).__name__}{state}): {reason}",
        kind=psycopg_kind(exc),
        code=exc.sqlstate,
    )
