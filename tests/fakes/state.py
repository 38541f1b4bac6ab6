"""What the in-memory operational store holds: the rows of `ingestion_batches`,
`publication_outbox` and `normalized_files`, the store's clock, and the clauses its SQL
shares (the running holder, `ingestion_batch_abandoned`, the lease fence), written once for
both in-memory repositories (tests/fakes/store.py, tests/fakes/outbox.py)."""

from __future__ import annotations

import copy
import datetime as dt
import json
import threading
import uuid
from typing import Any

from fleet_import.errors import InvalidInput, LeaseLost
from fleet_import.store.models import Batch, CachedFile

Row = dict[str, Any]
_TICK = dt.timedelta(microseconds=1)


class Clock:
    """The store's `now()`: wall time plus what a test advanced it by, strictly increasing
    (as transaction start times of consecutive transactions are)."""

    def __init__(self) -> None:
        self._offset = dt.timedelta()
        self._last = dt.datetime.min.replace(tzinfo=dt.UTC)
        self._lock = threading.Lock()

    def now(self) -> dt.datetime:
        with self._lock:
            now = max(dt.datetime.now(dt.UTC) + self._offset, self._last + _TICK)
            self._last = now
            return now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._offset += dt.timedelta(seconds=seconds)


class MemoryStore:
    """The rows of `ingestion_batches`, `publication_outbox` and `normalized_files`."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock or Clock()
        self.lock = threading.RLock()
        self.batch_rows: dict[uuid.UUID, Row] = {}
        self.step_rows: dict[int, Row] = {}
        self.cache_rows: dict[tuple[str, str, str], Row] = {}
        self._batch_number = 0
        self._step_number = 0
        self.faults: dict[str, BaseException] = {}
        """method name -> error its next call raises before touching anything (a dropped
        connection, say): what a test injects where the real store would fail."""

    def transaction(self, name: str) -> Any:
        """The lock every method holds, raising an injected failure first."""
        failure = self.faults.pop(name, None)
        if failure is not None:
            raise failure
        return self.lock

    # -- what the SQL functions and clauses say -----------------------------------------------

    def new_batch_id(self) -> uuid.UUID:
        """As `reserve` numbers them: the first 8 hex digits count, the rest is random."""
        self._batch_number += 1
        return uuid.UUID(f"{self._batch_number:08x}" + uuid.uuid4().hex[8:])

    def new_step_id(self) -> int:
        self._step_number += 1
        return self._step_number

    def running_holder(self, tenant_id: str, scope: str) -> Row | None:
        return next(
            (
                row
                for row in self.batch_rows.values()
                if row["tenant_id"] == tenant_id
                and row["source_scope"] == scope
                and row["status"] == "running"
            ),
            None,
        )

    def abandoned(self, row: Row, ttl: float, now: dt.datetime) -> bool:
        """`ingestion_batch_abandoned(b, ttl)`."""
        if row["status"] != "running":
            return False
        if row["execution_lease_id"] is not None:
            return row["execution_lease_expires_at"] <= now
        return row["updated_at"] <= now - dt.timedelta(seconds=ttl)

    def leased_by(self, batch_id: uuid.UUID, owner: str | None) -> Row | None:
        """The row if it is running under `owner`'s lease: every transition's fence."""
        row = self.batch_rows.get(batch_id)
        if row is None or row["status"] != "running" or row["execution_lease_id"] != owner:
            return None
        return row

    def steps_of(self, batch_id: uuid.UUID) -> list[Row]:
        rows = [row for row in self.step_rows.values() if row["batch_id"] == batch_id]
        return sorted(rows, key=lambda row: row["seq"])

    def lease_lost(self, batch_id: uuid.UUID, owner: str | None) -> LeaseLost:
        row = self.batch_rows.get(batch_id)
        if row is None:
            return LeaseLost(f"batch {batch_id} does not exist")
        return LeaseLost(
            f"batch {batch_id} is {row['status']} with lease owner "
            f"{row['execution_lease_id']!r}; {owner!r} may not write to it"
        )


def batch_of(row: Row) -> Batch:
    """What `Batch.from_row` makes of a row the store returns: a copy the caller may keep."""
    return Batch.from_row(copy.deepcopy(row))


def as_json(value: Any) -> Any:
    """A value as jsonb stores it: JSON types only (a uuid does not go in), NUL written as
    `\\x00` (see repository._jsonb), and a copy."""
    return json.loads(json.dumps(without_nul(value)))


def utc_text(moment: dt.datetime) -> str:
    """`to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')`."""
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def cached_of(row: Row) -> CachedFile:
    fields = {k: v for k, v in row.items() if k not in ("created_by_batch", "created_at")}
    return CachedFile(**copy.deepcopy(fields))


def without_nul(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace("\x00", "\\x00")
    if isinstance(value, dict):
        return {without_nul(k): without_nul(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [without_nul(v) for v in value]
    return value


def check_text(what: str, value: object, max_length: int) -> None:
    if not isinstance(value, str) or not value or len(value) > max_length:
        raise InvalidInput(f"invalid {what} {value!r}: expected 1-{max_length} characters")
