"""The Redshift warehouse: normalized Parquet staged on S3 and COPYed into session temp
tables, then inserted stamped into the curated tables in one short transaction per slice
that LOCKs what it writes (writer.py).

Redshift differs from PostgreSQL where it matters here: COPY reads S3 (not the client's
stream) and matches Parquet columns by position and count; there are no enforced keys, no
ON CONFLICT, no advisory locks; TRUNCATE commits; concurrent writers fail with a
serializable isolation violation (1023) that must be retried. Exclusivity per scope lives
in the operational PostgreSQL (scope reservations).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import suppress
from typing import Any, TypeVar

from fleet_import.contracts.model import Column, DatasetContract
from fleet_import.errors import ErrorKind, WarehouseError
from fleet_import.retry import NO_RETRY, Backoff
from fleet_import.s3.staging import StagingArea
from fleet_import.warehouse.base import SliceWriter, WarehouseSession, check_contract
from fleet_import.warehouse.committer import (
    Cursor,
    SliceCommitter,
    SliceRequest,
    WriterCounters,
    run,
)
from fleet_import.warehouse.evolution import add_column_sql, added_after_stamps, check_added
from fleet_import.warehouse.redshift import ddl, driver, slice_sql
from fleet_import.warehouse.redshift.writer import RedshiftSliceWriter
from fleet_import.warehouse.sql import (
    Statement,
    create_registry_sql,
    create_schema_sql,
    existing_schemas_sql,
    schemas_of,
    split_table,
)

log = logging.getLogger(__name__)

RETRY_DELAYS_SECONDS: tuple[float, ...] = (0.5, 2.0, 5.0, 15.0)
"""Backoff between attempts of a slice transaction that hit a transient error (the writer's
`Backoff`, with the default jitter)."""
LOCK_WAIT_SECONDS = 30.0
"""How long a statement of this module's own transactions (registry reads, DDL) may run,
waiting for locks included: a slice commit holds its LOCKs for seconds, but a frozen holder
holds them until its session is ended, and the reader may be the successor that ends it."""
_NOT_SUPPORTED = "0A000"  # feature_not_supported: how Redshift refuses what it cannot do
_DDL_BACKOFF = Backoff((0.5, 2.0))
_LABELS_PER_QUERY = 500  # query groups named in one read of SYS_QUERY_HISTORY
"""Concurrent CREATE ... IF NOT EXISTS can conflict: a retry sees the table."""

T = TypeVar("T")


class RedshiftWarehouse(SliceCommitter):
    """Warehouse on Amazon Redshift. `connect_kwargs` go to `redshift_connector.connect`
    as they are (host, database, user/password or iam=True with cluster settings, ssl);
    they are never logged. Each method uses its own connection: instances may be shared.
    `serverless` (None: from `is_serverless` or the host, see `driver.is_serverless`)
    chooses the session catalog: STV_SESSIONS on a cluster, SYS views on a workgroup."""

    replays_slices = True  # RedshiftSliceWriter replays its journal on a new connection

    def __init__(
        self,
        connect_kwargs: Mapping[str, Any],
        *,
        s3: Any,
        staging_uri: str,
        iam_role: str,
        retry_delays: Sequence[float] = RETRY_DELAYS_SECONDS,
        lock_wait_seconds: float = LOCK_WAIT_SECONDS,
        serverless: bool | None = None,
    ) -> None:
        if not staging_uri.startswith("s3://"):
            raise WarehouseError(
                "Redshift COPY reads from S3: the staging URI must be s3://",
                kind=ErrorKind.CONFIGURATION,
            )
        self._connect_kwargs = dict(connect_kwargs)
        self.sessions = driver.SessionCatalog(driver.is_serverless(connect_kwargs, serverless))
        self._staging = StagingArea(staging_uri, s3)
        self._iam_role = iam_role
        self._slice_backoff = Backoff(tuple(retry_delays))
        self._lock_wait_seconds = lock_wait_seconds
        self._ensured: set[tuple[str, str]] = set()
        self.counters = WriterCounters()

    def __repr__(self) -> str:  # connect_kwargs may hold a password: never shown
        return f"RedshiftWarehouse(host={self._connect_kwargs.get('host')!r})"

    def connect(self) -> Any:
        return driver.connect(self._connect_kwargs)

    def _begin(self, request: SliceRequest) -> SliceWriter:
        return RedshiftSliceWriter(
            request,
            connect=self.connect,
            staging=self._staging,
            iam_role=self._iam_role,
            backoff=self._slice_backoff,
            counters=self.counters,
            sessions=self.sessions,
        )

    def _in_transaction(
        self,
        work: Callable[[Cursor], T],
        backoff: Backoff = NO_RETRY,
        *,
        limited: bool = True,
    ) -> T:
        """Run `work` in one transaction, committed; retried whole on transient errors after
        `backoff`. `limited`: each statement may take `lock_wait_seconds` at most
        (statement_timeout)."""

        def attempt() -> T:
            try:
                conn = self.connect()
                try:
                    if limited:
                        milliseconds = int(self._lock_wait_seconds * 1000)
                        run(conn.cursor(), f"SET statement_timeout TO {milliseconds}")
                    result = work(conn.cursor())
                    conn.commit()
                    return result
                finally:
                    with suppress(*driver.DRIVER_ERRORS):
                        conn.close()
            except driver.DRIVER_ERRORS as exc:
                raise driver.translate(exc) from None

        return backoff.call(
            attempt, retryable=driver.retryable, what="a warehouse transaction", log=log
        )

    def _registry_exists_sql(self) -> Statement:
        return ddl.registry_exists_sql()

    # -- tables --------------------------------------------------------------------------

    def ensure_tables(self, contracts: Iterable[DatasetContract]) -> None:
        contracts = list(contracts)
        for contract in contracts:
            check_contract(contract)

        def work(cursor: Cursor) -> list[str]:
            # No DDL that is not needed: a least-privilege user (a pre-created schema, no
            # CREATE on the database) never meets a 42501 for what already exists.
            schemas = schemas_of(contracts)
            present = {row[0] for row in run(cursor, existing_schemas_sql(schemas)).fetchall()}
            for schema in sorted(schemas - present):
                run(cursor, create_schema_sql(schema))
            (registered,) = run(cursor, ddl.registry_exists_sql()).fetchone()
            if not registered:
                run(cursor, create_registry_sql(ddl.DIALECT))
            widen: list[tuple[str, str, str]] = []
            for contract in contracts:
                found = run(cursor, ddl.table_columns_sql(*split_table(contract.target_table)))
                found = [tuple(row) for row in found.fetchall()]
                if not found:
                    run(cursor, ddl.create_table_sql(contract))
                else:
                    widen += [
                        (contract.target_table, column, statement)
                        for column, statement in ddl.widenings(contract, found)
                    ]
            return widen

        for table, column, statement in self._in_transaction(work, _DDL_BACKOFF):
            self._widen(table, column, statement)
        self._ensured.update((c.target_table, c.contract_version) for c in contracts)

    def _widen(self, table: str, column: str, statement: str) -> None:
        """Run one ALTER COLUMN ... TYPE, alone (Redshift refuses it in a transaction block).
        Refused as not supported (0A000: the column's encoding, BYTEDICT, RUNLENGTH, TEXT255
        or TEXT32K, which ENCODE AUTO may have chosen), the column is re-encoded
        (`ddl.reencode_sql`) and widened again, so a grown contract never sticks."""
        log.info("widening a column of a grown contract: %s", statement)
        try:
            try:
                self._alone(statement)
            except WarehouseError as refused:
                if refused.code != _NOT_SUPPORTED:
                    raise
                log.warning(
                    "widening %s.%s was refused (%s): re-encoding it %s first",
                    table,
                    column,
                    refused,
                    ddl.REENCODING,
                )
                self._alone(ddl.reencode_sql(table, column))
                self._alone(statement)
        except WarehouseError as error:
            raise WarehouseError(
                f"cannot widen a column to its grown contract ({statement}): {error}; "
                "widen it by hand, or recreate the table",
                kind=error.kind,
                code=error.code,
                backend=error.backend,
            ) from None

    def _alone(self, statement: str) -> None:
        """One statement outside any transaction block (autocommit), on its own connection."""
        conn = self.connect()
        try:
            conn.autocommit = True
            conn.cursor().execute(statement)
        except driver.DRIVER_ERRORS as exc:
            raise driver.translate(exc) from None
        finally:
            with suppress(*driver.DRIVER_ERRORS):
                conn.close()

    # -- columns added by drift (warehouse.evolution) -------------------------------------

    def added_columns(self, tenant_id: str, contract: DatasetContract) -> dict[str, str]:
        statement = ddl.table_columns_sql(*split_table(contract.target_table))
        found = self._in_transaction(lambda cursor: run(cursor, statement).fetchall())
        return added_after_stamps(contract, [(name, data_type) for name, data_type, _ in found])

    def add_columns(
        self, tenant_id: str, contract: DatasetContract, columns: Mapping[str, str]
    ) -> None:
        """Each ADD COLUMN alone in autocommit: Redshift runs it outside a transaction block
        shared with other work on the table, and the slice's locked commit never waits on it."""
        self.ensure_tables([contract])  # a new dataset's first delivery may already drift
        refused: list[WarehouseError] = []
        for name, column_type in columns.items():
            if name in self.added_columns(tenant_id, contract):
                continue
            statement = add_column_sql(contract, name, ddl.column_type(Column(name, column_type)))
            log.info("adding a column of a drifted delivery: %s", statement)
            conn = self.connect()
            try:
                conn.autocommit = True
                conn.cursor().execute(statement)
            except driver.DRIVER_ERRORS as exc:
                # Another worker may have added it meanwhile: check_added decides below.
                refused.append(driver.translate(exc))
            finally:
                with suppress(*driver.DRIVER_ERRORS):
                    conn.close()
        try:
            check_added(contract, columns, self.added_columns(tenant_id, contract))
        except WarehouseError as exc:
            if not refused:
                raise
            raise WarehouseError(
                f"{exc} ({refused[0]})",
                kind=refused[0].kind,
                code=refused[0].code,
                backend=refused[0].backend,
            ) from None

    # -- sessions and operator SQL -------------------------------------------------------

    def end_session(self, session: WarehouseSession) -> bool:
        """Needs the right to terminate that session: the same user, or a superuser."""

        return self._in_transaction(lambda cursor: self.sessions.end(cursor, session))

    def query_seconds(self, labels: Sequence[str]) -> dict[str, float]:
        """Seconds SYS_QUERY_HISTORY attributes to each of these query groups (batch ids: a
        slice's session runs under its batch's, `slice_sql.query_group_sql`); absent, none.
        Read in chunks: a long --since names thousands of batches."""
        wanted = list(dict.fromkeys(label[: slice_sql.QUERY_GROUP_MAX] for label in labels))
        seconds: dict[str, float] = {}
        for start in range(0, len(wanted), _LABELS_PER_QUERY):
            chunk = wanted[start : start + _LABELS_PER_QUERY]
            rows = self._in_transaction(
                lambda cursor, chunk=chunk: run(cursor, slice_sql.query_seconds_sql(chunk))
                .fetchall()
            )
            seconds.update({str(label): int(micros) / 1e6 for label, micros in rows})
        return seconds

    def execute(self, statement: str) -> None:
        """Run operator-configured SQL (refresh_dependants: materialized-view refreshes)."""
        self._in_transaction(lambda cursor: run(cursor, statement) and None, limited=False)
