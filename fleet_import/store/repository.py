"""BatchRepository: the one layer that runs operational-store SQL.

Every method is one transaction on its own connection, so a repository may be shared by
threads and used from many processes. Driver errors are translated here, by constraint name,
into outcomes or into OperationalStoreError; nothing from psycopg escapes.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from psycopg.types.json import Jsonb

from fleet_import.errors import (
    FleetImportError,
    InvalidInput,
    LeaseLost,
    OperationalStoreError,
)
from fleet_import.scope import SOURCE_SCOPE_MAX_LENGTH, Tenant
from fleet_import.sqlfiles import load_queries
from fleet_import.store.connection import ScopeTaken, SqlStore
from fleet_import.store.details import BatchDetails, FailureKind
from fleet_import.store.lineage_outbox import QUERIES as LINEAGE_QUERIES
from fleet_import.store.lineage_outbox import LineageEvent, enqueue_params
from fleet_import.store.models import (
    FLEET_MODE,
    FLEET_PIPELINE_STAGE,
    Batch,
    BatchNotRunning,
    BatchStatus,
    CachedFile,
    ContinueExisting,
    LeaseAcquired,
    LeaseHeld,
    LeaseOutcome,
    NotResumable,
    Reserved,
    ReserveOutcome,
    Resumed,
    ResumeOutcome,
    ScopeBusy,
    SourceType,
    resume_refusal,
)
from fleet_import.store.review_repository import QUERIES as REVIEW_QUERIES
from fleet_import.store.review_repository import review_params

QUERIES = load_queries("fleet_import.store", "queries.sql")
# A holder can finish between our failed insert and the look-up of who holds the scope;
# then the insert is simply tried again.
_RESERVE_ATTEMPTS = 5
_MAX_KEY_LENGTH = 200
_MAX_OWNER_LENGTH = 100


class InvalidTransition(FleetImportError):
    """The batch is not in a state that allows this transition."""


class BatchRepository(SqlStore):
    queries = QUERIES

    # -- reservation ----------------------------------------------------------------------

    def reserve(
        self,
        tenant: Tenant,
        scope: str,
        delivery_key: str,
        details: Mapping[str, Any] | None = None,
        *,
        source_type: SourceType = SourceType.FLEET_S3,
    ) -> ReserveOutcome:
        """Insert a running batch for the scope, or say who holds it. A delivery that made a
        batch before gets it back (ContinueExisting) while it runs or once it succeeded (the
        caller's lease attempt then says whether work is left); after a failure the same
        delivery starts a fresh batch, since recovery from a failure is a new batch."""
        _check_text("source scope", scope, SOURCE_SCOPE_MAX_LENGTH)
        _check_text("delivery key", delivery_key, _MAX_KEY_LENGTH)
        initial = BatchDetails.parse({**(details or {}), "version": 1}).to_json()
        params = {
            "tenant_id": tenant.tenant_id,
            "company_id": tenant.company_id,
            "tenant_database": tenant.database,
            "mode": FLEET_MODE,
            "source_type": str(source_type),
            "pipeline_stage": FLEET_PIPELINE_STAGE,
            "source_scope": scope,
            "delivery_key": delivery_key,
            "details": Jsonb(initial),
        }
        for _ in range(_RESERVE_ATTEMPTS):
            with self._transaction() as conn:
                earlier = conn.execute(QUERIES["delivery_batch"], params).fetchone()
                if earlier is not None:
                    return ContinueExisting(Batch.from_row(earlier))
                row = conn.execute(QUERIES["reserve"], {**params, "id": uuid.uuid4()}).fetchone()
                if row is not None:
                    return Reserved(Batch.from_row(row))
                holder = conn.execute(QUERIES["running_holder"], params).fetchone()
            if holder is None:
                continue
            if holder["delivery_key"] == delivery_key:
                return ContinueExisting(Batch.from_row(holder))
            return ScopeBusy(holder["id"], holder["delivery_key"])
        raise OperationalStoreError(
            f"could not reserve {scope!r}: its holder kept changing ({_RESERVE_ATTEMPTS} tries)"
        )

    def delivery_batch(self, tenant_id: str, scope: str, delivery_key: str) -> Batch | None:
        """The batch this delivery made for the scope, unless it failed (what `reserve`
        would continue)."""
        params = {"tenant_id": tenant_id, "source_scope": scope, "delivery_key": delivery_key}
        row = self._one("delivery_batch", params)
        return None if row is None else Batch.from_row(row)

    # -- execution leases -----------------------------------------------------------------

    def acquire_lease(self, batch_id: uuid.UUID, owner: str, ttl: float) -> LeaseOutcome:
        """Take the lease if it is free, ours, or expired by the database clock. Step claims
        made under a previous owner's lease end with it."""
        return self._acquire(batch_id, owner, ttl, abandoned_only=False)

    def take_over(self, batch_id: uuid.UUID, owner: str, ttl: float) -> LeaseOutcome:
        """Take the lease of an abandoned batch (`ingestion_batch_abandoned`: its lease
        expired, or nobody leased it for `ttl` seconds); LeaseHeld while it is not abandoned,
        so a batch whose reserver is about to lease it is never taken."""
        return self._acquire(batch_id, owner, ttl, abandoned_only=True)

    def _acquire(
        self, batch_id: uuid.UUID, owner: str, ttl: float, *, abandoned_only: bool
    ) -> LeaseOutcome:
        _check_text("lease owner", owner, _MAX_OWNER_LENGTH)
        params = {"batch_id": batch_id, "owner": owner, "ttl": float(ttl)}
        with self._transaction() as conn:
            current = conn.execute(QUERIES["lock_lease"], params).fetchone()
            if current is None:
                return BatchNotRunning(None)
            if current["status"] != BatchStatus.RUNNING:
                return BatchNotRunning(BatchStatus(current["status"]))
            row = None
            if current["abandoned"] or not abandoned_only:
                row = conn.execute(QUERIES["acquire_lease"], params).fetchone()
            if row is None:
                expires_at = current["execution_lease_expires_at"]
                return LeaseHeld(current["execution_lease_id"], expires_at)
            conn.execute(QUERIES["end_claims_of_other_owners"], params)
        previous = current["execution_lease_id"]
        return LeaseAcquired(
            owner, row["execution_lease_expires_at"], None if previous == owner else previous
        )

    def abandoned_uncommitted(self, ttl: float, limit: int) -> list[uuid.UUID]:
        """Running batches with no live executor that never recorded a commit (see
        `take_over`), oldest first: the drain settles them."""
        rows = self._all("abandoned_uncommitted", {"ttl": float(ttl), "limit": int(limit)})
        return [row["id"] for row in rows]

    def renew_lease(self, batch_id: uuid.UUID, owner: str, ttl: float) -> LeaseAcquired:
        """Extend our lease; raises LeaseLost if another owner took it or the batch ended."""
        row = self._one("renew_lease", {"batch_id": batch_id, "owner": owner, "ttl": float(ttl)})
        if row is None:
            raise self._lease_lost(batch_id, owner)
        return LeaseAcquired(owner, row["execution_lease_expires_at"])

    def release_lease(self, batch_id: uuid.UUID, owner: str) -> bool:
        """Free our lease. Another owner's lease is left alone (returns False)."""
        with self._transaction() as conn:
            released = conn.execute(
                QUERIES["release_lease"], {"batch_id": batch_id, "owner": owner}
            ).rowcount
        return released == 1

    def withdraw(self, batch_id: uuid.UUID, owner: str) -> bool:
        """Delete our fresh batch (leased by us, nothing recorded yet): its delivery was
        loaded meanwhile by another (importing.claim). False leaves it as it is."""
        return self._one("withdraw", {"batch_id": batch_id, "owner": owner}) is not None

    def _lease_lost(self, batch_id: uuid.UUID, owner: str | None) -> LeaseLost:
        state = self._one("lease_state", {"batch_id": batch_id})
        if state is None:
            return LeaseLost(f"batch {batch_id} does not exist")
        return LeaseLost(
            f"batch {batch_id} is {state['status']} with lease owner "
            f"{state['execution_lease_id']!r}; {owner!r} may not write to it"
        )

    # -- transitions (each fenced by the caller's lease) ----------------------------------

    def update_details(self, batch_id: uuid.UUID, owner: str, patch: Mapping[str, Any]) -> Batch:
        """Merge top-level keys into details (phase, manifest, rejects...)."""
        row = self._one(
            "update_details", {"batch_id": batch_id, "owner": owner, "patch": _jsonb(dict(patch))}
        )
        if row is None:
            raise self._lease_lost(batch_id, owner)
        return Batch.from_row(row)

    def mark_committed(
        self,
        batch_id: uuid.UUID,
        owner: str,
        *,
        row_counts: Mapping[str, int],
        publication_steps: Sequence[str] = (),
        patch: Mapping[str, Any] | None = None,
        lineage: Sequence[LineageEvent] = (),
    ) -> Batch:
        """Record the warehouse commit and enqueue publication (and the batch's
        OpenLineage events, `lineage`) in one transaction. An
        approval's batch (details `approves`) decides the held batch in that transaction
        too, so whoever records the commit (the run, a rerun, the drain, resume) settles
        the review, once."""
        params = {
            "batch_id": batch_id,
            "owner": owner,
            "patch": _jsonb({**(patch or {}), "row_counts": dict(row_counts)}),
            "steps": list(publication_steps),
        }
        with self._transaction() as conn:
            row = conn.execute(QUERIES["mark_committed"], params).fetchone()
            if row is not None and publication_steps:
                conn.execute(QUERIES["enqueue_publication"], params)
            if row is not None and lineage:
                conn.execute(LINEAGE_QUERIES["enqueue_lineage"], enqueue_params(batch_id, lineage))
            if row is not None and row["details"].get("approves"):
                held = uuid.UUID(row["details"]["approves"])
                approval = review_params(held, "approved", row["id"])
                conn.execute(REVIEW_QUERIES["record_review"], approval)
        if row is None:
            raise self._lease_lost(batch_id, owner)
        return Batch.from_row(row)

    def mark_failed(
        self,
        batch_id: uuid.UUID,
        owner: str | None,
        kind: FailureKind,
        error: str,
        facts: Mapping[str, Any] | None = None,
        lineage: Sequence[LineageEvent] = (),
    ) -> Batch:
        """Fail a running batch and free its scope. owner=None for a batch never leased.
        `facts` are kept in the failure record beside kind, error and time; `lineage` (its
        OpenLineage FAIL events) is enqueued in the same transaction."""
        params = {
            "batch_id": batch_id,
            "owner": owner,
            "kind": str(FailureKind(kind)),
            "error": _without_nul(error),
            "facts": _jsonb(dict(facts or {})),
        }
        with self._transaction() as conn:
            row = conn.execute(QUERIES["mark_failed"], params).fetchone()
            if row is not None and lineage:
                conn.execute(LINEAGE_QUERIES["enqueue_lineage"], enqueue_params(batch_id, lineage))
        if row is None:
            raise self._lease_lost(batch_id, owner)
        return Batch.from_row(row)

    def mark_succeeded(
        self, batch_id: uuid.UUID, owner: str, patch: Mapping[str, Any] | None = None
    ) -> Batch:
        """Succeed a committed batch; publication must be done before this is called."""
        row = self._one(
            "mark_succeeded",
            {"batch_id": batch_id, "owner": owner, "patch": _jsonb(dict(patch or {}))},
        )
        if row is not None:
            return Batch.from_row(row)
        batch = self.get(batch_id)
        if (
            batch is not None
            and batch.status == BatchStatus.RUNNING
            and batch.execution_lease_id == owner
        ):
            raise InvalidTransition(
                f"batch {batch_id} cannot succeed: its warehouse commit was never recorded"
            )
        raise self._lease_lost(batch_id, owner)

    # -- resume ---------------------------------------------------------------------------

    def resume_publication(
        self, batch_id: uuid.UUID, source_type: SourceType | str, scope: str
    ) -> ResumeOutcome:
        """Put a failed-publication batch back to running, reacquiring its scope.

        Necessary but not sufficient: the caller must prove that the warehouse slice is
        stamped with this batch before calling, so that a refused resume leaves the failed
        row (its `failure` above all) as it was; publication re-reads the stamp before each
        step anyway.
        """
        try:
            with self._transaction() as conn:
                row = conn.execute(QUERIES["lock_batch"], {"batch_id": batch_id}).fetchone()
                if row is None:
                    return NotResumable(f"batch {batch_id} does not exist")
                batch = Batch.from_row(row)
                refusal = resume_refusal(batch, str(source_type), scope)
                if refusal is not None:
                    return NotResumable(refusal)
                holder = conn.execute(
                    QUERIES["running_holder"],
                    {"tenant_id": batch.tenant_id, "source_scope": scope},
                ).fetchone()
                if holder is not None:
                    return ScopeBusy(holder["id"], holder["delivery_key"])
                details = dict(batch.details)
                details["resumes"] = int(details.get("resumes", 0)) + 1
                details["last_failure"] = details.pop("failure", None)
                resumed = conn.execute(
                    QUERIES["resume_publication"], {"batch_id": batch_id, "details": Jsonb(details)}
                ).fetchone()
                assert resumed is not None
                return Resumed(Batch.from_row(resumed))
        except ScopeTaken:
            # Another batch took the scope between our check and our update.
            holder = self._one(
                "running_holder", {"tenant_id": batch.tenant_id, "source_scope": scope}
            )
            if holder is None:
                return NotResumable("the scope changed hands during the resume; try again")
            return ScopeBusy(holder["id"], holder["delivery_key"])

    # -- normalized-file cache -------------------------------------------------------------

    def cached_file(self, source_key: str, etag: str, contract_version: str) -> CachedFile | None:
        row = self._one(
            "cached_file",
            {"source_key": source_key, "etag": etag, "contract_version": contract_version},
        )
        return None if row is None else CachedFile(**row)

    def store_cached_file(self, cached: CachedFile, batch_id: uuid.UUID | None) -> None:
        params = {**cached.__dict__, "details": Jsonb(cached.details), "batch_id": batch_id}
        with self._transaction() as conn:
            conn.execute(QUERIES["store_cached_file"], params)

    def forget_cached_file(self, source_key: str, etag: str, contract_version: str) -> None:
        """Drop an entry whose staged output has gone missing."""
        with self._transaction() as conn:
            conn.execute(
                QUERIES["forget_cached_file"],
                {"source_key": source_key, "etag": etag, "contract_version": contract_version},
            )

    # -- reads ----------------------------------------------------------------------------

    def get(self, batch_id: uuid.UUID) -> Batch | None:
        row = self._one("get", {"batch_id": batch_id})
        return None if row is None else Batch.from_row(row)

    def ids_with_prefix(self, prefix: str, limit: int = 2) -> list[uuid.UUID]:
        """Batch ids whose hex digits start with `prefix` (dashes ignored), lowest first, so
        an id cut short for an 80-column list still finds its batch. The prefix is a range of
        the primary key: the look-up uses its index."""
        digits = prefix.replace("-", "").lower()
        if not re.fullmatch(r"[0-9a-f]{1,32}", digits):
            raise InvalidInput(f"invalid batch id prefix {prefix!r}: expected hex digits")
        bounds = {"low": uuid.UUID(digits.ljust(32, "0")), "high": uuid.UUID(digits.ljust(32, "f"))}
        rows = self._all("ids_with_prefix", {**bounds, "limit": int(limit)})
        return [row["id"] for row in rows]

    def list(
        self,
        tenant: str | None = None,
        status: BatchStatus | str | None = None,
        limit: int = 50,
        scope: str | None = None,
    ) -> list[Batch]:
        """Newest first; `scope` (a source scope) needs `tenant` to mean one folder."""
        params = {
            "tenant_id": tenant,
            "source_scope": scope,
            "status": None if status is None else str(BatchStatus(status)),
            "limit": int(limit),
        }
        with self._transaction() as conn:
            rows = conn.execute(QUERIES["list"], params).fetchall()
        return [Batch.from_row(row) for row in rows]


def _jsonb(value: Any) -> Jsonb:
    """jsonb cannot hold NUL characters; an error message quoting a binary file can. They
    are written visibly as \\x00 so the failure is still recorded (and the scope freed)."""
    return Jsonb(_without_nul(value))


def _without_nul(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace("\x00", "\\x00")
    if isinstance(value, dict):
        return {_without_nul(k): _without_nul(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_without_nul(v) for v in value]
    return value


def _check_text(what: str, value: object, max_length: int) -> None:
    if not isinstance(value, str) or not value or len(value) > max_length:
        raise InvalidInput(f"invalid {what} {value!r}: expected 1-{max_length} characters")
