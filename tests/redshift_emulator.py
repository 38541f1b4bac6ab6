"""A Redshift stand-in for tests: a PostgreSQL wire-protocol proxy in front of the test
PostgreSQL that makes redshift_connector and Redshift's S3 COPY work offline.

What it changes on the way (everything else is forwarded byte for byte):
- SSLRequest is answered `N` (the test server speaks plain TCP);
- startup parameters PostgreSQL rejects (redshift_connector's driver_version, os_version,
  client_protocol_version, ...) are dropped;
- ParameterStatus `server_version` reads `8.0.2`, as Redshift reports (the driver parses it);
- `GETDATE()` becomes `LOCALTIMESTAMP` (Redshift-only function); the table attributes that
  lay rows out on a cluster (`DISTSTYLE`, `DISTKEY`, `SORTKEY`) are dropped;
- `COPY t FROM 's3://...' IAM_ROLE '...' FORMAT AS PARQUET [MANIFEST]` is executed here, at
  Execute time (the driver prepares each SQL text once per connection and re-binds it):
  the Parquet objects are read from S3 (moto), their column count checked against the
  target table (Redshift matches Parquet columns by position), and the rows sent upstream
  with `COPY t FROM STDIN (FORMAT csv)` in the client's own transaction. Failures become
  ErrorResponses raised upstream, so the transaction is aborted as Redshift would abort it;
- with `fail_commits = n`, the next n COMMITs fail with SQLSTATE 40001 and Redshift's
  "1023 Serializable isolation violation" text (the transaction is then aborted).

The client's messages are handled per batch (up to Sync, Query or Terminate), which is
how redshift_connector sends them. A batch that touches a COPY (or an injected COMMIT
failure) is answered here, after every response to earlier batches has been relayed;
mixing such a statement with others in one batch is not supported. Every SQL text is
recorded in `queries`, so tests can assert what reached the "cluster".
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pyarrow.csv as pacsv
import pyarrow.parquet as pq

SERVER_VERSION = "8.0.2"
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
_COPY_S3 = re.compile(
    r"^\s*COPY\s+(?P<table>(?:\"(?:[^\"]|\"\")+\"|[\w$]+)(?:\.(?:\"(?:[^\"]|\"\")+\"|[\w$]+))?)"
    r"\s*(?:\((?P<columns>[^)]*)\))?\s+FROM\s+'(?P<uri>s3://(?:[^']|'')*)'(?P<options>.*)$",
    re.IGNORECASE | re.DOTALL,
)
_COMMIT = re.compile(r"^\s*(COMMIT|END)\s*;?\s*$", re.IGNORECASE)
_GETDATE = re.compile(r"\bGETDATE\s*\(\s*\)", re.IGNORECASE)
_LAYOUT = re.compile(
    r"\s+(DISTSTYLE\s+\w+|DISTKEY\s*\([^)]*\)|((COMPOUND|INTERLEAVED)\s+)?SORTKEY\s*\([^)]*\))",
    re.IGNORECASE,
)
_CSV_CHUNK = 1 << 20


def _postgres(sql: str) -> str:
    """Redshift-only syntax in `sql` in PostgreSQL's words (see the module docstring)."""
    return _GETDATE.sub("LOCALTIMESTAMP", _LAYOUT.sub("", sql))


class CopyFailed(Exception):
    """A COPY the emulator could not run; becomes an ErrorResponse (SQLSTATE XX000)."""


def _message(kind: bytes, body: bytes = b"") -> bytes:
    return kind + struct.pack("!i", len(body) + 4) + body


