"""The Redshift warehouse: normalised Parquet staged on S3, COPYed into temp tables, then
inserted stamped into the curated tables, all in one transaction per slice.

Redshift differs from PostgreSQL where it matters here: COPY reads S3 (not the client's
stream) and matches Parquet columns by position and count; there are no enforced keys, no
ON CONFLICT, no advisory locks; TRUNCATE commits; concurrent writers fail with a
serializable isolation violation (1023) that must be retried. A writer therefore keeps a
journal of what its transaction did, and on a transient failure replays the whole
transaction on a new connection (the staged files stay on S3 until the commit).
Exclusivity per scope lives in the operational PostgreSQL (scope reservations).
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import redshift_connector

from fleet_import.contracts import DatasetContract
from fleet_import.staging import StagingArea, StagingError
from fleet_import.warehouse import redshift_sql as q
from fleet_import.warehouse.base import (
    SOURCE_LINE_COLUMN,
    LoadFile,
    Progress,
    SessionSink,
    SliceCommit,
    SliceCommitter,
    WarehouseError,
    WarehouseSession,
    check_contract,
)

log = logging.getLogger(__name__)

RETRY_DELAYS_SECONDS: tuple[float, ...] = (0.5, 2.0, 5.0, 15.0)
"""Backoff between attempts of a slice transaction that hit a transient error."""
_SERIALIZATION_STATES = frozenset({"40001"})
# Redshift reports serializable isolation violations as "1023" in the message text (its
# SQLSTATE is the generic XX000), so this one case is recognised by its error number.
_SERIALIZATION_CODE = "1023"
_TRANSIENT_CLASSES = frozenset({"08", "40", "57"})
_DDL_RETRY_DELAYS_SECONDS: tuple[float, ...] = (0.5, 2.0)

T = TypeVar("T")
Cursor = Any  # redshift_connector.Cursor, untyped
Step = Callable[[Cursor], Any]


def _translate(exc: BaseException) -> WarehouseError:
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


_DRIVER_ERRORS = (redshift_connector.Error, OSError)


def _execute(cursor: Cursor, statement: str | q.Statement) -> Cursor:
    text, params = (statement, None) if isinstance(statement, str) else statement
    cursor.execute(text, params or None)
    return cursor


class RedshiftWarehouse(SliceCommitter):
    """Warehouse on Amazon Redshift. `connect_kwargs` go to `redshift_connector.connect`
    as they are (host, database, user/password or iam=True with cluster settings, ssl);
    they are never logged. Each method uses its own connection: instances may be shared."""

    def __init__(
        self,
        connect_kwargs: Mapping[str, Any],
        *,
        s3: Any,
        staging_uri: str,
        iam_role: str,
        retry_delays: Sequence[float] = RETRY_DELAYS_SECONDS,
    ) -> None:
        if not staging_uri.startswith("s3://"):
            raise WarehouseError("Redshift COPY reads from S3: the staging URI must be s3://")
        self._connect_kwargs = dict(connect_kwargs)
        self._staging = StagingArea(staging_uri, s3)
        self._iam_role = iam_role
        self._retry_delays = tuple(retry_delays)
        self._ensured: set[tuple[str, str]] = set()
        self.copies = 0
        """COPY statements run by this instance (a resumed batch must run none)."""

    def __repr__(self) -> str:  # connect_kwargs may hold a password: never shown
        return f"RedshiftWarehouse(host={self._connect_kwargs.get('host')!r})"

    def connect(self) -> Any:
        try:
            conn = redshift_connector.connect(**self._connect_kwargs)
            conn.autocommit = False
            return conn
        except _DRIVER_ERRORS as exc:
            raise _translate(exc) from None

    def _in_transaction(self, work: Callable[[Cursor], T], delays: Sequence[float]) -> T:
        """Run `work` in one transaction, committed; retried whole on transient errors."""
        for attempt in range(len(delays) + 1):
            try:
                conn = self.connect()
                try:
                    result = work(conn.cursor())
                    conn.commit()
                    return result
                finally:
                    with suppress(*_DRIVER_ERRORS):
                        conn.close()
            except _DRIVER_ERRORS as exc:
                error = _translate(exc)
            except WarehouseError as exc:
                error = exc
            if not error.transient or attempt == len(delays):
                raise error from None
            log.warning("warehouse transaction failed (%s); retrying", error)
            time.sleep(delays[attempt])
        raise AssertionError("unreachable")

    # -- tables --------------------------------------------------------------------------

    def ensure_tables(self, contracts: Iterable[DatasetContract]) -> None:
        contracts = list(contracts)
        for contract in contracts:
            check_contract(contract)

        def work(cursor: Cursor) -> None:
            schemas = {q.REGISTRY_TABLE.split(".")[0]}
            schemas |= {c.target_table.split(".")[0] for c in contracts}
            for schema in sorted(schemas):
                _execute(cursor, q.create_schema_sql(schema))
            _execute(cursor, q.create_registry_sql())
            for contract in contracts:
                schema, relation = contract.target_table.split(".")
                found = _execute(cursor, q.table_columns_sql(schema, relation)).fetchall()
                found = [tuple(row) for row in found]
                if not found:
                    _execute(cursor, q.create_table_sql(contract))
                elif found != q.expected_columns(contract):
                    raise WarehouseError(
                        f"table {contract.target_table} does not match dataset "
                        f"{contract.name!r}: has {found}, expected {q.expected_columns(contract)}"
                    )

        # Concurrent CREATE ... IF NOT EXISTS can conflict: a retry sees the table.
        self._in_transaction(work, _DDL_RETRY_DELAYS_SECONDS)
        self._ensured.update((c.target_table, c.contract_version) for c in contracts)

    # -- slices --------------------------------------------------------------------------

    def _start_slice(
        self,
        tenant_id: str,
        source_scope: str,
        batch_id: uuid.UUID,
        contracts: Sequence[DatasetContract],
        progress: Progress | None,
        on_session: SessionSink | None,
    ) -> RedshiftSliceWriter:
        return RedshiftSliceWriter(
            self, tenant_id, source_scope, batch_id, contracts, progress, on_session
        )

    def end_session(self, session: WarehouseSession) -> bool:
        """Needs the right to terminate that session: the same user, or a superuser."""

        def work(cursor: Cursor) -> bool:
            statement = q.end_session_sql(session.pid, session.started)
            return bool(_execute(cursor, statement).fetchall())

        return self._in_transaction(work, ())

    def execute(self, statement: str) -> None:
        """Run operator-configured SQL (refresh_dependants: materialized-view refreshes)."""
        self._in_transaction(lambda cursor: _execute(cursor, statement) and None, ())

    def _registry(self, cursor: Cursor, tenant_id: str, source_scope: str) -> list[tuple[str, ...]]:
        exists = _execute(cursor, q.registry_exists_sql()).fetchone()
        if not (exists and exists[0]):
            return []
        rows = _execute(cursor, q.registered_slices_sql(tenant_id, source_scope)).fetchall()
        return [tuple(row) for row in rows]

    def slice_owner(self, tenant_id: str, source_scope: str) -> uuid.UUID | None:
        rows = self._in_transaction(lambda c: self._registry(c, tenant_id, source_scope), ())
        owners = sorted({row[2] for row in rows})
        if len(owners) > 1:
            raise WarehouseError(
                f"slice {tenant_id}/{source_scope} is stamped by several batches: {owners}"
            )
        return uuid.UUID(owners[0]) if owners else None

    def slice_counts(self, tenant_id: str, source_scope: str) -> dict[str, int]:
        def work(cursor: Cursor) -> dict[str, int]:
            return {
                dataset: _execute(
                    cursor, q.count_slice_sql(table, tenant_id, source_scope, owner)
                ).fetchone()[0]
                for dataset, table, owner in self._registry(cursor, tenant_id, source_scope)
            }

        return self._in_transaction(work, ())


def _iso(value: Any) -> str:
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


def _stage_table(files: Iterable[LoadFile], contract: DatasetContract) -> Iterable[pa.Table]:
    """Each file without `_source_line` and its excluded lines: COPY matches Parquet columns
    by position and count, so the staged file holds exactly the contract's columns."""
    for load_file in files:
        try:
            table = pq.read_table(load_file.path)
        except (OSError, pa.ArrowException) as exc:
            raise WarehouseError(f"cannot read normalised file {load_file.path}: {exc}") from exc
        if load_file.excluded_lines:
            excluded = pa.array(sorted(load_file.excluded_lines), pa.int64())
            table = table.filter(pc.invert(pc.is_in(table[SOURCE_LINE_COLUMN], excluded)))
        try:
            yield table.select(contract.column_names).cast(contract.arrow_schema)
        except (KeyError, pa.ArrowException) as exc:
            raise WarehouseError(
                f"normalised file {load_file.path} does not match dataset {contract.name!r}: {exc}"
            ) from exc


