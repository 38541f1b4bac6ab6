"""A Redshift slice replacement in progress, in two phases on one session:

1. Loading, without touching a curated table: each dataset's files are staged on S3 and
   COPYed into a session temp table as they arrive (duplicate keys are deleted there too),
   each step in a transaction of its own, so nothing of the slice holds a lock on a table
   another tenant writes.
2. `commit()`: one short transaction LOCKs every curated table it writes and the slice
   registry, in one global order, deletes the scope's previous rows, inserts the temp
   tables' rows stamped, replaces the registry rows and commits: locks are held for the
   inserts, not for the load.

A serializable isolation violation (1023) or a conflict with a concurrent transaction fails
only the short transaction: it is run again on the same session (the temp tables survive),
after the writer's `Backoff` (the one retry rule, jitter included). A lost session loses the
temp tables: the loading steps are replayed on a new one from the files still staged on S3,
then the short transaction. A session lost at the COMMIT itself is never replayed: whether it
committed is unknown, and `CommitOutcomeUnknown` leaves that to the slice stamp
(importing.settle).

The writer is given what it uses (a connect callable, the staging area, the COPY role, its
backoff, the counters it adds to); it does not know the warehouse that opened it.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Callable, Iterable
from contextlib import suppress
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from fleet_import import failpoints
from fleet_import.contracts.model import DatasetContract
from fleet_import.errors import WarehouseError
from fleet_import.retry import Backoff
from fleet_import.s3.staging import StagingArea, StagingError
from fleet_import.warehouse.base import (
    SOURCE_LINE_COLUMN,
    CommitOutcomeUnknown,
    LoadFile,
    SliceCommit,
)
from fleet_import.warehouse.committer import (
    Cursor,
    OpenSlice,
    SliceRequest,
    WriterCounters,
    read_registry,
    run,
)
from fleet_import.warehouse.redshift import driver, slice_sql
from fleet_import.warehouse.redshift.ddl import DIALECT, registry_exists_sql
from fleet_import.warehouse.sql import REGISTRY_TABLE, drop_table_sql, staging_table

log = logging.getLogger(__name__)

Step = Callable[[Cursor], Any]
"""One loading step (a transaction of its own), replayable on a new session."""
Connect = Callable[[], Any]
"""A new redshift_connector connection to the warehouse (autocommit off)."""


def _stage_table(files: Iterable[LoadFile], contract: DatasetContract) -> Iterable[pa.Table]:
    """Each file without `_source_line` and its excluded lines: COPY matches Parquet columns
    by position and count, so the staged file holds exactly the contract's columns.
    Timestamps go as naive UTC, for the temp table's TIMESTAMP columns."""
    for load_file in files:
        try:
            table = pq.read_table(load_file.path)
        except (OSError, pa.ArrowException) as exc:
            raise WarehouseError(f"cannot read normalized file {load_file.path}: {exc}") from exc
        if load_file.excluded_lines:
            excluded = pa.array(sorted(load_file.excluded_lines), pa.int64())
            table = table.filter(pc.invert(pc.is_in(table[SOURCE_LINE_COLUMN], excluded)))
        try:
            table = table.select(contract.column_names).cast(contract.arrow_schema)
        except (KeyError, pa.ArrowException) as exc:
            raise WarehouseError(
                f"normalized file {load_file.path} does not match dataset {contract.name!r}: {exc}"
            ) from exc
        yield pa.table(
            [
                c.cast(pa.timestamp(c.type.unit)) if pa.types.is_timestamp(c.type) else c
                for c in table.columns
            ],
            names=table.column_names,
        )


