"""One client session of the Redshift emulator (tests/redshift_emulator.py): the client's
connection and its upstream PostgreSQL connection, what is relayed between them, what is
answered here (COPY from S3, TRUNCATE, refusals), and the transaction followed on the way
(snapshot, write locks, serializability: tests/redshift_isolation.py)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime as dt
import re
import struct
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from tests import redshift_databases as databases
from tests import redshift_dialect as dialect
from tests import redshift_isolation as isolation
from tests import redshift_wire as wire
from tests.redshift_catalog import Failure
from tests.redshift_local import LocalAnswers

if TYPE_CHECKING:
    from tests.redshift_emulator import RedshiftEmulator


class ConnectionDropped(ConnectionError):
    """The emulator dropped a client's connection on purpose (`drop_next_commit`)."""


_QUERY_GROUP = re.compile(
    r"^\s*(?:SET\s+query_group\s+(?:TO|=)\s+'(?P<value>(?:[^']|'')*)'|RESET\s+query_group\b)",
    re.IGNORECASE,
)
_VIOLATION = "1023"
_VIOLATION_DETAIL = (
    "Serializable isolation violation on table - %s, transactions forming the cycle are: "
    "%s, %s (pid:%s)"
)


class Session(LocalAnswers):
    """One client connection and its upstream PostgreSQL connection."""

    def __init__(
        self, emulator: RedshiftEmulator, client: Any, upstream: Any, database: str = ""
    ) -> None:
        self.emulator = emulator
        self.isolation = databases.isolation_of(emulator, database)  # one per database
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
        self.database = database
        self.query_group = ""  # SET query_group: what SYS_QUERY_HISTORY labels statements with
        self._timed: collections.deque[tuple[str | None, str, dt.datetime, float]] = (
            collections.deque()
        )
        """Forwarded batches awaiting their ReadyForQuery: (SQL it ran or None, its query
        group, when it started), for SYS_QUERY_HISTORY."""

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
            kind, body = await wire.read_message(self.up_reader)
            if kind == b"E":
                body = _as_redshift(body)
            self._observe(kind, body)
            if self.divert is not None:
                await self.divert.put((kind, body))
                continue
            if kind == b"S":
                name, value, *_ = wire.cstrings(body)
                if name == b"server_version":
                    body = name + b"\0" + wire.SERVER_VERSION.encode() + b"\0"
            self.client_writer.write(wire.message(kind, body))
            if kind == b"Z":
                self._ran()
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
            self.isolation.end(self._tx, committed=committed)
        if self._lock_since is not None:
            self.emulator.lock_holds.append(time.monotonic() - self._lock_since)
        self._tx, self._locked, self._lock_since = None, set(), None
        self._ended, self._failed = None, False

    async def query(self, sql: str, copy_data: Iterator[bytes] | None = None) -> wire.Result:
        """Run one simple query upstream (relay diverted to us); feed COPY FROM STDIN."""
        if self._upstream_gone:
            raise ConnectionError("the upstream session ended")
        result = wire.Result()
        self.up_writer.write(wire.message(b"Q", sql.encode() + b"\0"))
        await self.up_writer.drain()
        while True:
            assert self.divert is not None
            kind, body = await self.divert.get()
            if kind == b"G":
                for chunk in copy_data or ():
                    self.up_writer.write(wire.message(b"d", chunk))
                    await self.up_writer.drain()
                self.up_writer.write(wire.message(b"c"))
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
            f"DO $$BEGIN RAISE EXCEPTION USING MESSAGE = {wire.literal(text)}{detail}, "
            f"ERRCODE = {wire.literal(sqlstate)}; END$$"
        )
        assert result.error is not None
        fields = wire.error_fields(result.error)
        for internal in ("W", "F", "L", "R"):
            fields.pop(internal, None)
        return wire.error_from(fields)

    async def raise_injected(self, failure: Failure) -> bytes:
        detail = wire.literal(failure.detail.replace("$", "")) if failure.detail else ""
        return await self.raise_upstream(failure.message, failure.sqlstate, detail)

    async def violation(self, table: str, other: isolation.Transaction | None) -> bytes:
        """Redshift's serializable isolation violation, on `table`, as it reports it."""
        ours = self._tx.xid if self._tx is not None else None
        detail = (
            f"format({wire.literal(_VIOLATION_DETAIL)}, "
            f"coalesce(to_regclass({wire.literal(wire.identifier(table))})::oid, 0), "
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
                if error is None and sql is not None and runs:
                    error = await self._check_parameters(sql, batch)
                ran = sql if runs and error is None else None
                if ran is not None:
                    self._follow_query_group(ran)
                started = (dt.datetime.now(dt.UTC), time.monotonic())
                if error is not None or self._is_local(batch, sql if runs else None):
                    await self._answer_locally(batch, error)
                    if ran is not None:
                        self._record(ran, self.query_group, *started)
                else:
                    if batch[-1][0] in (b"S", b"Q"):
                        self._timed.append((ran, self.query_group, *started))
                        self.pending += 1
                        self.idle.clear()
                    self.up_writer.write(
                        b"".join(wire.message(k, self._rewrite(k, b)) for k, b in batch)
                    )
                    await self.up_writer.drain()
                    if batch[-1][0] == b"X":
                        return
        finally:
            relay.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await relay

    def _follow_query_group(self, sql: str) -> None:
        """A SET or RESET of query_group changes the label of what the session runs next."""
        match = _QUERY_GROUP.match(sql)
        if match is not None:
            self.query_group = (match["value"] or "").replace("''", "'")

    def _ran(self) -> None:
        """A forwarded batch answered: its statement goes to SYS_QUERY_HISTORY."""
        if self._timed:
            sql, label, started, since = self._timed.popleft()
            if sql is not None:
                self._record(sql, label, started, since)

    def _record(self, sql: str, label: str, started: dt.datetime, since: float) -> None:
        if isolation.kind(sql) not in ("session", "begin", "commit", "rollback"):
            self.emulator.record_query(
                label, sql, self.database, started, time.monotonic() - since
            )

    async def _read_batch(self) -> list[tuple[bytes, bytes]] | None:
        batch = []
        while True:
            try:
                kind, body = await wire.read_message(self.client_reader)
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
                bound = wire.cstrings(body)[1]
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
        tx = self._tx = self._tx or self.isolation.begin()
        self.divert = asyncio.Queue()
        try:
            if kind == "commit":
                drops = self.emulator.commit_drops
                if runs and tx.writes and drops:
                    await self._drop_at_commit(drops.pop(0))
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
            if self.emulator.isolation_level == "snapshot":
                # SNAPSHOT: no cycle check (write skew is allowed); a concurrent change of
                # the same rows is PostgreSQL's own conflict, told as Redshift's 1023.
                tx.reads |= reads
                tx.writes |= writes
                return None
            try:
                self.isolation.access(tx, reads, writes)
            except isolation.Violation as exc:
                return await self.violation(exc.table, exc.other)
            return None
        finally:
            self.divert = None

    async def _drop_at_commit(self, when: str) -> None:
        """The connection drops at this COMMIT: `before` it reaches the server (which rolls
        the transaction back when its session ends), or `after` the server committed, the
        answer never sent. The client sees the socket close either way."""
        if when == "after":
            result = await self.query("COMMIT")
            assert result.error is None, wire.error_fields(result.error)
            self._end_transaction(committed=True)
        self.client_writer.close()
        self.up_writer.close()
        raise ConnectionDropped(when)

    async def _lock_and_snapshot(self, tx: isolation.Transaction, tables: set[str]) -> bytes | None:
        """Take the write locks of `tables`, then the snapshot if there is none yet: a
        transaction whose first statement writes gets its snapshot once it holds the lock
        (AWS "Write and read/write operations": "the second transaction does not obtain its
        snapshot of data until after the first transaction has released its lock")."""
        statements = [
            f"LOCK TABLE {wire.identifier(t)} IN SHARE ROW EXCLUSIVE MODE" for t in sorted(tables)
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
            return name + b"\0" + dialect.to_postgres(text).encode() + b"\0" + params
        if kind == b"Q":
            text = body.rstrip(b"\0").decode()
            self.emulator.queries.append(text)
            return dialect.to_postgres(text).encode() + b"\0"
        if kind == b"B":
            portal, statement = wire.cstrings(body)[:2]
            self.portals[portal] = statement
        return body


_WRITE_CONFLICT = "40001"  # PostgreSQL: could not serialize access due to concurrent update


def _as_redshift(body: bytes) -> bytes:
    """PostgreSQL's serialization failure (REPEATABLE READ: a row another transaction changed
    since this one's snapshot) as Redshift reports every such conflict: 1023 (XX000)."""
    fields = wire.error_fields(body)
    if fields.get("C") != _WRITE_CONFLICT:
        return body
    fields.update(
        C="XX000",
        M=_VIOLATION,
        D="Serializable isolation violation on table - 0, transactions forming the cycle are: "
        "a concurrent update of the same rows",
    )
    for internal in ("W", "F", "L", "R", "H"):
        fields.pop(internal, None)
    return wire.error_from(fields)