class RedshiftSliceWriter:
    """One slice replacement in progress: an open Redshift transaction in which the scope's
    previous rows are already deleted. Closing it without `commit()` rolls back."""

    def __init__(
        self,
        warehouse: RedshiftWarehouse,
        tenant_id: str,
        source_scope: str,
        batch_id: uuid.UUID,
        contracts: Sequence[DatasetContract],
        progress: Progress | None,
        on_session: SessionSink | None = None,
    ) -> None:
        self._warehouse = warehouse
        self._on_session = on_session
        self._tenant_id, self._source_scope = tenant_id, source_scope
        self._batch_id = batch_id
        self._contracts = {c.name: c for c in contracts}
        self._progress = progress
        self._prefix = f"{tenant_id}/{batch_id}"
        self._staged: list[str] = []
        self._workdir = tempfile.TemporaryDirectory(prefix="fleet-redshift-")
        self.row_counts: dict[str, int] = dict.fromkeys(self._contracts, 0)
        self._journal: list[Step] = []
        self._registered: dict[str, str] = {}
        self._conn: Any = None
        self._open = True
        self._run(self._clear_slice)

    def __enter__(self) -> RedshiftSliceWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- the transaction, replayable -----------------------------------------------------

    def _run(self, step: Step, *, commit: bool = False) -> Any:
        """Run `step` in the slice's transaction. On a transient error (serializable
        isolation violation, lost connection) the transaction is gone: replay every step
        done so far on a new connection, after a backoff, then this one."""
        if not self._open:
            raise WarehouseError("this slice was already committed or rolled back")
        delays = self._warehouse._retry_delays
        for attempt in range(len(delays) + 1):
            try:
                if self._conn is None:
                    self._conn = self._warehouse.connect()
                    cursor = self._conn.cursor()
                    if self._on_session is not None:  # each new session, before any lock
                        pid, started = _execute(cursor, q.session_identity_sql()).fetchone()
                        self._on_session(WarehouseSession(int(pid), _iso(started)))
                    for done in self._journal:
                        done(cursor)
                result = step(self._conn.cursor())
                if commit:
                    self._conn.commit()
                else:
                    self._journal.append(step)
                return result
            except _DRIVER_ERRORS as exc:
                error = _translate(exc)
            except WarehouseError as exc:
                error = exc
            except BaseException:
                self.close()
                raise
            self._drop_connection()
            if not error.transient or attempt == len(delays):
                self.close()
                raise error from None
            log.warning("slice transaction failed (%s); replaying it", error)
            time.sleep(delays[attempt])
        raise AssertionError("unreachable")

    def _clear_slice(self, cursor: Cursor) -> None:
        """Delete the scope's slice from every table that holds it now or will hold it, so
        no later delete can touch rows this batch writes."""
        rows = self._warehouse._registry(cursor, self._tenant_id, self._source_scope)
        self._registered = {dataset: table for dataset, table, _ in rows}
        owners = sorted({owner for _, _, owner in rows})
        if not owners:
            return
        tables = {*self._registered.values(), *(c.target_table for c in self._contracts.values())}
        for table in sorted(tables):
            _execute(cursor, q.delete_slice_sql(table, self._tenant_id, self._source_scope, owners))

    def _stage(self, name: str, tables: Iterable[pa.Table]) -> tuple[str, int]:
        """Upload Parquet files and their manifest under `{staging}/{tenant}/{batch}/`;
        returns (manifest URI, rows)."""
        entries, rows = [], 0
        workdir = Path(self._workdir.name)
        for table in tables:
            if not table.num_rows:
                continue
            key = f"{self._prefix}/{name}-{len(entries):04d}.parquet"
            local = workdir / "upload.parquet"
            pq.write_table(table, local)
            size = local.stat().st_size
            entries.append(
                {
                    "url": self._put(local, key),
                    "mandatory": True,
                    "meta": {"content_length": size},
                }
            )
            rows += table.num_rows
        if not entries:
            return "", 0
        local = workdir / "upload.manifest"
        local.write_text(json.dumps({"entries": entries}))
        return self._put(local, f"{self._prefix}/{name}.manifest"), rows

    def _put(self, local: Path, key: str) -> str:
        try:
            uri = self._warehouse._staging.put_file(local, key)
        except StagingError as exc:
            raise WarehouseError(f"cannot stage a file for COPY: {exc}", transient=True) from exc
        self._staged.append(key)
        return uri

    def _copy(self, cursor: Cursor, table: str, manifest: str) -> None:
        self._warehouse.copies += 1
        _execute(cursor, q.copy_sql(table, manifest, self._warehouse._iam_role))

    # -- the SliceWriter protocol --------------------------------------------------------

    def load_files(self, contract: DatasetContract, files: Iterable[LoadFile]) -> int:
        """Stage the files on S3, COPY them into a temp table, insert them stamped."""
        if contract.name not in self._contracts:
            raise WarehouseError(f"dataset {contract.name!r} was not declared for this slice")
        if not self._open:
            raise WarehouseError("this slice was already committed or rolled back")
        name = f"{contract.name}-{len(self._staged):05d}"
        try:
            manifest, rows = self._stage(name, _stage_table(files, contract))
        except BaseException:
            self.close()
            raise
        if not rows:
            return 0
        stamps = (self._tenant_id, self._source_scope, str(self._batch_id))

        def load(cursor: Cursor) -> None:
            _execute(cursor, q.create_staging_sql(contract))
            self._copy(cursor, q.staging_table(contract), manifest)
            _execute(cursor, q.insert_stamped_sql(contract, *stamps))
            _execute(cursor, q.drop_table_sql(q.staging_table(contract)))

        self._run(load)
        self.row_counts[contract.name] += rows
        if self._progress is not None:
            self._progress(contract.name, self.row_counts[contract.name])
        return rows

    def discard_keys(self, contract: DatasetContract, keys: pa.Table) -> int:
        """Delete every row of this batch whose natural key is in `keys`."""
        if not keys.num_rows:
            return 0
        key_columns = list(contract.natural_key)
        types = {c.name: c.arrow_type for c in contract.columns}
        if not self._open:
            raise WarehouseError("this slice was already committed or rolled back")
        try:
            table = keys.select(key_columns).cast(pa.schema([(k, types[k]) for k in key_columns]))
        except (KeyError, pa.ArrowException) as exc:
            self.close()
            raise WarehouseError(f"keys do not match dataset {contract.name!r}: {exc}") from exc
        try:
            manifest, _ = self._stage(f"{contract.name}-discard-{len(self._staged):05d}", [table])
        except BaseException:
            self.close()
            raise
        stamps = (self._tenant_id, self._source_scope, str(self._batch_id))
        discard = q.staging_table(contract, "discard")

        def delete(cursor: Cursor) -> int:
            _execute(cursor, q.create_keys_sql(contract))
            self._copy(cursor, discard, manifest)
            deleted = _execute(cursor, q.delete_keys_sql(contract, *stamps)).rowcount
            _execute(cursor, q.drop_table_sql(discard))
            return int(deleted)

        deleted = self._run(delete)
        self.row_counts[contract.name] -= deleted
        return deleted

    def commit(self) -> SliceCommit:
        """Register every dataset of the slice under this batch and commit."""
        scope = (self._tenant_id, self._source_scope)

        def register(cursor: Cursor) -> None:
            _execute(cursor, q.forget_slices_sql(*scope))
            for name, contract in self._contracts.items():
                _execute(
                    cursor,
                    q.register_slice_sql(
                        *scope,
                        name,
                        str(self._batch_id),
                        self.row_counts[name],
                        contract.target_table,
                    ),
                )

        self._run(register, commit=True)
        self.close()
        return SliceCommit(self._batch_id, dict(self.row_counts))

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with suppress(*_DRIVER_ERRORS):
                conn.rollback()
            with suppress(*_DRIVER_ERRORS):
                conn.close()

    def close(self) -> None:
        """Roll back whatever was not committed and give the connection back."""
        self._open = False
        self._drop_connection()
        self._workdir.cleanup()
        staged, self._staged = self._staged, []
        if staged:  # needed only until the transaction ends; left behind, only clutter
            with suppress(StagingError):
                self._warehouse._staging.delete(staged)
