"""The import algorithm, once: `import_batch` runs steps 3-8 (docs/operating.md, "How an
import runs") for a claimed batch, through a step runner. The core runs each step as a plain
call (`CoreSteps`); the import-s3-folder flow runs the same steps as Prefect tasks
(flows/import_s3_folder.py), so the flow only maps steps to tasks and outcomes to states.

`import_folder` is the whole delivery in one process: claim (claim.py), then the driver.
Each step takes the `LeasedBatch` (leased_batch.py: record, fail, publish) and lives with its
concern: normalized_files.py (normalize + cache, sent as jobs.py's jobs), load.py (the slice
load), settle.py (a commit recovered from the stamp, or a failure before commit).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

from fleet_import import failpoints
from fleet_import.errors import LeaseLost, should_retry
from fleet_import.importing.claim import claim, new_owner
from fleet_import.importing.context import (
    UNWATCHED,
    Claimed,
    Committed,
    Failed,
    Host,
    ImportContext,
    ImportOutcome,
)
from fleet_import.importing.drift import settle_drift, with_effective_contracts
from fleet_import.importing.guards import (
    GuardOverride,
    SliceHeld,
    check_delivery_manifest,
    explain_refusal,
    hold_batch,
    record_override,
)
from fleet_import.importing.jobs import NormalizeJob, run_normalize_job
from fleet_import.importing.leased_batch import LeasedBatch
from fleet_import.importing.load import load_step
from fleet_import.importing.normalized_files import NormalizedEntry, bucket_of, localised
from fleet_import.importing.pinned import pinned_manifest
from fleet_import.importing.settle import (
    StampUnreadable,
    leave_unsettled,
    recover_committed,
    recover_or_fail,
)
from fleet_import.publication.refusal import tell_refusal
from fleet_import.retry import NO_RETRY, Backoff
from fleet_import.s3.delivery import DeliveryIdentity
from fleet_import.s3.sources import DiscoveryError, Manifest, discover
from fleet_import.scope import Tenant, folder_of_scope, source_scope
from fleet_import.store.details import BatchDetails
from fleet_import.store.heartbeat import leased
from fleet_import.tenants.binding import Admission, Refused

log = logging.getLogger(__name__)
T = TypeVar("T")
IMPORT = "import-s3-folder"  # a refusal's `source`, as the flow is named


@dataclass(frozen=True)
class Step:
    """How a step may be retried. The runner is the one retry layer for a step: transient
    errors (a dropped database connection) of the retried steps are tried again with
    backoff, but not S3's, which botocore retried already within its bound (s3.client).
    The slice load is never retried whole (it consumes the normalization stream; it retries
    its own transaction, replaying the files), nor is publication (its outbox steps carry
    their own attempts and backoff)."""

    name: str
    retried: bool


# The names are the task names Prefect records for every run and the artifact key the
# normalize step writes: "normalise" keeps its old spelling so runs before and after read as
# one history.
STEPS = {
    step.name: step
    for step in (
        Step("discover", retried=True),
        Step("normalise", retried=True),
        Step("commit-slice", retried=False),
        Step("publish", retried=False),
    )
}
STEP_BACKOFF = Backoff((2.0, 8.0, 30.0))
"""The retried steps' backoff: under CoreSteps, and as the flow's Prefect task retries."""


class StepRunner(Protocol):
    """Runs the driver's steps: `run` one step, `map` one step over items, yielding each
    result in item order as soon as it is ready."""

    def run(self, step: Step, fn: Callable[..., T], *args: Any) -> T: ...

    def map(self, step: Step, fn: Callable[..., T], args: Sequence[tuple]) -> Iterator[T]: ...


class CoreSteps:
    """Plain calls, retried on transient errors; `map` on a small thread pool."""

    def __init__(self, workers: int, backoff: Backoff | None = None) -> None:
        self._workers = max(1, workers)
        self._backoff = backoff

    def run(self, step: Step, fn: Callable[..., T], *args: Any) -> T:
        backoff = (self._backoff or STEP_BACKOFF) if step.retried else NO_RETRY
        return backoff.call(lambda: fn(*args), retryable=should_retry, what=step.name, log=log)

    def map(self, step: Step, fn: Callable[..., T], args: Sequence[tuple]) -> Iterator[T]:
        """Once an item failed, the items not yet started are not started: the run ends
        when the ones under way do (an S3 that stopped answering costs one call's bound,
        not one per file). The failed item comes first in order, so it is what is raised."""
        failed = threading.Event()

        def one(item: tuple) -> T:
            if failed.is_set():
                raise _NotStarted(step.name)
            try:
                return self.run(step, fn, *item)
            except BaseException:
                failed.set()
                raise

        pool = ThreadPoolExecutor(max_workers=self._workers)
        try:
            yield from pool.map(one, args)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


class _NotStarted(Exception):
    """An item of a map not started because an earlier one failed (never the one raised)."""


def import_folder(
    ctx: ImportContext,
    tenant: Tenant | str,
    folder: str,
    delivery_key: str,
    *,
    admission: Admission | None = None,
    owner: str | None = None,
    steps: StepRunner | None = None,
    force: bool = False,
    guard: GuardOverride | None = None,
    host: Host = UNWATCHED,
    source: str = IMPORT,
) -> ImportOutcome | Refused:
    """One delivery, whole: the flow runs this with its steps as tasks. A tenant given by
    id is admitted first (registry, folder binding): Refused, told, nothing written; a
    `Tenant` is taken as admitted (tests, benchmarks). `force` loads even content the slice
    already holds (see claim.already_loaded); `guard` overrides the contracts' slice guards
    for this run (importing.guards). `source`: the entry point a refusal names."""
    scope = source_scope(folder)  # invalid input is rejected before any row is written
    if isinstance(tenant, str):
        if admission is None:
            raise TypeError("a tenant given by id needs the admission that admits it")
        admitted = admission(tenant, folder)
        if isinstance(admitted, Refused):  # before the scope is reserved: nothing is written
            return tell_refusal(ctx.events, admitted, source)
        tenant = admitted
    host.admitted(tenant, scope)
    claimed = claim(ctx, tenant, scope, delivery_key, owner or new_owner(), force=force)
    host.claim_ended(tenant, scope, claimed)
    if not isinstance(claimed, Claimed):
        return claimed
    record_override(ctx, claimed, guard)  # issue #24
    host.loading(claimed, [claimed.batch_id])
    progress = host.progress(scope)
    ctx = ctx if progress is None else replace(ctx, progress=progress)
    return import_batch(ctx, tenant, claimed, steps or CoreSteps(ctx.normalize_workers))


def import_batch(
    ctx: ImportContext, tenant: Tenant, claimed: Claimed, steps: StepRunner
) -> ImportOutcome:
    """Steps 3-8 for a batch whose lease `claimed.owner` holds: discover, normalize (mapped,
    in load order), load the slice as files arrive, record the commit, publish. A batch
    found committed (or stamped) is only published; a failure before commit fails it; one
    whose commit outcome cannot be known now is left running for the next run (settle.py)."""
    with leased(
        ctx.repo,
        claimed.batch_id,
        claimed.owner,
        ctx.lease_ttl,
        confirmed_at=claimed.lease_confirmed_at,
    ) as heartbeat:
        batch = LeasedBatch(ctx, tenant, claimed.batch_id, claimed.scope, claimed.owner, heartbeat)
        outcome: ImportOutcome | None
        try:
            outcome = recover_committed(batch)
        except StampUnreadable as exc:  # it may have committed: the next run decides
            outcome = leave_unsettled(batch, exc)
        if outcome is None:
            try:
                # The tables' evolved columns are part of the contracts (importing.drift).
                batch = replace(batch, ctx=with_effective_contracts(ctx, tenant.tenant_id))
                manifest = steps.run(STEPS["discover"], discover_step, batch)
                batch.check_lease()
                entries = _normalized(batch, manifest, steps)
                # New columns under `evolve` or `review` (issue #25): added, or held.
                batch, entries = settle_drift(
                    batch, manifest, entries, lambda grown: _normalized(grown, manifest, steps)
                )
                outcome = steps.run(STEPS["commit-slice"], commit_step, batch, manifest, entries)
            except LeaseLost:
                raise
            except SliceHeld as held:  # new columns under `review`: held before the load
                outcome = hold_batch(batch, held)
            except Exception as exc:  # noqa: BLE001 - every pre-commit failure fails the batch
                outcome = recover_or_fail(batch, exc)
        if isinstance(outcome, Committed):
            outcome = steps.run(STEPS["publish"], publish_step, batch, outcome)
        return outcome


def commit_step(
    batch: LeasedBatch, manifest: Manifest, entries: Iterable[NormalizedEntry]
) -> Committed | Failed:
    """The commit-slice step: `load_step`, or the batch held for review when a slice guard
    stops it (issue #24). A hold is an outcome, not an error: the step (a Prefect task in
    the flows) returns it and ends without an error logged."""
    try:
        return load_step(batch, manifest, entries)
    except SliceHeld as held:
        return hold_batch(batch, held)


def discover_step(batch: LeasedBatch) -> Manifest:
    ctx = batch.ctx
    folder = folder_of_scope(batch.scope)
    ctx.progress(f"listing {folder}", None)
    # A rollback pins the content it loads (issue #24); every other batch lists its folder.
    pinned = pinned_manifest(ctx, batch.batch_id)
    try:
        manifest = pinned or discover(ctx.s3, folder, ctx.contracts)
    except DiscoveryError as refused:
        explain_refusal(ctx, refused)  # the folder's own manifest may name the missing file
        raise
    # The folder's own manifest, if it has one (issue #24): raises on a mismatch.
    declared = None if pinned else check_delivery_manifest(ctx, manifest)
    failpoints.hit("mid_discovery")
    batch.update_details(
        BatchDetails.patch(
            phase="discovered",
            manifest=manifest.to_json(),
            contract_versions=DeliveryIdentity.of(manifest, ctx.contracts).versions,
            **({"delivery_manifest": declared} if declared else {}),
        )
    )
    return manifest


def publish_step(batch: LeasedBatch, committed: Committed) -> ImportOutcome:
    """Steps 7-8 (LeasedBatch.publish), as a step of its own."""
    return batch.publish(committed)


def _normalized(
    batch: LeasedBatch, manifest: Manifest, steps: StepRunner
) -> Iterable[NormalizedEntry]:
    """The delivery's files normalized in the manifest's load order, each as soon as it is
    ready, so the warehouse load of one file overlaps the parsing of the next. Each file is
    a job (importing.jobs): it may be normalized in another process."""
    ctx = batch.ctx
    objects = list(manifest.load_order())
    bucket = bucket_of(manifest)
    args = [
        (NormalizeJob.of(ctx, batch.batch_id, batch.tenant_id, bucket, obj),) for obj in objects
    ]
    for done, normalized in enumerate(
        steps.map(STEPS["normalise"], run_normalize_job, args), start=1
    ):
        entry = localised(ctx, normalized)  # normalized elsewhere: read from staging
        batch.check_lease()
        failpoints.hit("after_normalized_file")
        ctx.progress(
            f"normalized {entry.obj.name}: {entry.file.row_count:,} rows, "
            f"{entry.file.reject_count:,} rejects{' (cached)' if entry.cache_hit else ''}",
            done / len(objects),
        )
        yield entry
