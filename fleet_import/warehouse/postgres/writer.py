"""A PostgreSQL slice replacement in progress: one transaction holding the scope's lock, in
which the previous rows are deleted, the new ones COPYed in stamped, and the registry
upserted at `commit()`. The writer is given its connection (`connect`) and the counters it
adds to; it does not know the warehouse that opened it."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from itertools import chain
from typing import Any

import psycopg
import pyarrow as pa

from fleet_import.contracts.model import DatasetContract
from fleet_import.errors import WarehouseError
from fleet_import.warehouse.base import (
    SOURCE_LINE_COLUMN,
    CommitOutcomeUnknown,
    LoadFile,
    SliceCommit,
    WarehouseSession,
)
from fleet_import.warehouse.committer import OpenSlice, SliceRequest, WriterCounters, run
from fleet_import.warehouse.postgres import driver
from fleet_import.warehouse.postgres.binary_copy import (
    CopyEncoder,
    ParquetSource,
    stream_parquet,
    text_field,
    uuid_field,
)
from fleet_import.warehouse.postgres.ddl import DIALECT
from fleet_import.warehouse.postgres.slice_sql import (
    QUERIES,
    SCOPE_LOCK_CLASS,
    copy_keys_sql,
    copy_sql,
    create_keys_sql,
)
from fleet_import.warehouse.sql import (
    delete_keys_sql,
    drop_table_sql,
    registered_slices_sql,
    staging_table,
)

log = logging.getLogger(__name__)

Connect = Callable[[], psycopg.Connection[Any]]
"""A new connection to the warehouse, driver errors already translated."""


# has_parameter_privilege and GRANT SET ON PARAMETER came with PostgreSQL 15, and with them
# wal_compression's methods beyond pglz.
_PARAMETER_PRIVILEGES_VERSION = 150_000

FULL_PAGE_METHODS = ("lz4", "zstd")
"""What a replace compresses its full-page images with: the first of these the server's build
offers (`pg_settings.enumvals`; a build may have neither). pglz, which every build has, is
never taken: it costs the DELETE three times its CPU, more time than the WAL it saves
(benchmarks/README.md, issue 30)."""

_UNCOMPRESSED = "a replace writes its full-page images to WAL uncompressed"
_BEFORE_15 = (
    "PostgreSQL before 15 has no lz4 or zstd for wal_compression: a replace keeps the "
    "server's setting"
)
_said: set[tuple[str, str]] = set()
"""(server, note) pairs this process has logged: each is said once."""


@dataclass(frozen=True)
class FullPageCompression:
    """What a replace's transaction compresses its full-page images with (None: the server's
    setting stays), and, where that is less than lz4, why."""

    method: str | None
    note: str | None = None


def full_page_compression(
    setting: str, offered: Sequence[str], may_set: bool
) -> FullPageCompression:
    """The method for a server whose wal_compression is `setting`, whose build offers
    `offered`, and on which this role `may_set` it."""
    if setting != "off":
        return FullPageCompression(None)  # the server compresses every transaction already
    method = next((m for m in FULL_PAGE_METHODS if m in offered), None)
    if method is None:
        return FullPageCompression(
            None,
            f"the server's build offers no {' or '.join(FULL_PAGE_METHODS)} for "
            f"wal_compression (only {', '.join(offered)}): {_UNCOMPRESSED}",
        )
    if not may_set:
        return FullPageCompression(
            None,
            "this role may not set wal_compression (GRANT SET ON PARAMETER wal_compression "
            f"TO it, PostgreSQL 15+): {_UNCOMPRESSED}",
        )
    if method != FULL_PAGE_METHODS[0]:
        return FullPageCompression(
            method,
            f"the server's build has no {FULL_PAGE_METHODS[0]} for wal_compression: a replace "
            f"compresses its full-page images with {method}",
        )
    return FullPageCompression(method)


def compress_full_pages(conn: psycopg.Connection[Any]) -> str | None:
    """Compress this transaction's full-page images where the session may: a replace
    deletes the old slice's rows, and the first change of each of its pages after a
    checkpoint writes the whole page to WAL (the old slice's heap again, 166 MB per 1M
    trips). lz4 halves those bytes at no measurable CPU, while the rows' own WAL records,
    the COPY's included, are never compressed. Readers and locks are untouched: it is a
    setting of this transaction's WAL only. Returns the method set, if any; where it is not
    lz4, says why once per server and process."""
    server = f"{conn.info.host}:{conn.info.port}"
    if conn.info.server_version < _PARAMETER_PRIVILEGES_VERSION:
        _say_once(server, _BEFORE_15)
        return None
    setting, offered, may_set = conn.execute(QUERIES["full_page_compression"]).fetchone()
    chosen = full_page_compression(setting, offered, may_set)
    if chosen.note is not None:
        _say_once(server, chosen.note)
    if chosen.method is not None:
        conn.execute(QUERIES["compress_full_pages"], {"method": chosen.method})
    return chosen.method


def _say_once(server: str, note: str) -> None:
    if (server, note) not in _said:
        _said.add((server, note))
        log.warning("PostgreSQL warehouse at %s: %s", server, note)


class PostgresSliceWriter(OpenSlice):
    """One slice replacement in progress: an open transaction holding the scope's lock, with
    the previous rows already deleted. Closing it without `commit()` rolls everything back."""

    def __init__(
        self,
        request: SliceRequest,
        *,
        connect: Connect,
        counters: WriterCounters,
        setting: str = driver.WAREHOUSE_URL,
    ) -> None:
        super().__init__(request)
        self._counters = counters
        self._setting = setting
        self._stamps = (
            text_field(request.tenant_id),
            text_field(request.source_scope),
            uuid_field(request.batch_id),
        )
        self._conn: psycopg.Connection[Any] | None = connect()
        with self._guard() as conn:
            if request.on_session is not None:
                pid, started = conn.execute(QUERIES["session_identity"]).fetchone()
                request.on_session(WarehouseSession(pid, started.isoformat()))
            conn.execute(
                QUERIES["lock_scope"],
                {
                    "tenant_id": request.tenant_id,
                    "source_scope": request.source_scope,
                    "lock_class": SCOPE_LOCK_CLASS,
                },
            )
            registered = conn.execute(
                *registered_slices_sql(*request.scope, for_update=True)
            ).fetchall()
            if registered:
                compress_full_pages(conn)
            self._clear_previous(conn, registered)

    @contextmanager
    def _guard(self) -> Iterator[psycopg.Connection[Any]]:
        """Any error ends the slice: rolled back, translated at the driver's one boundary."""
        if self._conn is None:
            raise WarehouseError("this slice was already committed or rolled back")
        with driver.translated(self._setting):
            try:
                yield self._conn
            except BaseException:
                self.close()
                raise

    def load_files(self, contract: DatasetContract, files: Iterable[LoadFile]) -> int:
        """COPY normalized files into the slice (stamped in the stream) in one COPY; returns
        rows. `files` may be a generator that waits for each file to be normalized: the
        first is taken here, the others on the COPY's reader thread when the COPY needs them."""
        self._check_declared(contract)
        name = contract.name
        done = self.row_counts[name]
        progress = self._request.progress
        pending = iter(files)
        with self._guard() as conn, conn.cursor() as cursor:
            first = next(pending, None)  # a failure to take it ends the slice like any other
            if first is None:
                return 0
            self._request.check_fence()
            encoder = CopyEncoder(contract.arrow_schema, self._stamps)
            sources = (ParquetSource(f.path, f.excluded_lines) for f in chain([first], pending))
            self._counters.copies += 1
            with cursor.copy(copy_sql(contract)) as copy:
                stream_parquet(
                    sources,
                    encoder,
                    copy.write,
                    line_column=SOURCE_LINE_COLUMN,
                    on_batch=None if progress is None else lambda rows: progress(name, done + rows),
                )
            self.row_counts[name] += cursor.rowcount
            return cursor.rowcount

    def discard_keys(self, contract: DatasetContract, keys: pa.Table) -> int:
        """Delete every row of this batch whose natural key is in `keys` (duplicate keys
        found once all files were loaded: every copy is rejected)."""
        if not keys.num_rows:
            return 0
        encoder = CopyEncoder(keys.schema)
        with self._guard() as conn, conn.cursor() as cursor:
            self._request.check_fence()
            cursor.execute(create_keys_sql(contract))
            with cursor.copy(copy_keys_sql(contract)) as copy:
                copy.write(encoder.header)
                for batch in keys.to_batches():
                    copy.write(memoryview(encoder.encode(batch)))
                copy.write(encoder.trailer)
            request = self._request
            delete = delete_keys_sql(contract, *request.scope, request.batch_id)
            deleted = run(cursor, delete).rowcount
            cursor.execute(drop_table_sql(staging_table(contract, "discard")))
        self.row_counts[contract.name] -= deleted
        return deleted

    def commit(self) -> SliceCommit:
        """Register every dataset of the slice under this batch and commit: the moment the
        new slice becomes visible, whole."""
        with self._guard() as conn:
            for statement in self._register_sql(DIALECT, self._request.batch_id):
                conn.execute(*statement)
            self._request.check_fence()  # the last moment the lease can stop the COMMIT
            try:
                conn.commit()
            except psycopg.Error as exc:
                if exc.sqlstate is not None:  # the server answered: rolled back
                    raise
                hint = driver.unreachable(setting=self._setting)
                raise CommitOutcomeUnknown(
                    f"the slice's COMMIT got no answer ({hint})",
                    kind=driver.translate(exc).kind,
                    setting=self._setting,
                ) from None
        self.close()
        return SliceCommit(self._request.batch_id, dict(self.row_counts))

    def close(self) -> None:
        """Roll back whatever was not committed and give the connection back."""
        conn, self._conn = self._conn, None
        if conn is not None:
            # A failed rollback means the connection is gone: the server rolled back.
            with suppress(psycopg.Error):
                conn.rollback()
            conn.close()
