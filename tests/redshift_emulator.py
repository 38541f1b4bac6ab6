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
  TRUNCATE and VACUUM commit all outstanding changes).
- `ALTER TABLE ... ALTER COLUMN ... TYPE` is refused for any type but VARCHAR, and inside a
  transaction block (AWS "ALTER TABLE"; tests/redshift_catalog.py `alter_type_refusal`).

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
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests import redshift_catalog as catalog
from tests import redshift_isolation as isolation
from tests.redshift_catalog import Failure
from tests.redshift_copy import COPY_S3, CopyFailed, check_columns, copy_input, read_copy

SERVER_VERSION = "8.0.2"
MODES = ("provisioned", "serverless")
"""What the Redshift tests run against: a provisioned cluster and a Serverless workgroup
(`RedshiftEmulator(..., serverless=True)`); a fixture parametrised with these runs both."""
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
_GETDATE = re.compile(r"\bGETDATE\s*\(\s*\)", re.IGNORECASE)
_LAYOUT = re.compile(
    r"\s+(DISTSTYLE\s+\w+|DISTKEY\s*\([^)]*\)|((COMPOUND|INTERLEAVED)\s+)?SORTKEY\s*\([^)]*\))",
    re.IGNORECASE,
)
_EXECUTES = (b"E", b"Q")
_VIOLATION = "1023"
_VIOLATION_DETAIL = (
    "Serializable isolation violation on table - %s, transactions forming the cycle are: "
    "%s, %s (pid:%s)"
)


_SORTKEY = re.compile(r"\bSORTKEY\s*\((?P<columns>[^)]*)\)", re.IGNORECASE)
_CREATE_TABLE = re.compile(
    r"^\s*CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?"
    r"(?P<table>(?:\"(?:[^\"]|\"\")+\"|[\w$]+)(?:\.(?:\"(?:[^\"]|\"\")+\"|[\w$]+))?)",
    re.IGNORECASE,
)


def _postgres(sql: str) -> str:
    """Redshift-only syntax in `sql` in PostgreSQL's words (see the module docstring). A
    table's SORTKEY lets Redshift skip the blocks outside a slice (zone maps); PostgreSQL
    needs an index on those columns to do the same, created with the table."""
    text = _GETDATE.sub("LOCALTIMESTAMP", _LAYOUT.sub("", sql))
    sortkey, create = _SORTKEY.search(sql), _CREATE_TABLE.match(sql)
    if not (sortkey and create) or "$emulator$" in text:
        return text
    table = create["table"]
    name = table.rsplit(".", 1)[-1].strip('"') + "_sortkey"
    return (
        f"DO $emulator$BEGIN {text}; CREATE INDEX IF NOT EXISTS {_identifier(name)} "
        f"ON {table} ({sortkey['columns']}); END$emulator$"
    )


def _message(kind: bytes, body: bytes = b"") -> bytes:
    return kind + struct.pack("!i", len(body) + 4) + body


def _cstrings(body: bytes) -> list[bytes]:
    return body.split(b"\0")


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _error_fields(body: bytes) -> dict[str, str]:
    return {f[:1].decode(): f[1:].decode() for f in body.split(b"\0") if f}


def _error_from(fields: dict[str, str]) -> bytes:
    return b"".join(k.encode() + v.encode() + b"\0" for k, v in fields.items()) + b"\0"


def _identifier(key: str) -> str:
    return ".".join('"' + part.replace('"', '""') + '"' for part in key.split(".", 1))


@dataclass
class _Result:
    rows: list[list[bytes | None]] = field(default_factory=list)
    tag: bytes = b""
    error: bytes | None = None  # raw ErrorResponse body