def _cstrings(body: bytes) -> list[bytes]:
    return body.split(b"\0")


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


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

    # -- upstream -> client --------------------------------------------------------------

    async def relay(self) -> None:
        try:
            await self._relay_messages()
        except asyncio.IncompleteReadError:
            # The upstream session ended (PG_TERMINATE_BACKEND, a crash): Redshift closes
            # the client's connection then, after its FATAL error, and so do we.
            self.client_writer.close()

    async def _relay_messages(self) -> None:
        while True:
            kind, body = await _read_message(self.up_reader)
            if kind == b"Z":
                self.status = body[:1]
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

    async def query(self, sql: str, copy_data: Iterator[bytes] | None = None) -> _Result:
        """Run one simple query upstream (relay diverted to us); feed COPY FROM STDIN."""
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
                result.error = body
            elif kind == b"Z":
                return result

    async def raise_upstream(self, message: str, sqlstate: str) -> bytes:
        """Fail the client's transaction upstream, as the real error would; the ErrorResponse."""
        text = message.replace("$", "")
        result = await self.query(
            f"DO $$BEGIN RAISE EXCEPTION USING MESSAGE = {_literal(text)}, "
            f"ERRCODE = {_literal(sqlstate)}; END$$"
        )
        assert result.error is not None
        return result.error

    # -- client -> upstream --------------------------------------------------------------

    async def serve(self) -> None:
        relay = asyncio.create_task(self.relay())
        try:
            while True:
                batch = await self._read_batch()
                if batch is None:
                    return
                if self._is_local(batch):
                    await self.idle.wait()
                    await self._answer_locally(batch)
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

    def _is_local(self, batch: list[tuple[bytes, bytes]]) -> bool:
        for kind, body in batch:
            if kind == b"P":
                name, rest = body.split(b"\0", 1)
                if _COPY_S3.match(rest.split(b"\0", 1)[0].decode()):
                    return True
            if kind == b"B":
                statement = _cstrings(body)[1]
                if statement in self.local_statements:
                    return True
                sql = self.statements.get(statement, "")
                if self.emulator.fail_commits and _COMMIT.match(sql):
                    return True
        return False

    async def _answer_locally(self, batch: list[tuple[bytes, bytes]]) -> None:
        out = self.client_writer
        failed = False
        self.divert = asyncio.Queue()
        try:
            for kind, body in batch:
                if kind == b"S":
                    out.write(_message(b"Z", self.status))
                elif failed or kind == b"H":
                    continue
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
                elif kind == b"E":
                    portal = body.split(b"\0")[0]
                    sql = self.statements[self.portals.get(portal, b"")]
                    error, tag = await self._execute(sql)
                    if error is not None:
                        out.write(_message(b"E", error))
                        failed = True
                    else:
                        out.write(_message(b"C", tag + b"\0"))
                else:
                    out.write(_message(b"E", _error_body("0A000", f"emulator: {kind!r} here")))
                    failed = True
            await out.drain()
        finally:
            self.divert = None

    async def _execute(self, sql: str) -> tuple[bytes | None, bytes]:
        if _COMMIT.match(sql) and self.emulator.fail_commits:
            self.emulator.fail_commits -= 1
            error = await self.raise_upstream(
                "1023 Serializable isolation violation on table (emulated)", "40001"
            )
            return error, b""
        try:
            table, columns, chunks = await asyncio.to_thread(self._read_copy, sql)
            expected = len(columns) if columns else await self._column_count(table)
            if chunks.num_columns != expected:
                raise CopyFailed(
                    f"Spectrum Scan Error: the Parquet files have {chunks.num_columns} columns,"
                    f" table {table} has {expected}"
                )
        except CopyFailed as exc:
            return await self.raise_upstream(str(exc), "XX000"), b""
        column_list = f" ({', '.join(columns)})" if columns else ""
        result = await self.query(
            f"COPY {table}{column_list} FROM STDIN (FORMAT csv)", _csv_chunks(chunks)
        )
        if result.error is not None:
            return result.error, b""
        self.emulator.copies.append(sql)
        return None, result.tag

    async def _column_count(self, table: str) -> int:
        result = await self.query(
            "SELECT count(*) FROM pg_attribute WHERE attrelid = "
            f"{_literal(table)}::regclass AND attnum > 0 AND NOT attisdropped"
        )
        if result.error is not None:
            raise CopyFailed(f"table {table} does not exist")
        return int(result.rows[0][0] or 0)

    def _read_copy(self, sql: str) -> tuple[str, list[str], Any]:
        """Parse the COPY and read its Parquet objects (in a worker thread: boto3 blocks)."""
        match = _COPY_S3.match(sql)
        assert match is not None
        options = match["options"].upper()
        if not re.search(r"\bFORMAT\s+(AS\s+)?PARQUET\b", options):
            raise CopyFailed("the emulator only loads FORMAT AS PARQUET")
        if not re.search(r"\bIAM_ROLE\s+'", options) or re.search(
            r"\b(CREDENTIALS|ACCESS_KEY_ID|SECRET_ACCESS_KEY|SESSION_TOKEN)\b", options
        ):
            raise CopyFailed("COPY must authorise with IAM_ROLE only")
        uri = match["uri"].replace("''", "'")
        objects = [uri]
        if re.search(r"\bMANIFEST\b", options):
            manifest = json.loads(self.emulator.get_object(uri))
            objects = []
            for entry in manifest["entries"]:
                length = entry.get("meta", {}).get("content_length")
                if length is None:
                    raise CopyFailed("manifest entries of Parquet files need meta.content_length")
                objects.append(entry["url"])
        bodies = [self.emulator.get_object(o) for o in objects]
        if re.search(r"\bMANIFEST\b", options):
            for entry, body in zip(manifest["entries"], bodies, strict=True):
                if len(body) != entry["meta"]["content_length"]:
                    raise CopyFailed(f"content_length of {entry['url']} is wrong")
        try:
            tables = [pq.read_table(io.BytesIO(body)) for body in bodies]
        except Exception as exc:  # noqa: BLE001 - an unreadable file fails the COPY
            raise CopyFailed(f"cannot read Parquet: {exc}") from None
        widths = {t.num_columns for t in tables}
        if len(widths) > 1:
            raise CopyFailed(f"Parquet files of one COPY differ in column count: {widths}")
        columns = [c.strip() for c in (match["columns"] or "").split(",") if c.strip()]
        return match["table"], columns, _concat_positionally(tables)


