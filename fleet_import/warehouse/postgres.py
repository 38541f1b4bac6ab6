"""The PostgreSQL warehouse: curated tables in schema `curated`, loaded with binary COPY.

A slice is replaced in one transaction: delete the scope's rows, COPY the new ones straight
into the curated table (stamped in the COPY stream itself, so no staging table and no second
write), upsert the registry. MVCC keeps readers on the old slice until the commit.
Driver errors become WarehouseError in `_transaction`, and nowhere else.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from itertools import chain
from typing import Any

import psycopg
import pyarrow as pa
from psycopg import sql

from fleet_import.config import libpq_url
from fleet_import.contracts import DatasetContract
from fleet_import.sqlfiles import load_queries
from fleet_import.warehouse.base import (
    SOURCE_LINE_COLUMN,
    STAMP_COLUMNS,
    LoadFile,
    Progress,
    SessionSink,
    SliceCommit,
    SliceCommitter,
    WarehouseError,
    WarehouseSession,
    check_contract,
)
from fleet_import.warehouse.binary_copy import (
    CopyEncoder,
    EncodeError,
    ParquetSource,
    SourceError,
    stream_parquet,
    text_field,
    uuid_field,
)

QUERIES = load_queries("fleet_import.warehouse", "queries.sql")
REGISTRY_SCHEMA = "curated"
_CONNECT_TIMEOUT_SECONDS = 10
# How long end_session waits for the terminated backend to exit (and release its locks).
_TERMINATE_WAIT_MS = 10_000
# First keys of the two-key advisory locks, so ours never meet another component's.
_DDL_LOCK_CLASS = 0x46574844  # "FWHD"
_SCOPE_LOCK_CLASS = 0x46575343  # "FWSC"
# SQLSTATEs worth a retry: connection exceptions (08), transaction rollbacks such as
# serialization failures and deadlocks (40), too many connections, server shutting down.
_TRANSIENT_CLASSES = frozenset({"08", "40"})
_TRANSIENT_STATES = frozenset({"53300", "57P01", "57P02", "57P03"})

PG_TYPES: Mapping[str, str] = {
    "string": "text",
    "int64": "bigint",
    "float64": "double precision",
    "bool": "boolean",
    "timestamptz": "timestamp with time zone",
    "date": "date",
}
"""Contract column type -> PostgreSQL type, spelled as format_type() reports it."""
_STAMP_TYPES = ("text", "text", "uuid")
CONNECTION_HINT = (
    "could not reach the warehouse (is it up, is FLEET_WAREHOUSE_URL right, are there free "
    "connections?)"
)


# -- SQL builders (pure functions) -------------------------------------------------------


def _split(target_table: str) -> tuple[str, str]:
    schema, _, relation = target_table.partition(".")
    return schema, relation


def table_identifier(target_table: str) -> sql.Identifier:
    return sql.Identifier(*_split(target_table))


def expected_columns(contract: DatasetContract) -> list[tuple[str, str, bool]]:
    """(name, type, not null) of the contract's curated table, in order."""
    columns = [(c.name, PG_TYPES[c.type], not c.nullable) for c in contract.columns]
    return columns + [
        (name, pg_type, True) for name, pg_type in zip(STAMP_COLUMNS, _STAMP_TYPES, strict=True)
    ]


def index_name(contract: DatasetContract) -> str:
    """`<table>_slice_ix`, shortened to PostgreSQL's 63 bytes with a digest when needed."""
    relation = _split(contract.target_table)[1]
    name = f"{relation}_slice_ix"
    if len(name) <= 63:
        return name
    digest = hashlib.blake2s(relation.encode(), digest_size=4).hexdigest()
    return f"{relation[:45]}_{digest}_slice_ix"


def create_table_sql(contract: DatasetContract) -> sql.Composed:
    columns = [
        sql.SQL("{} {}{}").format(
            sql.Identifier(name), sql.SQL(pg_type), sql.SQL(" NOT NULL" if not_null else "")
        )
        for name, pg_type, not_null in expected_columns(contract)
    ]
    return sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
        table_identifier(contract.target_table), sql.SQL(", ").join(columns)
    )


def create_index_sql(contract: DatasetContract) -> sql.Composed:
    """Slices are found through the registry's batch id: a uuid index costs a COPY about
    half what a (tenant_id, source_scope) text index does (collated comparisons per row)."""
    return sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} ({})").format(
        sql.Identifier(index_name(contract)),
        table_identifier(contract.target_table),
        sql.Identifier(STAMP_COLUMNS[2]),
    )