class _Session:
    """One client connection and its upstream PostgreSQL connection."""

    def __init__(self, emulator: RedshiftEmulator, client: Any, upstream: Any) -> None:
        self.emulator = emulator
        self.client_reader, self.client_writer = client
        self.up_reader, self.up_writer = upstream
        self.statements: dict[bytes, str] = {}  # prepared statement name -> SQL text
        self.portals: dict[bytes, bytes] = {}  # portal -> statement name
        self.local_statements: set[bytes] = set()  # COPYs: never prepared upstream
        self.pending = 0  # forwarded batches whose ReadyForQuery has not come back
        self.idle = asyncio.Event()
        self.idle.set()
        self.divert: asyncio.Queue[tuple[bytes, bytes]] | None = None
        self.status = b"I"
        self.temp: set[str] = set()  # session temp tables: private, never locked
        self._tx: isolation.Transaction | None = None
        self._locked: set[str] = set()  # tables this transaction holds write locks on
        self._lock_since: float | None = None
        self._ended: bytes | None = None  # COMMIT or ROLLBACK, as the server tagged the end
        self._failed = False
        self._upstream_gone = False

    # -- upstream -> client --------------------------------------------------------------

    async def relay(self) -> None:
        try:
            await self._relay_messages()
        except (asyncio.IncompleteReadError, OSError):
            # The upstream session ended (PG_TERMINATE_BACKEND, a crash): Redshift closes
            # the client's connection then, after its FATAL error, and so do we.
            self._end_transaction(committed=False)
            self.client_writer.close()
            self._upstream_gone = True
            if self.divert is not None:  # and a query of ours waiting for its answer ends
                await self.divert.put((b"X", b""))

    async def _relay_messages(self) -> None:
        while True:
            kind, body = await _read_message(self.up_reader)
            self._observe(kind, body)
            if self.divert is not None:
                await self.divert.put((kind, body))
                continue
            if kind == b"S":
                name, value, *_ = _cstrings(body)
                if name == b"server_version":
                    body = name + b"\0" + SERVER_VERSION.encode() + b"\0"
            self.client_writer.write(_message(kind, body))
            if kind == b"Z":
                self.pending -= 1
                if self.pending <= 0:
                    self.pending = 0
                    self.idle.set()
            await self.client_writer.drain()

    def _observe(self, kind: bytes, body: bytes) -> None:
        """Follow the transaction from what the server answers: its locks, its end."""
        if kind == b"E":
            self._failed = True
        elif kind == b"C":
            tag = body.rstrip(b"\0")
            if tag in (b"COMMIT", b"ROLLBACK"):
                self._ended = tag
            elif tag == b"LOCK TABLE" and self._lock_since is None:
                self._lock_since = time.monotonic()
        elif kind == b"Z":
            self.status = body[:1]
            if self.status == b"I":
                committed = self._ended == b"COMMIT" or (self._ended is None and not self._failed)
                self._end_transaction(committed=committed)

    def _end_transaction(self, *, committed: bool) -> None:
        if self._tx is not None:
            self.emulator.isolation.end(self._tx, committed=committed)
        if self._lock_since is not None:
            self.emulator.lock_holds.append(time.monotonic() - self._lock_since)
        self._tx, self._locked, self._lock_since = None, set(), None
        self._ended, self._failed = None, False

    async def query(self, sql: str, copy_data: Iterator[bytes] | None = None) -> _Result:
        """Run one simple query upstream (relay diverted to us); feed COPY FROM STDIN."""
        if self._upstream_gone:
            raise ConnectionError("the upstream session ended")
        result = _Result()
        self.up_writer.write(_message(b"Q", sql.encode() + b"\0"))
        await self.up_writer.drain()
        while True:
            assert self.divert is not None
            kind, body = await self.divert.get()
            if kind == b"G":
                for chunk in copy_data or ():
                    self.up_writer.write(_message(b"d", chunk))
                    await self.up_writer.drain()
                self.up_writer.write(_message(b"c"))
                await self.up_writer.drain()
            elif kind == b"D":
                (count,) = struct.unpack("!h", body[:2])
                row, offset = [], 2
                for _ in range(count):
                    (size,) = struct.unpack("!i", body[offset : offset + 4])
                    offset += 4
                    row.append(None if size < 0 else body[offset : offset + size])
                    offset += max(size, 0)
                result.rows.append(row)
            elif kind == b"C":
                result.tag = body.rstrip(b"\0")
            elif kind == b"E":
                result.error = result.error or body
            elif kind == b"Z":
                return result
            elif kind == b"X":
                raise ConnectionError("the upstream session ended")

    async def raise_upstream(self, message: str, sqlstate: str, detail: str = "") -> bytes:
        """Fail the client's transaction upstream, as the real error would; the ErrorResponse
        (without PL/pgSQL's context, which Redshift would not send). `detail` is SQL."""
        text = message.replace("$", "")
        detail = f", DETAIL = {detail}" if detail else ""
        result = await self.query(
            f"DO $$BEGIN RAISE EXCEPTION USING MESSAGE = {_literal(text)}{detail}, "
            f"ERRCODE = {_literal(sqlstate)}; END$$"
        )
        assert result.error is not None
        fields = _error_fields(result.error)
        for internal in ("W", "F", "L", "R"):
            fields.pop(internal, None)
        return _error_from(fields)

    async def raise_injected(self, failure: Failure) -> bytes:
        detail = _literal(failure.detail.replace("$", "")) if failure.detail else ""
        return await self.raise_upstream(failure.message, failure.sqlstate, detail)

    async def violation(self, table: str, other: isolation.Transaction | None) -> bytes:
        """Redshift's serializable isolation violation, on `table`, as it reports it."""
        ours = self._tx.xid if self._tx is not None else None
        detail = (
            f"format({_literal(_VIOLATION_DETAIL)}, "
            f"coalesce(to_regclass({_literal(_identifier(table))})::oid, 0), "
            f"{ours or 0}, {(other.xid if other else None) or 0}, pg_backend_pid())"
        )
        return await self.raise_upstream(_VIOLATION, "XX000", detail.replace("$", ""))

    # -- client -> upstream --------------------------------------------------------------

    async def serve(self) -> None:
        relay = asyncio.create_task(self.relay())
        try:
            while True:
                batch = await self._read_batch()
                if batch is None:
                    return
                sql, runs = self._statement(batch)
                if sql is not None:
                    await self.idle.wait()
                error = await self._refuse(sql) if sql is not None else None
                if error is None and sql is not None:
                    error = await self._before(sql, runs=runs)
                if error is not None or self._is_local(batch, sql if runs else None):
                    await self._answer_locally(batch, error)
                else:
                    if batch[-1][0] in (b"S", b"Q"):
                        self.pending += 1
                        self.idle.clear()
                    self.up_writer.write(
                        b"".join(_message(k, self._rewrite(k, b)) for k, b in batch)
                    )
                    await self.up_writer.drain()
                    if batch[-1][0] == b"X":
                        return
        finally:
            relay.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await relay

    async def _refuse(self, sql: str) -> bytes | None:
        """Serverless's refusal of a provisioned-only relation, and Redshift's of an ALTER
        COLUMN ... TYPE it cannot make (catalog.alter_type_refusal), raised upstream so that
        the transaction is aborted as Redshift aborts it."""
        message = catalog.refusal(sql) if self.emulator.serverless else None
        sqlstate = "42501"
        altered = catalog.alter_type_refusal(sql, in_transaction=self.status == b"T")
        if message is None and altered is not None:
            sqlstate, message = altered
        if message is None:
            return None
        self.divert = asyncio.Queue()
        try:
            return await self.raise_upstream(message, sqlstate)
        finally:
            self.divert = None

    async def _read_batch(self) -> list[tuple[bytes, bytes]] | None:
        batch = []
        while True:
            try:
                kind, body = await _read_message(self.client_reader)
            except asyncio.IncompleteReadError:
                return None
            batch.append((kind, body))
            if kind in (b"S", b"Q", b"X", b"d", b"c", b"f", b"p"):
                return batch

    def _statement(self, batch: list[tuple[bytes, bytes]]) -> tuple[str | None, bool]:
        """(SQL text, whether it runs) of the statement the batch prepares or runs. Parsing
        counts: PostgreSQL takes a REPEATABLE READ snapshot already when it parses a
        statement that needs one, so what comes before the snapshot must come before that."""
        parsed: dict[bytes, str] = {}
        bound = None
        for kind, body in batch:
            if kind == b"P":
                name, rest = body.split(b"\0", 1)
                parsed[name] = rest.split(b"\0", 1)[0].decode()
            elif kind == b"B":
                bound = _cstrings(body)[1]
            elif kind == b"E" and bound is not None:
                return parsed.get(bound, self.statements.get(bound)), True
            elif kind == b"Q":
                return body.rstrip(b"\0").decode(), True
        return next(iter(parsed.values()), None), False

    async def _before(self, sql: str, *, runs: bool) -> bytes | None:
        """What Redshift does before a statement of a transaction block runs: take the
        snapshot, take the write locks, check serializability. An ErrorResponse if the
        statement fails (the transaction is then aborted upstream)."""
        kind = isolation.kind(sql)
        if self.status != b"T" or kind in ("begin", "rollback", "session", "lock", "truncate"):
            return None
        tx = self._tx = self._tx or self.emulator.isolation.begin()
        self.divert = asyncio.Queue()
        try:
            if kind == "commit":
                if runs and self.emulator.fail_commits and tx.writes:
                    self.emulator.fail_commits -= 1
                    return await self.violation(sorted(tx.writes)[0], None)
                injected = self.emulator.injected("commit") if runs and tx.writes else None
                return await self.raise_injected(injected) if injected else None
            created = isolation.temp_table_created(sql)
            if created:
                self.temp.add(created)
            reads, writes = isolation.tables(sql, self.temp)
            error = await self._lock_and_snapshot(tx, writes - self._locked)
            if error is not None:
                return error
            try:
                self.emulator.isolation.access(tx, reads, writes)
            except isolation.Violation as exc:
                return await self.violation(exc.table, exc.other)
            return None
        finally:
            self.divert = None

    async def _lock_and_snapshot(self, tx: isolation.Transaction, tables: set[str]) -> bytes | None:
        """Take the write locks of `tables`, then the snapshot if there is none yet: a
        transaction whose first statement writes gets its snapshot once it holds the lock
        (AWS "Write and read/write operations": "the second transaction does not obtain its
        snapshot of data until after the first transaction has released its lock")."""
        statements = [
            f"LOCK TABLE {_identifier(t)} IN SHARE ROW EXCLUSIVE MODE" for t in sorted(tables)
        ]
        wanted = []
        if tx.snapshot is None:
            wanted.append("pg_current_snapshot()::text")
        if tables and tx.xid is None:
            wanted.append("txid_current()")
        if wanted:
            statements.append(f"SELECT {', '.join(wanted)}")
        if not statements:
            return None
        result = await self.query("; ".join(statements))
        if result.error is not None:
            return result.error
        self._locked |= tables
        values = [v.decode() for v in result.rows[-1]] if wanted else []
        if tx.snapshot is None:
            tx.snapshot = isolation.Snapshot.parse(values.pop(0))
        if tables and tx.xid is None:
            tx.xid = int(values.pop(0))
        return None

    def _rewrite(self, kind: bytes, body: bytes) -> bytes:
        """Record SQL texts and replace Redshift-only functions PostgreSQL lacks."""
        if kind == b"P":
            name, rest = body.split(b"\0", 1)
            sql, params = rest.split(b"\0", 1)
            text = sql.decode()
            self.statements[name] = text
            self.local_statements.discard(name)  # the driver reuses names of failed ones
            self.emulator.queries.append(text)
            return name + b"\0" + _postgres(text).encode() + b"\0" + params
        if kind == b"Q":
            text = body.rstrip(b"\0").decode()
            self.emulator.queries.append(text)
            return _postgres(text).encode() + b"\0"
        if kind == b"B":
            portal, statement = _cstrings(body)[:2]
            self.portals[portal] = statement
        return body

    def _is_local(self, batch: list[tuple[bytes, bytes]], sql: str | None) -> bool:
        """Whether the batch is answered here: it parses or runs a COPY from S3, or runs a
        TRUNCATE."""
        if sql is not None and (COPY_S3.match(sql) or isolation.kind(sql) == "truncate"):
            return True
        for kind, body in batch:
            if kind == b"P":
                name, rest = body.split(b"\0", 1)
                if COPY_S3.match(rest.split(b"\0", 1)[0].decode()):
                    return True
            if kind == b"B" and _cstrings(body)[1] in self.local_statements:
                return True
        return False

    async def _answer_locally(
        self, batch: list[tuple[bytes, bytes]], error: bytes | None = None
    ) -> None:
        """Answer the batch as the server would; `error` fails its statement."""
        out = self.client_writer
        failed = False
        self.divert = asyncio.Queue()
        try:
            for kind, body in batch:
                if kind == b"S":
                    out.write(_message(b"Z", self.status))
                elif failed or kind == b"H":
                    continue
                elif kind == b"P" and error is not None:
                    self._rewrite(kind, body)  # recorded, never prepared
                    out.write(_message(b"E", error))
                    failed = True
                elif kind == b"P":
                    name, rest = body.split(b"\0", 1)
                    text = rest.split(b"\0", 1)[0].decode()
                    self.statements[name] = text
                    self.local_statements.add(name)
                    self.emulator.queries.append(text)
                    out.write(_message(b"1"))
                elif kind == b"D":
                    if body[:1] == b"S":
                        out.write(_message(b"t", struct.pack("!h", 0)))
                    out.write(_message(b"n"))
                elif kind == b"B":
                    self._rewrite(kind, body)
                    out.write(_message(b"2"))
                elif kind == b"C":
                    self.local_statements.discard(body[1:].split(b"\0")[0])
                    out.write(_message(b"3"))
                elif kind in _EXECUTES:
                    if kind == b"Q":
                        self._rewrite(kind, body)
                        sql = body.rstrip(b"\0").decode()
                    else:
                        portal = body.split(b"\0")[0]
                        sql = self.statements[self.portals.get(portal, b"")]
                    if error is None:
                        error, tag = await self._execute(sql)
                    if error is not None:
                        out.write(_message(b"E", error))
                        failed = True
                    else:
                        out.write(_message(b"C", tag + b"\0"))
                    if kind == b"Q":
                        out.write(_message(b"Z", self.status))
                else:
                    out.write(_message(b"E", _error_body("0A000", f"emulator: {kind!r} here")))
                    failed = True
            await out.drain()
        finally:
            self.divert = None

    async def _execute(self, sql: str) -> tuple[bytes | None, bytes]:
        if isolation.kind(sql) == "truncate":
            # TRUNCATE commits the open transaction, then runs in one of its own.
            if self.status != b"I":
                await self.query("COMMIT")
            result = await self.query(_postgres(sql))
            return result.error, result.tag
        injected = self.emulator.injected("copy")
        if injected is not None:
            return await self.raise_injected(injected), b""
        try:
            table, columns, rows = await asyncio.to_thread(read_copy, sql, self.emulator.get_object)
            target = await self._columns(table)
            if columns:
                by_name = {name: (width, oid) for name, width, oid in target}
                target = [(c, *by_name.get(c.strip('"'), (None, None))) for c in columns]
            check_columns(table, rows, [(name, width) for name, width, _ in target])
            copy_format, data = await asyncio.to_thread(
                copy_input, rows, [oid for _, _, oid in target]
            )
        except CopyFailed as exc:
            return await self.raise_upstream(str(exc), "XX000"), b""
        column_list = f" ({', '.join(columns)})" if columns else ""
        result = await self.query(
            f"COPY {table}{column_list} FROM STDIN (FORMAT {copy_format})", iter(data)
        )
        if result.error is not None:
            return result.error, b""
        self.emulator.copies.append(sql)
        return None, result.tag

    async def _columns(self, table: str) -> list[tuple[str, int | None, int]]:
        """(name, VARCHAR/CHAR width or None, type oid) of the table's columns, in order."""
        result = await self.query(
            "SELECT attname, CASE WHEN atttypid IN (1042, 1043) AND atttypmod > 4 "
            "THEN atttypmod - 4 END, atttypid FROM pg_attribute WHERE attrelid = "
            f"{_literal(table)}::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum"
        )
        if result.error is not None:
            raise CopyFailed(f"table {table} does not exist")
        return [
            (name.decode(), None if width is None else int(width), int(oid))
            for name, width, oid in result.rows
        ]