class RedshiftSliceWriter(OpenSlice):
    """One slice replacement in progress: its rows wait in session temp tables; nothing of
    it is visible, and no curated table is touched, until `commit()`. Closing without it
    drops the session and its temp tables."""

    def __init__(
        self,
        request: SliceRequest,
        *,
        connect: Connect,
        staging: StagingArea,
        iam_role: str,
        backoff: Backoff,
        counters: WriterCounters,
        sessions: driver.SessionCatalog = driver.PROVISIONED,
    ) -> None:
        super().__init__(request)
        self._sessions = sessions
        self._connect = connect
        self._staging = staging
        self._iam_role = iam_role
        self._backoff = backoff
        self._counters = counters
        self._stamps = (request.tenant_id, request.source_scope, str(request.batch_id))
        self._prefix = f"{request.tenant_id}/{request.batch_id}"
        self._staged: list[str] = []
        self._workdir = tempfile.TemporaryDirectory(prefix="fleet-redshift-")
        self._loads: list[Step] = []
        self._tables: set[str] = set()
        """Datasets whose temp table a loading step created."""
        self._conn: Any = None
        self._open = True
        # The session is recorded before anything is loaded. Opening it rides out a short
        # outage as every later step does (PostgreSQL's slice load is retried whole); on a
        # final failure `_attempts` closes the writer, its scratch directory with it.
        self._attempts(self._session, "opening the slice's session")

    # -- the session and its loading steps ---------------------------------------------

    def _session(self) -> Cursor:
        """The slice's session, opened if needed: its zone set to UTC, its query group to the
        batch id (cost per tenant from SYS_QUERY_HISTORY), recorded through
        `on_session`, and its temp tables filled again by the loading steps so far."""
        if self._conn is None:
            self._conn = self._connect()
            try:
                cursor = self._conn.cursor()
                run(cursor, slice_sql.SESSION_UTC_SQL)
                run(cursor, slice_sql.query_group_sql(str(self._request.batch_id)))
                on_session = self._request.on_session
                if on_session is not None:  # each new session, before any lock
                    session = self._sessions.identify(cursor)
                    if session is not None:
                        on_session(session)
                for done in self._loads:
                    done(cursor)
                self._conn.commit()
            except BaseException:
                self._drop_connection()  # half set up: the next attempt starts it afresh
                raise
        return self._conn.cursor()

    def _attempts(self, work: Callable[[], Any], what: str) -> Any:
        """Run `work` (which commits what it did); after a transient failure run it again,
        after the backoff, on the same session if it survived (its rollback works), else on
        a new one. Closes the slice on a final failure."""
        if not self._open:
            raise WarehouseError("this slice was already committed or rolled back")
        runs = 0

        def attempt() -> Any:
            nonlocal runs
            if runs:
                self._counters.replays += 1
            runs += 1
            self._request.check_fence()  # a replay after a backoff, too
            try:
                return work()
            except driver.DRIVER_ERRORS as exc:
                error = driver.translate(exc)
                if isinstance(exc, driver.INTERNAL_ERRORS):  # its state is not to be trusted
                    self._drop_connection()
            except WarehouseError as exc:
                error = exc
            self._roll_back()
            raise error from None

        try:
            return self._backoff.call(attempt, retryable=driver.retryable, what=what, log=log)
        except BaseException:
            self.close()
            raise

    def _load(self, step: Step) -> Any:
        """Run a loading step in a transaction of its own; keep it for a new session."""

        def work() -> Any:
            result = step(self._session())
            self._conn.commit()
            return result

        result = self._attempts(work, "a slice load")
        self._loads.append(step)
        return result

    def _roll_back(self) -> None:
        """End the failed transaction; a session that cannot is dropped (a new one is
        opened, and its temp tables filled again, on the next attempt)."""
        if self._conn is None:
            return
        try:
            self._conn.rollback()
            run(self._conn.cursor(), "SELECT 1")  # the session is alive, its temp tables too
            self._conn.rollback()
        except driver.DRIVER_ERRORS:
            self._drop_connection()

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
            uri = self._staging.put_file(local, key)
        except StagingError as exc:
            message = f"cannot stage a file for COPY: {exc}"
            raise WarehouseError(message, kind=exc.kind, code=exc.code) from exc
        self._staged.append(key)
        return uri

    def _copy(self, cursor: Cursor, table: str, manifest: str) -> None:
        self._counters.copies += 1
        run(cursor, slice_sql.copy_sql(table, manifest, self._iam_role))

    # -- the SliceWriter protocol --------------------------------------------------------

    def load_files(self, contract: DatasetContract, files: Iterable[LoadFile]) -> int:
        """Stage the files on S3 and COPY them into the dataset's temp table."""
        self._check_declared(contract)
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
        first = contract.name not in self._tables

        def load(cursor: Cursor) -> None:
            if first:
                run(cursor, slice_sql.create_staging_sql(contract))
            self._copy(cursor, staging_table(contract), manifest)

        self._load(load)
        self._tables.add(contract.name)
        self.row_counts[contract.name] += rows
        if self._request.progress is not None:
            self._request.progress(contract.name, self.row_counts[contract.name])
        return rows

    def discard_keys(self, contract: DatasetContract, keys: pa.Table) -> int:
        """Delete every staged row of the dataset whose natural key is in `keys`."""
        if not self._open:
            raise WarehouseError("this slice was already committed or rolled back")
        if not keys.num_rows or contract.name not in self._tables:
            return 0
        key_columns = list(contract.natural_key)
        types = {c.name: c.arrow_type for c in contract.columns}
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
        discard = staging_table(contract, "discard")

        def delete(cursor: Cursor) -> int:
            run(cursor, slice_sql.create_keys_sql(contract))
            self._copy(cursor, discard, manifest)
            deleted = run(cursor, slice_sql.discard_staged_sql(contract)).rowcount
            run(cursor, drop_table_sql(discard))
            return int(deleted)

        deleted = self._load(delete)
        self.row_counts[contract.name] -= deleted
        return deleted

    def commit(self) -> SliceCommit:
        """Replace the slice in one short transaction and commit; see the module docstring."""
        scope = self._request.scope
        contracts = self._request.contracts.values()

        def registered_tables() -> set[str]:
            cursor = self._session()
            rows = read_registry(cursor, registry_exists_sql(), *scope)
            self._conn.commit()
            return {table for _, table, _ in rows}

        locked = {REGISTRY_TABLE, *(c.target_table for c in contracts)}
        locked |= self._attempts(registered_tables, "reading the slice registry")

        def replace() -> None:
            while True:
                cursor = self._session()
                run(cursor, slice_sql.lock_sql(locked))
                registered = read_registry(cursor, registry_exists_sql(), *scope)
                missing = {table for _, table, _ in registered} - locked
                if not missing:
                    break
                # Registered since the registry was read: lock that table too, first.
                self._conn.rollback()
                locked.update(missing)
            failpoints.hit("slice_locked")
            self._clear_previous(cursor, registered)
            for contract in contracts:
                if contract.name in self._tables:
                    run(cursor, slice_sql.insert_stamped_sql(contract, *self._stamps))
            for statement in self._register_sql(DIALECT, str(self._request.batch_id)):
                run(cursor, statement)
            # The LOCKs may have waited long for other writers: the last moment the lease
            # can stop the COMMIT. Raising here rolls the transaction back (_attempts).
            self._request.check_fence()
            try:
                self._conn.commit()
            except driver.DRIVER_ERRORS as exc:
                error = driver.translate(exc)
                if error.code is not None:  # the server answered: rolled back, replayable
                    raise
                self._drop_connection()
                raise CommitOutcomeUnknown(
                    f"the slice's COMMIT got no answer: {error}",
                    kind=error.kind,
                    backend=error.backend,
                ) from None

        self._attempts(replace, "the slice commit")
        self.close()
        return SliceCommit(self._request.batch_id, dict(self.row_counts))

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with suppress(*driver.DRIVER_ERRORS):
                conn.rollback()
            with suppress(*driver.DRIVER_ERRORS):
                conn.close()

    def close(self) -> None:
        """Drop the session (its temp tables with it) and the staged files."""
        self._open = False
        self._drop_connection()
        self._workdir.cleanup()
        staged, self._staged = self._staged, []
        if staged:  # needed only until the slice commits or is given up; left, only clutter
            with suppress(StagingError):
                self._staging.delete(staged)
