"""A Redshift stand-in for tests: a PostgreSQL wire-protocol proxy in front of the test
PostgreSQL that makes redshift_connector and Redshift's S3 COPY work offline, with Redshift's
concurrency semantics on the paths fleet-import uses.

What it changes on the way (everything else is forwarded byte for byte):
- SSLRequest is answered `N` (the test server speaks plain TCP);
- startup parameters PostgreSQL rejects (redshift_connector's driver_version, os_version,
  client_protocol_version, ...) are dropped; sessions run in UTC at REPEATABLE READ;
- ParameterStatus `server_version` reads `8.0.2`, as Redshift reports (the driver parses it);
- `GETDATE()` becomes `LOCALTIMESTAMP` (Redshift-only function); the table attributes that
  lay rows out on a cluster (`DISTSTYLE`, `DISTKEY`, `SORTKEY`) are dropped, and a SORTKEY's
  columns get an index instead, which skips rows outside a slice as Redshift's zone maps skip
  blocks;
- `COPY t FROM 's3://...' IAM_ROLE '...' FORMAT AS PARQUET [MANIFEST]` is executed here, at
  Execute time (the driver prepares each SQL text once per connection and re-binds it):
  the Parquet objects are read from S3 (moto), their column count checked against the
  target table (Redshift matches Parquet columns by position), string values checked in
  **bytes** against the VARCHAR widths (AWS "Character types": VARCHAR lengths are bytes;
  COPY from Parquet has no TRUNCATECOLUMNS or MAXERROR, so one long value fails it), and the
  rows sent upstream with `COPY t FROM STDIN` in the client's own transaction (FORMAT binary
  where every column's type allows, else csv: tests/redshift_copy.py).
  Failures become ErrorResponses raised upstream, so the transaction is aborted as Redshift
  would abort it;
- `TRUNCATE` commits the open transaction first, and itself (AWS "Serializable isolation":
  TRUNCATE and VACUUM commit all outstanding changes);
- the `database` a client names is the upstream database of that name, with serializability
  judged per database (tests/redshift_databases.py: one database per tenant).

Concurrency, in a transaction block (the driver's default, autocommit off):
- the snapshot is taken at the first statement other than LOCK, SET and transaction control
  (AWS "Serializable isolation": "on the first occurrence of most SELECT statements, DML
  commands ... and the following DDL"): PostgreSQL at REPEATABLE READ, asked for
  `pg_current_snapshot()` before that statement;
- the first write (INSERT, DELETE, UPDATE, COPY) to a table takes a table-level write lock
  held to COMMIT/ROLLBACK that readers do not wait for (AWS `LOCK`: "less restrictive table
  locks are acquired implicitly by commands that refer to tables, such as write
  operations"): `LOCK TABLE t IN SHARE ROW EXCLUSIVE MODE` upstream, before the write;
- `LOCK t, ...` is PostgreSQL's: ACCESS EXCLUSIVE, readers wait too (AWS `LOCK`);
- a statement that cannot be serialised fails with Redshift's 1023 (tests/redshift_isolation.py
  has the rule and its sources): SQLSTATE XX000, message `1023`, detail "Serializable isolation
  violation on table - <table id>, transactions forming the cycle are: ..." (AWS
  "Troubleshooting serializable isolation errors");
- with `fail_commits = n`, the next n COMMITs of transactions that wrote a table fail with
  that same error (the transaction is then aborted); `fail_next("copy" | "commit", message,
  sqlstate=, detail=)` makes the next COPY or writing COMMIT fail with any other error
  (Spectrum's, S3's through Spectrum, the catalog's), in the same way.
`lock_holds` records, per transaction that held a table lock, the seconds from its first
lock to its end.

The client's messages are handled per batch (up to Sync, Query or Terminate), which is
how redshift_connector sends them. A batch that touches a COPY (or an injected COMMIT
failure) is answered here, after every response to earlier batches has been relayed;
mixing such a statement with others in one batch is not supported. Every SQL text is
recorded in `queries`, so tests can assert what reached the "cluster".

Where it lives: this module holds the emulator and its knobs; `redshift_session` one client
session (relay, the transaction followed), `redshift_local` what a session answers itself
(COPY from S3, TRUNCATE, refusals), `redshift_wire` the protocol,
`redshift_dialect` Redshift's SQL in PostgreSQL's words, `redshift_strict` what Redshift
refuses that PostgreSQL accepts (PostgreSQL-only SQL, leader-only functions, ALTER COLUMN
TYPE's limits, VARCHAR bytes of INSERT parameters, the connection cap; COPY's Parquet
options and types are checked in `redshift_copy`), recorded in `refusals`,
`redshift_isolation`, `redshift_copy` and `redshift_catalog` the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import struct
import threading
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests import redshift_catalog as catalog
from tests import redshift_databases as databases
from tests import redshift_isolation as isolation
from tests import redshift_strict as strict
from tests import redshift_wire as wire
from tests.redshift_catalog import Failure
from tests.redshift_copy import CopyFailed
from tests.redshift_session import Session

MODES = ("provisioned", "serverless")
"""What the Redshift tests run against: a provisioned cluster and a Serverless workgroup
(`RedshiftEmulator(..., serverless=True)`); a fixture parametrised with these runs both."""
ISOLATION_LEVELS = ("serializable", "snapshot")
"""Redshift's two isolation levels (AWS "Isolation levels in Amazon Redshift"), as the emulator
maps them (`RedshiftEmulator(..., isolation_level=...)`): both run PostgreSQL REPEATABLE READ
(a snapshot per transaction, taken at its first statement) behind Redshift's table write
locks; SERIALIZABLE adds the cycle check of tests/redshift_isolation.py (1023), SNAPSHOT does
not ("concurrent modifications to different rows in the same table would complete
successfully", AWS, May 2022), and a change of rows another transaction changed since the
snapshot fails as PostgreSQL's REPEATABLE READ fails it (40001), told as Redshift's 1023."""
SETUPS = (("provisioned", "serializable"), ("serverless", "snapshot"))
"""What the Redshift suite runs under: each mode and each isolation level once, paired (a
workgroup's default is SNAPSHOT), not all four: the mode and the level touch different code
(the session catalog; the conflict rule), so pairs cover both at half the time."""
_SSL_REQUEST, _GSS_REQUEST, _PROTOCOL_3 = 80877103, 80877104, 196608
# Startup parameters PostgreSQL accepts; everything else redshift_connector sends is dropped.
_STARTUP_KEEP = frozenset(
    {
        "user",
        "database",
        "application_name",
        "client_encoding",
        "DateStyle",
        "TimeZone",
        "extra_float_digits",
        "options",
        "replication",
    }
)


class RedshiftEmulator:
    """Listens on 127.0.0.1:<free port> in a background thread; `with` starts and stops it."""

    def __init__(
        self,
        upstream_url: str,
        s3: Any,
        *,
        serverless: bool = False,
        user: str | None = None,
        isolation_level: str = "serializable",
    ) -> None:
        if isolation_level not in ISOLATION_LEVELS:
            raise ValueError(f"isolation_level is one of {ISOLATION_LEVELS}: {isolation_level!r}")
        self.isolation_level = isolation_level
        parts = urlsplit(upstream_url)
        self.upstream_url = upstream_url
        self.upstream_host = parts.hostname or "127.0.0.1"
        self.upstream_port = parts.port or 5432
        # The embedded server (pgserver) listens on a Unix socket: `?host=/dir`.
        socket_dir = parse_qs(parts.query).get("host", [""])[0]
        self.upstream_socket = (
            f"{socket_dir}/.s.PGSQL.{self.upstream_port}" if socket_dir.startswith("/") else None
        )
        self.database = parts.path.lstrip("/")
        self.user = user or parts.username or "postgres"
        """Who clients log in as (`connect_kwargs`); the catalog views are made by the
        upstream URL's user (an administrator)."""
        self.s3 = s3
        self.serverless = serverless
        """Redshift Serverless: no STL/STV/SVL/SVCS relations (refused as Serverless refuses
        them), only SYS views."""
        self.port = 0
        self.queries: list[str] = []
        """Every SQL text clients sent (Parse and Query), as sent."""
        self.copies: list[str] = []
        """COPY statements that loaded rows."""
        self.password: str | None = None
        """When set, logins must present it, as Redshift checks passwords: a wrong one is
        refused with FATAL 28000 "password authentication failed for user"."""
        self.fail_commits = 0
        """How many coming COMMITs (of transactions that wrote a table) fail with a
        serializable isolation violation."""
        self.commit_drops: list[str] = []
        """Coming writing COMMITs whose connection drops ("before" or "after" the commit)."""
        self.failures: list[Failure] = []
        """Injected errors still to raise, in order (`fail_next`)."""
        self.isolation = isolation.Isolation()
        self.encodings: dict[tuple[str, str], str] = {}
        """{("schema.table", column): encoding}: what ENCODE clauses set, and what a test says
        ENCODE AUTO chose (BYTEDICT for a low-cardinality column, say)."""
        self.max_connections = strict.CONNECTION_LIMITS[
            "serverless" if serverless else "provisioned"
        ]
        """Sessions open at once; one more is refused (FATAL 53300), as Redshift caps them."""
        self.sessions_open = 0
        self.refusals: list[tuple[str, str, str]] = []
        """(SQL, SQLSTATE, message) of every statement refused as Redshift would refuse it
        (tests/redshift_strict.py): the backend's own suite must leave this empty."""
        self.lock_holds: list[float] = []
        """Seconds from each transaction's first table lock to its end."""
        self._history: Any = None  # the connection record_query writes with
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.AbstractServer | None = None

    def fail_next(
        self, at: str, message: str, *, sqlstate: str = "XX000", detail: str = ""
    ) -> None:
        """Make the next COPY (`at="copy"`) or writing COMMIT (`"commit"`) fail with this
        error (Redshift's internal errors: Spectrum, S3, the catalog); the transaction is
        aborted as the real error aborts it."""
        if at not in ("copy", "commit"):
            raise ValueError(f"fail_next: at is 'copy' or 'commit', not {at!r}")
        self.failures.append(Failure(at, message, sqlstate, detail))

    def drop_next_commit(self, when: str = "after") -> None:
        """Make the connection of the next COMMIT of a transaction that wrote drop: `"after"`
        the server committed (the outcome is unknown to the client: issue 26), or
        `"before"` it (the server rolls back when the session ends). The client's driver
        sees its socket closed (redshift_connector: InterfaceError), never an answer."""
        if when not in ("before", "after"):
            raise ValueError(f"drop_next_commit: when is 'before' or 'after', not {when!r}")
        self.commit_drops.append(when)

    def injected(self, at: str) -> Failure | None:
        """The first injected failure for `at`, taken off the list."""
        for failure in self.failures:
            if failure.at == at:
                self.failures.remove(failure)
                return failure
        return None

    def record_query(
        self, label: str, sql: str, database: str, started: dt.datetime, seconds: float
    ) -> None:
        """One row of SYS_QUERY_HISTORY: a statement a session ran under `label` (its
        query_group). Written at once, on a connection of the emulator's own."""
        if self._history is None:
            import psycopg

            from fleet_import.config import libpq_url

            self._history = psycopg.connect(libpq_url(self.upstream_url), autocommit=True)
        self._history.execute(
            "INSERT INTO public.sys_query_history (query_label, database_name, query_text, "
            "start_time, end_time, elapsed_time, status) "
            "VALUES (%s, %s, %s, %s, %s, %s, 'success')",
            (
                label,
                database,
                sql[:4000],
                started.replace(tzinfo=None),
                (started + dt.timedelta(seconds=seconds)).replace(tzinfo=None),
                round(seconds * 1_000_000),
            ),
        )

    def get_object(self, uri: str) -> bytes:
        bucket, _, key = uri.removeprefix("s3://").partition("/")
        try:
            return self.s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        except Exception as exc:  # noqa: BLE001 - any S3 failure fails the COPY
            raise CopyFailed(f"cannot read {uri}: {exc}") from None

    def connect_kwargs(self, **extra: Any) -> dict[str, Any]:
        return {
            "host": "127.0.0.1",
            "port": self.port,
            "database": self.database,
            "user": self.user,
            "password": "unused-trust-auth",
            "ssl": False,
            # The driver's own flag, as FLEET_REDSHIFT_SERVERLESS sets it: the warehouse
            # reads it to choose its session catalog.
            **({"is_serverless": True} if self.serverless else {}),
            **extra,
        }

    def __enter__(self) -> RedshiftEmulator:
        catalog.create_system_views(self.upstream_url, serverless=self.serverless)
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._accept, "127.0.0.1", 0), self._loop
        )
        self._server = future.result(timeout=10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc_info: object) -> None:
        async def stop() -> None:
            assert self._server is not None
            self._server.close()
            tasks = asyncio.all_tasks() - {asyncio.current_task()}
            for task in tasks:
                task.cancel()
            # Let every session close its sockets before the loop stops.
            await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.sleep(0.05)

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()
        if self._history is not None:
            self._history.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream, counted = None, False
        try:
            startup = await self._startup(reader, writer)
            if startup is None:
                return
            if self.sessions_open >= self.max_connections:
                refused = strict.connection_limit(self.max_connections)
                fatal = wire.error_body(refused.sqlstate, refused.message)
                writer.write(wire.message(b"E", fatal.replace(b"SERROR", b"SFATAL")))
                await writer.drain()
                return
            counted = True
            self.sessions_open += 1
            if self.upstream_socket:
                upstream = await asyncio.open_unix_connection(self.upstream_socket)
            else:
                upstream = await asyncio.open_connection(self.upstream_host, self.upstream_port)
            upstream[1].write(startup)
            await upstream[1].drain()
            database = databases.startup_database(startup)
            await Session(self, (reader, writer), upstream, database).serve()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            self.sessions_open -= counted
            for w in (writer, upstream[1] if upstream else None):
                if w is not None:
                    w.close()
                    with contextlib.suppress(Exception, asyncio.CancelledError):
                        await w.wait_closed()

    async def _startup(self, reader: Any, writer: Any) -> bytes | None:
        """Answer SSL/GSS requests `N`; return the startup packet without foreign parameters."""
        while True:
            (length,) = struct.unpack("!i", await reader.readexactly(4))
            body = await reader.readexactly(length - 4)
            (code,) = struct.unpack("!i", body[:4])
            if code in (_SSL_REQUEST, _GSS_REQUEST):
                writer.write(b"N")
                await writer.drain()
                continue
            if code != _PROTOCOL_3:
                return None
            fields = wire.cstrings(body[4:])
            pairs = dict(zip(fields[0::2], fields[1::2], strict=False))
            kept = b"".join(
                k + b"\0" + v + b"\0"
                for k, v in pairs.items()
                if k and k.decode() in _STARTUP_KEEP - {"TimeZone", "options"}
            )
            # Redshift sessions run in UTC; COPY sends timestamps as naive UTC. A snapshot
            # per transaction, not per statement: REPEATABLE READ.
            options = [pairs[b"options"]] if pairs.get(b"options") else []
            options.append(b"-c default_transaction_isolation=repeatable\\ read")
            kept += b"TimeZone\0UTC\0options\0" + b" ".join(options) + b"\0"
            packet = struct.pack("!i", _PROTOCOL_3) + kept + b"\0"
            if not await self._password_ok(reader, writer, pairs.get(b"user", b"").decode()):
                return None
            return struct.pack("!i", len(packet) + 4) + packet

    async def _password_ok(self, reader: Any, writer: Any, user: str) -> bool:
        if self.password is None:
            return True
        writer.write(wire.message(b"R", struct.pack("!i", 3)))  # AuthenticationCleartextPassword
        await writer.drain()
        kind, body = await wire.read_message(reader)
        if kind == b"p" and body.rstrip(b"\0").decode() == self.password:
            return True
        message = f'password authentication failed for user "{user}"'
        writer.write(
            wire.message(b"E", wire.error_body("28000", message).replace(b"SERROR", b"SFATAL"))
        )
        await writer.drain()
        return False
