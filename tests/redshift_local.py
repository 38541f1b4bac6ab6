"""What a Redshift emulator session (tests/redshift_session.py) answers itself instead of
relaying: COPY from S3 (tests/redshift_copy.py), TRUNCATE's commit, and the statements
Redshift refuses (tests/redshift_strict.py), each raised upstream so that the client's
transaction is aborted as Redshift aborts it."""

from __future__ import annotations

import asyncio
import struct
from typing import TYPE_CHECKING, Any

from tests import redshift_catalog as catalog
from tests import redshift_dialect as dialect
from tests import redshift_isolation as isolation
from tests import redshift_strict as strict
from tests import redshift_wire as wire
from tests.redshift_copy import (
    COPY_S3,
    CopyFailed,
    check_columns,
    check_types,
    copy_input,
    read_copy,
)

if TYPE_CHECKING:
    from tests.redshift_emulator import RedshiftEmulator

_EXECUTES = (b"E", b"Q")


class LocalAnswers:
    """The part of a session that answers here; `Session` relays the rest, and gives it
    `query`, `raise_upstream`, `raise_injected` and `_rewrite`."""

    emulator: RedshiftEmulator
    client_writer: Any
    status: bytes
    divert: asyncio.Queue[tuple[bytes, bytes]] | None
    statements: dict[bytes, str]
    portals: dict[bytes, bytes]
    local_statements: set[bytes]

    async def _refuse(self, sql: str) -> bytes | None:
        """What Redshift refuses before running it (tests/redshift_strict.py; Serverless's
        provisioned-only relations), raised upstream so that the transaction is aborted as
        Redshift aborts it."""
        refused = self._refusal(sql)
        if refused is None:
            return None
        self.emulator.refusals.append((sql, refused.sqlstate, refused.message))
        self.divert = asyncio.Queue()
        try:
            return await self.raise_upstream(refused.message, refused.sqlstate)
        finally:
            self.divert = None

    def _refusal(self, sql: str) -> strict.Refusal | None:
        message = catalog.refusal(sql) if self.emulator.serverless else None
        if message is not None:
            return strict.Refusal("42501", message)
        refused = strict.refusal(sql, in_block=self.status == b"T")
        if refused is not None:
            return refused
        altered = strict.alter_column_type(sql)
        if altered is not None:
            table, column, _ = altered
            encoding = self.emulator.encodings.get((table, column), "")
            if encoding.lower() in strict.NOT_WIDENED:
                return strict.widening_refusal(table, column, encoding)
        self.emulator.encodings.update(strict.encodings_set(sql))
        return None

    async def _check_parameters(self, sql: str, batch: list[tuple[bytes, bytes]]) -> bytes | None:
        """VARCHAR(n) holds n bytes: an INSERT's bound string longer than that fails (22001),
        where PostgreSQL would count characters. Runs once the statement holds its snapshot."""
        mapped = strict.parameter_columns(sql)
        bind = next((body for kind, body in batch if kind == b"B"), None)
        if mapped is None or not mapped[1] or bind is None:
            return None
        table, columns = mapped
        _, values = strict.bind_parameters(bind)
        self.divert = asyncio.Queue()
        try:
            try:
                widths = {name: width for name, width, _ in await self._columns(table)}
            except CopyFailed:
                return None  # no such table: PostgreSQL's own error follows
            for number, column in sorted(columns.items()):
                value = values[number - 1] if number <= len(values) else None
                width = widths.get(column)
                if value is not None and width is not None and len(value.encode()) > width:
                    refused = strict.too_long(width)
                    self.emulator.refusals.append((sql, refused.sqlstate, refused.message))
                    return await self.raise_upstream(refused.message, refused.sqlstate)
            return None
        finally:
            self.divert = None

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
            if kind == b"B" and wire.cstrings(body)[1] in self.local_statements:
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
                    out.write(wire.message(b"Z", self.status))
                elif failed or kind == b"H":
                    continue
                elif kind == b"P" and error is not None:
                    self._rewrite(kind, body)  # recorded, never prepared
                    out.write(wire.message(b"E", error))
                    failed = True
                elif kind == b"P":
                    name, rest = body.split(b"\0", 1)
                    text = rest.split(b"\0", 1)[0].decode()
                    self.statements[name] = text
                    self.local_statements.add(name)
                    self.emulator.queries.append(text)
                    out.write(wire.message(b"1"))
                elif kind == b"D":
                    if body[:1] == b"S":
                        out.write(wire.message(b"t", struct.pack("!h", 0)))
                    out.write(wire.message(b"n"))
                elif kind == b"B":
                    self._rewrite(kind, body)
                    out.write(wire.message(b"2"))
                elif kind == b"C":
                    self.local_statements.discard(body[1:].split(b"\0")[0])
                    out.write(wire.message(b"3"))
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
                        out.write(wire.message(b"E", error))
                        failed = True
                    else:
                        out.write(wire.message(b"C", tag + b"\0"))
                    if kind == b"Q":
                        out.write(wire.message(b"Z", self.status))
                else:
                    out.write(
                        wire.message(b"E", wire.error_body("0A000", f"emulator: {kind!r} here"))
                    )
                    failed = True
            await out.drain()
        finally:
            self.divert = None

    async def _execute(self, sql: str) -> tuple[bytes | None, bytes]:
        if isolation.kind(sql) == "truncate":
            # TRUNCATE commits the open transaction, then runs in one of its own.
            if self.status != b"I":
                await self.query("COMMIT")
            result = await self.query(dialect.to_postgres(sql))
            return result.error, result.tag
        injected = self.emulator.injected("copy")
        if injected is not None:
            return await self.raise_injected(injected), b""
        try:
            copied = await asyncio.to_thread(read_copy, sql, self.emulator.get_object)
            table, columns, rows, schemas = copied
            target = await self._columns(table)
            if columns:
                by_name = {name: (width, oid) for name, width, oid in target}
                target = [(c, *by_name.get(c.strip('"'), (None, None))) for c in columns]
            check_columns(table, rows, [(name, width) for name, width, _ in target])
            check_types(schemas, target)
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
            f"{wire.literal(table)}::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum"
        )
        if result.error is not None:
            raise CopyFailed(f"table {table} does not exist")
        return [
            (name.decode(), None if width is None else int(width), int(oid))
            for name, width, oid in result.rows
        ]