def copy_sql(contract: DatasetContract) -> sql.Composed:
    columns = [*contract.column_names, *STAMP_COLUMNS]
    return sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
        table_identifier(contract.target_table),
        sql.SQL(", ").join(map(sql.Identifier, columns)),
    )


def slice_rows_sql(batch_test: str, alias: str | None = None) -> sql.Composed:
    """The rows the stamp columns place in the scope's slice: `batch_test` compares the
    batch id (e.g. `= %(owner)s`); tenant and scope come from the parameters of those names."""
    qualifier = (alias,) if alias else ()
    tenant, scope, batch = (sql.Identifier(*qualifier, column) for column in STAMP_COLUMNS)
    return sql.SQL(
        "{} " + batch_test + " AND {} = %(tenant_id)s AND {} = %(source_scope)s"
    ).format(batch, tenant, scope)


def delete_slice_sql(target_table: str) -> sql.Composed:
    """A slice's rows all carry its registered batch id (one transaction writes both)."""
    return sql.SQL("DELETE FROM {} WHERE {}").format(
        table_identifier(target_table), slice_rows_sql("= ANY(%(owners)s)")
    )


def count_slice_sql(target_table: str) -> sql.Composed:
    return sql.SQL("SELECT count(*) FROM {} WHERE {}").format(
        table_identifier(target_table), slice_rows_sql("= %(owner)s")
    )


# -- the warehouse -----------------------------------------------------------------------


class PostgresWarehouse(SliceCommitter):
    """Warehouse on PostgreSQL. Each method is one transaction on its own connection, so an
    instance may be shared by threads."""

    def __init__(self, url: str) -> None:
        self._conninfo = libpq_url(url)
        self._ensured: set[tuple[str, str]] = set()
        self.copies = 0
        """COPY statements run by this instance (a resumed batch must run none)."""

    @contextmanager
    def _transaction(self) -> Iterator[psycopg.Connection[Any]]:
        """One connection, one transaction; the single boundary where errors become ours."""
        try:
            with psycopg.connect(self._conninfo, connect_timeout=_CONNECT_TIMEOUT_SECONDS) as conn:
                yield conn
        except psycopg.Error as exc:
            raise _translate(exc) from None
        except (SourceError, EncodeError) as exc:
            raise WarehouseError(f"cannot load a normalised file: {exc}") from exc

    # -- tables --------------------------------------------------------------------------

    def ensure_tables(self, contracts: Iterable[DatasetContract]) -> None:
        contracts = list(contracts)
        for contract in contracts:
            check_contract(contract)
        with self._transaction() as conn:
            conn.execute(QUERIES["lock_ddl"], {"lock_class": _DDL_LOCK_CLASS})
            schemas = {REGISTRY_SCHEMA, *(_split(c.target_table)[0] for c in contracts)}
            for schema in sorted(schemas):
                conn.execute(
                    sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema))
                )
            conn.execute(QUERIES["create_registry"])
            for contract in contracts:
                self._ensure_table(conn, contract)
        self._ensured.update((c.target_table, c.contract_version) for c in contracts)

    def _ensure_table(self, conn: psycopg.Connection[Any], contract: DatasetContract) -> None:
        schema, relation = _split(contract.target_table)
        found = conn.execute(
            QUERIES["table_columns"], {"schema": schema, "relation": relation}
        ).fetchall()
        if not found:
            conn.execute(create_table_sql(contract))
        elif [tuple(row) for row in found] != expected_columns(contract):
            raise WarehouseError(
                f"table {contract.target_table} does not match dataset {contract.name!r}: "
                f"has {[tuple(row) for row in found]}, expected {expected_columns(contract)}"
            )
        # Only when missing: CREATE INDEX takes a SHARE lock even when the index exists,
        # which would wait for every running load of the table.
        exists = conn.execute(
            QUERIES["relation_exists"], {"schema": schema, "relation": index_name(contract)}
        ).fetchone()
        if not (exists and exists[0]):
            conn.execute(create_index_sql(contract))

    # -- slices --------------------------------------------------------------------------

    def _start_slice(
        self,
        tenant_id: str,
        source_scope: str,
        batch_id: uuid.UUID,
        contracts: Sequence[DatasetContract],
        progress: Progress | None,
        on_session: SessionSink | None,
    ) -> PostgresSliceWriter:
        return PostgresSliceWriter(
            self, tenant_id, source_scope, batch_id, contracts, progress, on_session
        )

    def end_session(self, session: WarehouseSession) -> bool:
        """Needs the right to signal that backend: the same role, a superuser, or a member
        of pg_signal_backend."""
        params = {"pid": session.pid, "started": session.started, "timeout_ms": _TERMINATE_WAIT_MS}
        with self._transaction() as conn:
            row = conn.execute(QUERIES["end_session"], params).fetchone()
        return bool(row and row[0])

    def execute(self, statement: str) -> None:
        """Run operator-configured SQL (refresh_dependants: materialized-view refreshes)."""
        with self._transaction() as conn:
            conn.execute(statement.encode())

    def slice_owner(self, tenant_id: str, source_scope: str) -> uuid.UUID | None:
        scope = {"tenant_id": tenant_id, "source_scope": source_scope}
        with self._transaction() as conn:
            if not _registry_exists(conn):
                return None
            owners = [row[0] for row in conn.execute(QUERIES["slice_owner"], scope)]
        if len(owners) > 1:
            raise WarehouseError(
                f"slice {tenant_id}/{source_scope} is stamped by several batches: {owners}"
            )
        return owners[0] if owners else None

    def slice_counts(self, tenant_id: str, source_scope: str) -> dict[str, int]:
        scope = {"tenant_id": tenant_id, "source_scope": source_scope}
        with self._transaction() as conn:
            if not _registry_exists(conn):
                return {}
            tables = conn.execute(QUERIES["slice_tables"], scope).fetchall()
            return {
                dataset: conn.execute(  # type: ignore[index]
                    count_slice_sql(table), {**scope, "owner": owner}
                ).fetchone()[0]
                for dataset, table, owner in tables
            }


