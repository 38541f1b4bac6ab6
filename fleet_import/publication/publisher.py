"""Publication: run a committed batch's outbox steps in order, then succeed the batch.

The steps were enqueued with the warehouse commit (`BatchRepository.mark_committed`), so a
crash anywhere here loses nothing: a later drain continues where the last one stopped. The
guarantees live in PostgreSQL, not here: a step is claimed by one drain at a time, only once
every earlier step is done (`OutboxRepository.claim_next`), and every transition is fenced by
the batch's execution lease or the step's claim. Before each step the slice stamp is re-read
from the warehouse: once a newer batch owns the slice, this batch's publication is expired and
nothing more of it runs.

Free of Prefect: events go to a sink passed in (publication.events).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from fleet_import import failpoints
from fleet_import.errors import FleetImportError, InvalidInput, LeaseLost
from fleet_import.explain import with_next_step
from fleet_import.publication.decisions import decision_events
from fleet_import.publication.events import (
    EventSink,
    emit_quietly,
    event_payload,
    expired_publication,
    fail_and_tell,
)
from fleet_import.publication.outcomes import (
    PublicationBusy,
    PublicationDeferred,
    PublicationExpired,
    PublicationFailed,
    Published,
    PublishOutcome,
)
from fleet_import.publication.refusal import refusal_of, refuse_publication
from fleet_import.publication.retention import Retention, files_in_use
from fleet_import.publication.success import succeed_across_outage
from fleet_import.retry import Backoff, doubling
from fleet_import.store.details import BatchDetails, FailureKind
from fleet_import.store.heartbeat import Heartbeat, leased
from fleet_import.store.models import (
    Batch,
    BatchStatus,
    CachedFile,
    LeaseAcquired,
)
from fleet_import.store.outbox import OutboxRepository, OutboxStep, StepStatus
from fleet_import.store.repository import BatchRepository
from fleet_import.tenants.binding import Admission

log = logging.getLogger(__name__)

DEFAULT_PUBLICATION_STEPS = ("refresh_dependants", "notify", "retire_superseded")
DEFAULT_MAX_ATTEMPTS = 5
# Longer than any step should take: a claim outliving its worker blocks the batch this long.
DEFAULT_CLAIM_TTL_SECONDS = 60.0
DEFAULT_DRAIN_LIMIT = 50
PUBLICATION_BACKOFF = doubling(5.0, 600.0)
"""The wait before a failed step runs again: 5, 10, 20... s, at most 600 s."""

SLICE_PUBLISHED_EVENT = "fleet.slice.published"
BATCH_PUBLISHED_EVENT = "fleet.batch.published"
DRAIN = "drain-publications"  # a refusal's `source`, as the flow is named
_EVENT_ID_NAMESPACE = uuid.UUID("5b0f6c1e-2f43-4c8e-9a57-3f0d1c9e7a21")


def published_event_id(batch_id: uuid.UUID) -> uuid.UUID:
    """The id of a batch's `fleet.slice.published` event, the same on every attempt: a
    notify step that runs again (its completion was lost) repeats the event, not the news.
    Prefect stores one event per id; consumers can drop repeats by it too."""
    return uuid.uuid5(_EVENT_ID_NAMESPACE, f"{SLICE_PUBLISHED_EVENT}/{batch_id}")


class SliceStamps(Protocol):
    """The part of the Warehouse protocol publication needs."""

    def slice_owner(self, tenant_id: str, source_scope: str) -> uuid.UUID | None: ...


class Staging(Protocol):
    """The part of `fleet_import.s3.staging.StagingArea` publication needs."""

    def uri(self, name: str) -> str: ...

    def delete(self, names: list[str]) -> None: ...


class UnknownStep(FleetImportError):
    """The outbox holds a step no handler is registered for."""


@dataclass(frozen=True)
class StepContext:
    """What a step handler sees: the batch as re-read just before the step."""

    batch: Batch
    step: OutboxStep
    worker: str


StepHandler = Callable[[StepContext], None]


class Publisher:
    """Runs outbox steps for batches. `steps` maps step names to handlers; add or replace
    entries to extend publication (the outbox rows name the steps, in order)."""

    def __init__(
        self,
        repo: BatchRepository,
        outbox: OutboxRepository,
        warehouse: SliceStamps,
        *,
        events: EventSink,
        refresh_sql: Sequence[str] = (),
        run_warehouse_sql: Callable[[str], None] | None = None,
        staging: Staging | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        backoff: Backoff = PUBLICATION_BACKOFF,
        claim_ttl: float = DEFAULT_CLAIM_TTL_SECONDS,
        retention: Retention | None = None,
    ) -> None:
        if refresh_sql and run_warehouse_sql is None:
            raise InvalidInput("refresh_sql needs run_warehouse_sql to run it")
        if max_attempts < 1:
            raise InvalidInput(f"max_attempts must be at least 1, not {max_attempts}")
        self._repo, self._outbox, self._warehouse = repo, outbox, warehouse
        self._events = events
        self._refresh_sql = tuple(refresh_sql)
        self._run_warehouse_sql = run_warehouse_sql
        self._staging = staging
        self._max_attempts = max_attempts
        self._backoff = backoff
        self._claim_ttl = claim_ttl
        self._retention = retention  # None: nothing beyond this batch's own files is kept
        self.steps: dict[str, StepHandler] = {
            "refresh_dependants": self.refresh_dependants,
            "notify": self.notify,
            "retire_superseded": self.retire_superseded,
        }

    # -- one batch --------------------------------------------------------------------------

    def publish_batch(
        self,
        batch_id: uuid.UUID,
        owner: str,
        worker: str | None = None,
        *,
        heartbeat: Heartbeat | None = None,
    ) -> PublishOutcome:
        """Run the batch's remaining steps; `owner` must hold its execution lease. `worker`
        names the step claims: the lease owner unless several workers share one lease.

        Returns at the first step that cannot run now; never waits for a backoff.
        Raises LeaseLost (or ClaimLost) when the lease or a step's claim was taken over.
        """
        worker = worker or owner
        while True:
            if heartbeat is not None:
                heartbeat.check()
            step = self._outbox.claim_next(batch_id, worker, self._claim_ttl, lease_owner=owner)
            if step is None:
                return self._settle(batch_id, owner)
            outcome = self._run_claimed(batch_id, owner, worker, step)
            if outcome is not None:
                return outcome

    def _run_claimed(
        self, batch_id: uuid.UUID, owner: str, worker: str, step: OutboxStep
    ) -> PublishOutcome | None:
        batch = self._repo.get(batch_id)
        if batch is None or batch.source_scope is None:
            raise LeaseLost(f"batch {batch_id} vanished or has no source scope")
        try:
            stamp = self._warehouse.slice_owner(batch.tenant_id, batch.source_scope)
        except Exception as exc:  # noqa: BLE001 - an unreadable stamp is a failed attempt
            error = f"could not read the slice stamp: {_describe(exc)}"
            return self._fail(batch, step, worker, error)
        expired = expired_publication(batch.id, batch.source_scope, stamp)
        if expired is not None:
            return self._expire(batch, step, owner, worker, stamp, expired)
        if batch.record.phase != "publishing":
            try:
                patch = BatchDetails.patch(phase="publishing")
                batch = self._repo.update_details(batch_id, owner, patch)
            except LeaseLost:
                self._outbox.release(step.id, worker)
                raise
        try:
            handler = self.steps.get(step.step)
            if handler is None:
                raise UnknownStep(f"no handler is registered for publication step {step.step!r}")
            failpoints.hit("in_step_", step.step)
            handler(StepContext(batch, step, worker))
        except Exception as exc:  # noqa: BLE001 - any handler failure is a failed attempt
            return self._fail(batch, step, worker, _describe(exc))
        failpoints.hit("after_step_", step.step)
        self._outbox.complete(step.id, worker)
        return None

    def _fail(self, batch: Batch, step: OutboxStep, worker: str, error: str) -> PublicationFailed:
        failed = self._outbox.fail(step.id, worker, error, self._max_attempts, self._backoff)
        dead = failed.status == StepStatus.DEAD
        log.warning(
            "publication step %s of batch %s failed (attempt %d, %s): %s",
            step.step,
            batch.id,
            failed.attempts,
            "dead" if dead else "will retry",
            error,
        )
        return PublicationFailed(batch.id, step.step, error, failed.attempts, dead)

    def _expire(
        self,
        batch: Batch,
        step: OutboxStep,
        owner: str,
        worker: str,
        stamp: uuid.UUID | None,
        error: str,
    ) -> PublicationExpired:
        self._outbox.release(step.id, worker)
        log.warning("batch %s, before step %r: %s", batch.id, step.step, error)
        self.expire_publication(batch.id, owner, error)
        return PublicationExpired(batch.id, step.step, stamp)

    def expire_publication(self, batch_id: uuid.UUID, owner: str, error: str) -> Batch:
        """Fail the batch for good (`error` from `events.expired_publication`), and tell."""
        return fail_and_tell(
            self._events,
            lambda: self._outbox.mark_publication_expired(batch_id, owner, error),
            FailureKind.FAILED_PUBLICATION,
            error,
            publication_expired=True,
        )

    def _settle(self, batch_id: uuid.UUID, owner: str) -> PublishOutcome:
        """No step was claimable: say why, or succeed the batch if every step is done."""
        batch = self._repo.get(batch_id)
        if batch is None:
            raise LeaseLost(f"batch {batch_id} does not exist")
        if batch.status != BatchStatus.RUNNING or batch.execution_lease_id != owner:
            raise LeaseLost(
                f"batch {batch_id} is {batch.status} with lease owner "
                f"{batch.execution_lease_id!r}; {owner!r} may not publish it"
            )
        steps = self._outbox.steps(batch_id)
        head = next((s for s in steps if s.status != StepStatus.DONE), None)
        if head is None:
            summary = {s.step: {"status": str(s.status), "attempts": s.attempts} for s in steps}
            failpoints.hit("before_mark_succeeded")
            succeeded = succeed_across_outage(
                self._repo, batch_id, owner, {"publication": summary}
            )
            emit_quietly(
                self._events,
                BATCH_PUBLISHED_EVENT,
                _payload(succeeded, row_counts=dict(succeeded.record.row_counts)),
            )
            return Published(batch_id, tuple(s.step for s in steps))
        if head.status == StepStatus.DEAD:
            return PublicationFailed(
                batch_id, head.step, head.last_error or "", head.attempts, dead=True
            )
        if head.status == StepStatus.CLAIMED:
            return PublicationBusy(batch_id, head.step, head.claimed_by)
        return PublicationDeferred(batch_id, head.step, head.available_at)

    # -- many batches ---------------------------------------------------------------------

    def drain(
        self,
        worker: str,
        *,
        lease_ttl: float,
        limit: int = DEFAULT_DRAIN_LIMIT,
        admission: Admission | None = None,
    ) -> list[PublishOutcome]:
        """Publish running, committed batches nobody is executing. A batch whose lease is
        live is skipped; failed_publication batches wait for an explicit resume.

        With `admission` (the tenant rule in force, `intake.admission.admission`), a batch
        whose tenant it refuses publishes nothing: it is failed_publication with the
        refusal, told as DELIVERY_REFUSED_EVENT, and counted (PublicationRefused)."""
        outcomes: list[PublishOutcome] = []
        for batch_id in self._outbox.batches_with_open_steps(limit):
            if not isinstance(self._repo.acquire_lease(batch_id, worker, lease_ttl), LeaseAcquired):
                continue  # another executor holds it, or it finished meanwhile
            try:
                with leased(self._repo, batch_id, worker, lease_ttl) as heartbeat:
                    refusal = refusal_of(self._repo.get(batch_id), admission)
                    if refusal is not None:
                        outcome: PublishOutcome = refuse_publication(
                            self._repo, self._events, batch_id, worker, refusal, DRAIN
                        )
                    else:
                        outcome = self.publish_batch(batch_id, worker, heartbeat=heartbeat)
                    if isinstance(outcome, PublicationFailed) and outcome.dead:
                        self.mark_failed_publication(batch_id, worker, outcome)
                outcomes.append(outcome)
            except LeaseLost as exc:
                log.warning("drain %s lost batch %s: %s", worker, batch_id, exc)
        return outcomes

    def mark_failed_publication(
        self, batch_id: uuid.UUID, owner: str, outcome: PublicationFailed
    ) -> None:
        """Fail the batch as failed_publication (resumable with resume_publication), and tell."""
        state = "is dead after" if outcome.dead else "failed after"
        error = (
            f"publication step {outcome.step!r} {state} {outcome.attempts} attempts: "
            f"{outcome.error}"
        )
        kind = FailureKind.FAILED_PUBLICATION
        fail_and_tell(
            self._events, lambda: self._repo.mark_failed(batch_id, owner, kind, error), kind, error
        )

    # -- the default steps ------------------------------------------------------------------

    def refresh_dependants(self, ctx: StepContext) -> None:
        """Refresh what is derived from the slices (materialized views...); none by default."""
        for statement in self._refresh_sql:
            assert self._run_warehouse_sql is not None  # checked in __init__
            self._run_warehouse_sql(statement)

    def notify(self, ctx: StepContext) -> None:
        """Tell downstream consumers the slice changed, and what an approval or a rollback
        decided (publication.decisions); a sink failure fails the step."""
        row_counts = dict(ctx.batch.record.row_counts)
        event_id = str(published_event_id(ctx.batch.id))
        self._events(
            SLICE_PUBLISHED_EVENT, _payload(ctx.batch, row_counts=row_counts, event_id=event_id)
        )
        for name, payload in decision_events(ctx.batch, self._repo.get):
            self._events(name, payload)

    def retire_superseded(self, ctx: StepContext) -> None:
        """Mark superseded what this batch's slice replaced: every earlier failed publication
        of the scope (its open steps retired, so it is never resumed or published) and the
        previous succeeded batch; then delete the normalized files that only earlier batches
        of the scope used, failed ones included. Files go first, cache rows next, the
        previous success's mark last: a retry after any failure finds the same entries
        again. Superseding the failed ones is one idempotent statement, so its place in that
        order does not matter."""
        for failed_id in self._outbox.supersede_failed_publications(ctx.batch.id):
            log.info("failed publication %s is superseded by batch %s", failed_id, ctx.batch.id)
        in_use = files_in_use(ctx.batch)
        if in_use is not None and self._retention is not None:  # issue #24: rollbacks
            in_use = [*in_use, *self._retention.files_kept(ctx.batch.id)]
        # Without a staging area (or a manifest saying what we still use) nothing is deleted:
        # a cache row forgotten while its file stays would leak the file for good.
        if self._staging is not None and in_use is not None:
            entries = self._outbox.cache_entries_only_used_by(ctx.batch.id, in_use)
            names = [name for entry in entries for name in _staged_names(self._staging, entry)]
            if names:
                self._staging.delete(names)
            self._outbox.forget_cache_entries(ctx.batch.id, entries)
        previous = self._outbox.previous_batch(ctx.batch.id)
        if previous is not None and not self._outbox.mark_superseded(previous.id, ctx.batch.id):
            log.warning("batch %s was superseded by another batch meanwhile", previous.id)


def _payload(batch: Batch, **extra: Any) -> dict[str, Any]:
    return event_payload(batch.tenant_id, batch.source_scope, batch.id, **extra)


def _staged_names(staging: Staging, entry: CachedFile) -> list[str]:
    """Staging-relative names of an entry's output and rejects files; objects outside the
    staging area are not ours to delete."""
    root = staging.uri("")
    uris = [entry.output_uri, entry.details.get("rejects_uri")]
    return [
        uri.removeprefix(root)
        for uri in uris
        if isinstance(uri, str) and uri.startswith(root) and len(uri) > len(root)
    ]


def _describe(exc: BaseException) -> str:
    return with_next_step(f"{type(exc).__name__}: {exc}", exc)