def _error_body(sqlstate: str, message: str) -> bytes:
    return b"SERROR\0C" + sqlstate.encode() + b"\0M" + message.encode() + b"\0\0"


async def _read_message(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    kind = await reader.readexactly(1)
    (length,) = struct.unpack("!i", await reader.readexactly(4))
    return kind, await reader.readexactly(length - 4)


class RedshiftEmulator:
    """Listens on 127.0.0.1:<free port> in a background thread; `with` starts and stops it."""

    def __init__(self, upstream_url: str, s3: Any, *, serverless: bool = False) -> None:
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
        self.user = parts.username or "postgres"
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
        self.failures: list[Failure] = []
        """Injected errors still to raise, in order (`fail_next`)."""
        self.isolation = isolation.Isolation()
        self.lock_holds: list[float] = []
        """Seconds from each transaction's first table lock to its end."""
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

    def injected(self, at: str) -> Failure | None:
        """The first injected failure for `at`, taken off the list."""
        for failure in self.failures:
            if failure.at == at:
                self.failures.remove(failure)
                return failure
        return None

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

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream = None
        try:
            startup = await self._startup(reader, writer)
            if startup is None:
                return
            if self.upstream_socket:
                upstream = await asyncio.open_unix_connection(self.upstream_socket)
            else:
                upstream = await asyncio.open_connection(self.upstream_host, self.upstream_port)
            upstream[1].write(startup)
            await upstream[1].drain()
            await _Session(self, (reader, writer), upstream).serve()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
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
            fields = _cstrings(body[4:])
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
        writer.write(_message(b"R", struct.pack("!i", 3)))  # AuthenticationCleartextPassword
        await writer.drain()
        kind, body = await _read_message(reader)
        if kind == b"p" and body.rstrip(b"\0").decode() == self.password:
            return True
        message = f'password authentication failed for user "{user}"'
        writer.write(_message(b"E", _error_body("28000", message).replace(b"SERROR", b"SFATAL")))
        await writer.drain()
        return False