def _concat_positionally(tables: list[Any]) -> Any:
    """One table of all files, by position (names are ignored, as Redshift ignores them)."""
    import pyarrow as pa

    if not tables:
        return pa.table({})
    names = [f"c{i}" for i in range(tables[0].num_columns)]
    return pa.concat_tables([t.rename_columns(names) for t in tables], promote_options="permissive")


def _csv_chunks(table: Any) -> Iterator[bytes]:
    import pyarrow as pa

    if not table.num_rows:
        return
    # Naive UTC timestamps: PostgreSQL reads them in the session zone, set to UTC below.
    columns = [
        c.cast(pa.timestamp(c.type.unit)) if pa.types.is_timestamp(c.type) and c.type.tz else c
        for c in table.columns
    ]
    table = pa.table(columns, names=table.column_names)
    sink = io.BytesIO()
    pacsv.write_csv(table, sink, pacsv.WriteOptions(include_header=False))
    data = sink.getvalue()
    for start in range(0, len(data), _CSV_CHUNK):
        yield data[start : start + _CSV_CHUNK]


def _error_body(sqlstate: str, message: str) -> bytes:
    return b"SERROR\0C" + sqlstate.encode() + b"\0M" + message.encode() + b"\0\0"


async def _read_message(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    kind = await reader.readexactly(1)
    (length,) = struct.unpack("!i", await reader.readexactly(4))
    return kind, await reader.readexactly(length - 4)


class RedshiftEmulator:
    """Listens on 127.0.0.1:<free port> in a background thread; `with` starts and stops it."""

    def __init__(self, upstream_url: str, s3: Any) -> None:
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
        self.port = 0
        self.queries: list[str] = []
        """Every SQL text clients sent (Parse and Query), as sent."""
        self.copies: list[str] = []
        """COPY statements that loaded rows."""
        self.fail_commits = 0
        """How many coming COMMITs fail with a serializable isolation violation."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.AbstractServer | None = None

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
            **extra,
        }

    def __enter__(self) -> RedshiftEmulator:
        self._create_system_views()
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._accept, "127.0.0.1", 0), self._loop
        )
        self._server = future.result(timeout=10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def _create_system_views(self) -> None:
        """STV_SESSIONS (AWS: "STV_SESSIONS"): one row per session, `process` its pid and
        `starttime` (timestamp, UTC) when it started. Every emulated session is one upstream
        backend, so pg_stat_activity answers it, and PG_TERMINATE_BACKEND ends it."""
        import psycopg

        from fleet_import.config import libpq_url

        with psycopg.connect(libpq_url(self.upstream_url), autocommit=True) as conn:
            conn.execute(
                "CREATE OR REPLACE VIEW public.stv_sessions AS "
                "SELECT pid AS process, (backend_start AT TIME ZONE 'UTC') AS starttime, "
                "usename::text AS user_name, datname::text AS db_name "
                "FROM pg_stat_activity WHERE backend_type = 'client backend'"
            )

    def __exit__(self, *exc_info: object) -> None:
        async def stop() -> None:
            assert self._server is not None
            self._server.close()
            for task in asyncio.all_tasks() - {asyncio.current_task()}:
                task.cancel()

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
                if k and k.decode() in _STARTUP_KEEP - {"TimeZone"}
            )
            # Redshift sessions run in UTC; COPY sends timestamps as naive UTC.
            kept += b"TimeZone\0UTC\0"
            packet = struct.pack("!i", _PROTOCOL_3) + kept + b"\0"
            return struct.pack("!i", len(packet) + 4) + packet