def _registry_exists(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute(
        QUERIES["relation_exists"], {"schema": REGISTRY_SCHEMA, "relation": "ingestion_slices"}
    ).fetchone()
    return bool(row and row[0])


def _translate(exc: psycopg.Error) -> WarehouseError:
    """Driver errors become ours by exception class and SQLSTATE, never by message text."""
    state = exc.sqlstate
    # Serialization failures and deadlocks are class 40; a dropped connection has no state.
    transient = isinstance(exc, psycopg.OperationalError) and (
        state is None or state[:2] in _TRANSIENT_CLASSES or state in _TRANSIENT_STATES
    )
    # Never the driver's own text without a SQLSTATE: a connection error can quote the
    # connection string, and with it part of a password.
    reason = (exc.diag.message_primary or type(exc).__name__) if state else CONNECTION_HINT
    return WarehouseError(
        f"warehouse error ({type(exc).__name__}, SQLSTATE {state}): {reason}",
        transient=transient,
    )


class PostgresSliceWriter:
    """One slice replacement in progress: an open transaction holding the scope's lock, with
    the previous rows already deleted. Closing it without `commit()` rolls everything back."""

    def __init__(
        self,
        warehouse: PostgresWarehouse,
        tenant_id: str,
        source_scope: str,
        batch_id: uuid.UUID,
        contracts: Sequence[DatasetContract],
        progress: Progress | None,
        on_session: SessionSink | None = None,
    ) -> None:
        self._warehouse = warehouse
        self._scope = {"tenant_id": tenant_id, "source_scope": source_scope}
        self._batch_id = batch_id
        self._contracts = {c.name: c for c in contracts}
        self._progress = progress
        self._stamps = (text_field(tenant_id), text_field(source_scope), uuid_field(batch_id))
        self.row_counts: dict[str, int] = dict.fromkeys(self._contracts, 0)
        try:
            self._conn: psycopg.Connection[Any] | None = psycopg.connect(
                warehouse._conninfo, connect_timeout=_CONNECT_TIMEOUT_SECONDS
            )
        except psycopg.Error as exc:
            raise _translate(exc) from None
        with self._guard():
            conn = self._conn
            if on_session is not None:
                pid, started = conn.execute(QUERIES["session_identity"]).fetchone()
                on_session(WarehouseSession(pid, started.isoformat()))
            conn.execute(QUERIES["lock_scope"], {**self._scope, "lock_class": _SCOPE_LOCK_CLASS})
            rows = conn.execute(QUERIES["registered_slices"], self._scope).fetchall()
            self._registered = {dataset: table for dataset, table, _ in rows}
            owners = sorted({owner for _, _, owner in rows})
            # The slice is replaced as a whole: every table that holds it now or will hold
            # it is cleared first, so no later delete can touch rows this batch wrote (a
            # dataset may have moved to another table, or left the slice).
            tables = {*self._registered.values(), *(c.target_table for c in contracts)}
            if owners:
                for table in sorted(tables):
                    conn.execute(delete_slice_sql(table), {**self._scope, "owners": owners})

    def __enter__(self) -> PostgresSliceWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @contextmanager
    def _guard(self) -> Iterator[psycopg.Connection[Any]]:
        """Any error ends the slice: rolled back, translated at this one boundary."""
        if self._conn is None:
            raise WarehouseError("this slice was already committed or rolled back")
        try:
            yield self._conn
        except psycopg.Error as exc:
            self.close()
            raise _translate(exc) from None
        except (SourceError, EncodeError) as exc:
            self.close()
            raise WarehouseError(f"cannot load a normalised file: {exc}") from exc
        except BaseException:
            self.close()
            raise

    def load_files(self, contract: DatasetContract, files: Iterable[LoadFile]) -> int:
        """COPY normalised files into the slice (stamped in the stream) in one COPY; returns
        rows. `files` may be a generator that waits for each file to be normalised: the
        first is taken here, the others on the COPY's reader thread when the COPY needs them."""
        if contract.name not in self._contracts:
            raise WarehouseError(f"dataset {contract.name!r} was not declared for this slice")
        name = contract.name
        done = self.row_counts[name]
        progress = self._progress
        pending = iter(files)
        with self._guard() as conn, conn.cursor() as cursor:
            first = next(pending, None)  # a failure to take it ends the slice like any other
            if first is None:
                return 0
            encoder = CopyEncoder(contract.arrow_schema, self._stamps)
            sources = (ParquetSource(f.path, f.excluded_lines) for f in chain([first], pending))
            self._warehouse.copies += 1
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
        key_columns = list(contract.natural_key)
        staging = sql.Identifier(f"fleet_discard_{contract.name}")
        target = table_identifier(contract.target_table)
        match = sql.SQL(" AND ").join(
            sql.SQL("t.{0} = k.{0}").format(sql.Identifier(column)) for column in key_columns
        )
        encoder = CopyEncoder(keys.schema)
        with self._guard() as conn, conn.cursor() as cursor:
            cursor.execute(
                sql.SQL(
                    "CREATE TEMP TABLE {} ON COMMIT DROP AS SELECT {} FROM {} WITH NO DATA"
                ).format(staging, sql.SQL(", ").join(map(sql.Identifier, key_columns)), target)
            )
            with cursor.copy(sql.SQL("COPY {} FROM STDIN (FORMAT BINARY)").format(staging)) as copy:
                copy.write(encoder.header)
                for batch in keys.to_batches():
                    copy.write(memoryview(encoder.encode(batch)))
                copy.write(encoder.trailer)
            cursor.execute(
                sql.SQL("DELETE FROM {} AS t USING {} AS k WHERE {} AND {}").format(
                    target, staging, match, slice_rows_sql("= %(batch_id)s", alias="t")
                ),
                {**self._scope, "batch_id": self._batch_id},
            )
            deleted = cursor.rowcount
            cursor.execute(sql.SQL("DROP TABLE {}").format(staging))
        self.row_counts[contract.name] -= deleted
        return deleted

    def commit(self) -> SliceCommit:
        """Register every dataset of the slice under this batch and commit: the moment the
        new slice becomes visible, whole."""
        with self._guard() as conn:
            for name, contract in self._contracts.items():
                conn.execute(
                    QUERIES["upsert_slice"],
                    {
                        **self._scope,
                        "dataset": name,
                        "batch_id": self._batch_id,
                        "row_count": self.row_counts[name],
                        "target_table": contract.target_table,
                    },
                )
            for dataset in sorted(self._registered.keys() - self._contracts.keys()):
                conn.execute(QUERIES["forget_slice"], {**self._scope, "dataset": dataset})
            conn.commit()
        self.close()
        return SliceCommit(self._batch_id, dict(self.row_counts))

    def close(self) -> None:
        """Roll back whatever was not committed and give the connection back."""
        conn, self._conn = self._conn, None
        if conn is not None:
            # A failed rollback means the connection is gone: the server rolled back.
            with suppress(psycopg.Error):
                conn.rollback()
            conn.close()
