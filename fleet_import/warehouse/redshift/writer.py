"""A Redshift slice replacement in progress: one transaction in which the scope's previous
rows are deleted, each dataset's files are staged on S3, COPYed into a temp table and inserted
stamped, and the registry rows are replaced at `commit()`.

A writer keeps a journal of what its transaction did, and on a transient failure (a
serializable isolation violation, a lost connection) replays the whole transaction on a new
connection (the staged files stay on S3 until the commit).
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from collections.abc import Callable, Iterable
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from fleet_import.contracts import DatasetContract
from fleet_import.staging import StagingError
from fleet_import.warehouse.base import (
    SOURCE_LINE_COLUMN,
    LoadFile,
    SliceCommit,
    WarehouseError,
    WarehouseSession,
)
from fleet_import.warehouse.committer import Cursor, OpenSlice, SliceRequest, run
from fleet_import.warehouse.redshift import driver, slice_sql
from fleet_import.warehouse.redshift.ddl import DIALECT
from fleet_import.warehouse.sql import (
    delete_keys_sql,
    drop_table_sql,
    staging_table,
)

if TYPE_CHECKING:
    from fleet_import.warehouse.redshift.warehouse import RedshiftWarehouse

log = logging.getLogger(__name__)

Step = Callable[[Cursor], Any]
"""One part of the slice's transaction, replayable on a new connection."""


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


class RedshiftSliceWriter(OpenSlice):
    """One slice replacement in progress: an open Redshift transaction in which the scope's
    previous rows are already deleted. Closing it without `commit()` rolls back."""

    def __init__(self, warehouse: RedshiftWarehouse, request: SliceRequest) -> None:
        super().__init__(request)
        self._warehouse = warehouse
        self._stamps = (request.tenant_id, request.source_scope, str(request.batch_id))
        self._prefix = f"{request.tenant_id}/{request.batch_id}"
        self._staged: list[str] = []
        self._workdir = tempfile.TemporaryDirectory(prefix="fleet-redshift-")
        self._journal: list[Step] = []
        self._conn: Any = None
        self._open = True
        self._run(self._clear_slice)

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
                    on_session = self._request.on_session
                    if on_session is not None:  # each new session, before any lock
                        pid, started = run(cursor, driver.session_identity_sql()).fetchone()
                        on_session(WarehouseSession(int(pid), _iso(started)))
                    for done in self._journal:
                        done(cursor)
                result = step(self._conn.cursor())
                if commit:
                    self._conn.commit()
                else:
                    self._journal.append(step)
                return result
            except driver.DRIVER_ERRORS as exc:
                error = driver.translate(exc)
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
        scope = self._request.scope
        self._clear_previous(cursor, self._warehouse._registry(cursor, *scope))

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
            message = f"cannot stage a file for COPY: {exc}"
            raise WarehouseError(message, kind=exc.kind, code=exc.code) from exc
        self._staged.append(key)
        return uri

    def _copy(self, cursor: Cursor, table: str, manifest: str) -> None:
        self._warehouse.copies += 1
        run(cursor, slice_sql.copy_sql(table, manifest, self._warehouse._iam_role))

    # -- the SliceWriter protocol --------------------------------------------------------

    def load_files(self, contract: DatasetContract, files: Iterable[LoadFile]) -> int:
        """Stage the files on S3, COPY them into a temp table, insert them stamped."""
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
        stamps = self._stamps

        def load(cursor: Cursor) -> None:
            run(cursor, slice_sql.create_staging_sql(contract))
            self._copy(cursor, staging_table(contract), manifest)
            run(cursor, slice_sql.insert_stamped_sql(contract, *stamps))
            run(cursor, drop_table_sql(staging_table(contract)))

        self._run(load)
        self.row_counts[contract.name] += rows
        if self._request.progress is not None:
            self._request.progress(contract.name, self.row_counts[contract.name])
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
        stamps = self._stamps
        discard = staging_table(contract, "discard")

        def delete(cursor: Cursor) -> int:
            run(cursor, slice_sql.create_keys_sql(contract))
            self._copy(cursor, discard, manifest)
            deleted = run(cursor, delete_keys_sql(contract, *stamps)).rowcount
            run(cursor, drop_table_sql(discard))
            return int(deleted)

        deleted = self._run(delete)
        self.row_counts[contract.name] -= deleted
        return deleted

    def commit(self) -> SliceCommit:
        """Register every dataset of the slice under this batch and commit."""
        statements = self._register_sql(DIALECT, str(self._request.batch_id))

        def register(cursor: Cursor) -> None:
            for statement in statements:
                run(cursor, statement)

        self._run(register, commit=True)
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
        """Roll back whatever was not committed and give the connection back."""
        self._open = False
        self._drop_connection()
        self._workdir.cleanup()
        staged, self._staged = self._staged, []
        if staged:  # needed only until the transaction ends; left behind, only clutter
            with suppress(StagingError):
                self._warehouse._staging.delete(staged)
