"""The import algorithm, once: `import_batch` runs DESIGN's steps 3-8 for a claimed batch,
through a step runner. The core runs each step as a plain call (`CoreSteps`); the
import-s3-folder flow runs the same steps as Prefect tasks (flows/import_s3_folder.py), so
the flow only maps steps to tasks and outcomes to states.

`import_folder` is the whole delivery in one process: claim (claiming.py), then the driver.
Each step lives with its concern: normalising.py (normalise + cache), loading.py (the slice
load), settle.py (record, publish, fail).
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from fleet_import import failpoints
from fleet_import.errors import LeaseLost, is_transient
from fleet_import.importing.claim import claim, contract_versions, new_owner
from fleet_import.importing.context import (
    AlreadyLoaded,
    Claimed,
    Committed,
    Failed,
    ImportContext,
    ImportOutcome,
    NotClaimed,
    NothingToDo,
    Progress,
    Skipped,
)
from fleet_import.importing.guards import (
    DELIVERY_MANIFEST_KEY,
    GuardOverride,
    SliceHeld,
    check_delivery_manifest,
    hold_batch,
    record_override,
)
from fleet_import.importing.load import load_step, reject_step
from fleet_import.importing.normalized_files import (
    NormalizedEntry,
    bucket_of,
    localised,
    normalize_object,
    normalize_one,
)
from fleet_import.importing.pinned import pinned_manifest
from fleet_import.importing.settle import (
    publish_step,
    record_commit,
    recover_committed,
    settle_failure,
)
from fleet_import.publication.publisher import EventSink
from fleet_import.s3.sources import Manifest, discover
from fleet_import.scope import Tenant, folder_of_scope, source_scope
from fleet_import.store.heartbeat import Heartbeat, leased, release_lease_quietly

__all__ = [  # what flows and tests use from here; each lives in the module named above
    "AlreadyLoaded",
    "Claimed",
    "Committed",
    "CoreSteps",
    "EventSink",
    "Failed",
    "ImportContext",
    "ImportOutcome",
    "NormalizedEntry",
    "NotClaimed",
    "NothingToDo",
    "Progress",
    "STEPS",
    "Skipped",
    "StepRunner",
    "claim",
    "discover_step",
    "import_batch",
    "import_folder",
    "load_step",
    "new_owner",
    "normalize_object",
    "normalize_one",
    "publish_step",
    "record_commit",
    "recover_committed",
    "reject_step",
    "release_lease_quietly",
    "settle_failure",
]

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class Step:
    """How a step may be retried. The runner is the one retry layer for a step: transient
    errors (S3 throttling, dropped connections) of the retried steps are tried again with
    backoff. The slice load is never retried whole (it consumes the normalisation stream;
    it retries its own transaction, replaying the files), nor is publication (its outbox
    steps carry their own attempts and backoff)."""

    name: str
    retried: bool


STEPS = {
    step.name: step
    for step in (
        Step("discover", retried=True),
        Step("normalise", retried=True),
        Step("commit-slice", retried=False),
        Step("publish", retried=False),
    )
}
STEP_RETRY_DELAYS_SECONDS = (2.0, 8.0, 30.0)
STEP_RETRY_JITTER = 0.5


class StepRunner(Protocol):
    """Runs the driver's steps: `run` one step, `map` one step over items, yielding each
    result in item order as soon as it is ready."""

    def run(self, step: Step, fn: Callable[..., T], *args: Any) -> T: ...

    def map(self, step: Step, fn: Callable[..., T], args: Sequence[tuple]) -> Iterator[T]: ...


class CoreSteps:
    """Plain calls, retried on transient errors; `map` on a small thread pool."""

    def __init__(self, workers: int, delays: Sequence[float] | None = None) -> None:
        self._workers = max(1, workers)
        self._delays = tuple(STEP_RETRY_DELAYS_SECONDS if delays is None else delays)

    def run(self, step: Step, fn: Callable[..., T], *args: Any) -> T:
        delays = self._delays if step.retried else ()
        for attempt, delay in enumerate((*delays, None), start=1):
            try:
                return fn(*args)
            except Exception as exc:
                if delay is None or not is_transient(exc):
                    raise
                pause = delay * (1 + random.random() * STEP_RETRY_JITTER)
                log.warning(
                    "%s failed (attempt %d: %s); again in %.1fs", step.name, attempt, exc, pause
                )
                time.sleep(pause)
        raise AssertionError("unreachable")

    def map(self, step: Step, fn: Callable[..., T], args: Sequence[tuple]) -> Iterator[T]:
        with ThreadPoolExecutor(max_workers=self._workers) as pool:
            yield from pool.map(lambda item: self.run(step, fn, *item), args)


def import_folder(
    ctx: ImportContext,
    tenant: Tenant,
    folder: str,
    delivery_key: str,
    *,
    owner: str | None = None,
    steps: StepRunner | None = None,
    force: bool = False,
    guard: GuardOverride | None = None,
) -> ImportOutcome:
    """`force` loads even content the slice already holds (see claiming.already_loaded);
    `guard` overrides the contracts' slice guards for this run (importing.guards)."""
    scope = source_scope(folder)  # invalid input is rejected before any row is written
    claimed = claim(ctx, tenant, scope, delivery_key, owner or new_owner(), force=force)
    if not isinstance(claimed, Claimed):
        return claimed
    record_override(ctx, claimed, guard)  # issue #24
    return import_batch(ctx, tenant, claimed, steps or CoreSteps(ctx.normalize_workers))


def import_batch(
    ctx: ImportContext, tenant: Tenant, claimed: Claimed, steps: StepRunner
) -> ImportOutcome:
    """Steps 3-8 for a batch whose lease `claimed.owner` holds: discover, normalise (mapped,
    in load order), load the slice as files arrive, record the commit, publish. A batch
    found committed (or stamped) is only published; a failure before commit fails it."""
    batch_id, scope, owner = claimed.batch_id, claimed.scope, claimed.owner
    with leased(ctx.repo, batch_id, owner, ctx.lease_ttl) as heartbeat:
        outcome: ImportOutcome | None = recover_committed(ctx, tenant, batch_id, scope, owner)
        if outcome is None:
            try:
                manifest = steps.run(STEPS["discover"], discover_step, ctx, batch_id, scope, owner)
                heartbeat.check()
                entries = _normalised(ctx, batch_id, manifest, heartbeat, steps)
                outcome = steps.run(
                    STEPS["commit-slice"],
                    load_step,
                    ctx,
                    tenant,
                    batch_id,
                    scope,
                    owner,
                    manifest,
                    entries,
                    heartbeat,
                )
            except LeaseLost:
                raise
            except SliceHeld as held:  # a slice guard (issue #24): held for review
                outcome = hold_batch(ctx, tenant, batch_id, scope, owner, held)
            except Exception as exc:  # noqa: BLE001 - every pre-commit failure fails the batch
                outcome = settle_failure(ctx, tenant, batch_id, scope, owner, exc)
        if isinstance(outcome, Committed):
            outcome = steps.run(STEPS["publish"], publish_step, ctx, outcome, owner, heartbeat)
        return outcome


def discover_step(ctx: ImportContext, batch_id: uuid.UUID, scope: str, owner: str) -> Manifest:
    folder = folder_of_scope(scope)
    ctx.progress(f"listing {folder}", None)
    # A rollback pins the content it loads (issue #24); every other batch lists its folder.
    pinned = pinned_manifest(ctx, batch_id)
    manifest = pinned or discover(ctx.s3, folder, ctx.contracts)
    # The folder's own manifest, if it has one (issue #24): raises on a mismatch.
    declared = None if pinned else check_delivery_manifest(ctx, manifest)
    failpoints.hit("mid_discovery")
    ctx.repo.update_details(
        batch_id,
        owner,
        {
            "phase": "discovered",
            "manifest": manifest.to_json(),
            "contract_versions": contract_versions(ctx, manifest),
            **({DELIVERY_MANIFEST_KEY: declared} if declared else {}),
        },
    )
    return manifest


def _normalised(
    ctx: ImportContext,
    batch_id: uuid.UUID,
    manifest: Manifest,
    heartbeat: Heartbeat,
    steps: StepRunner,
) -> Iterable[NormalizedEntry]:
    """The delivery's files normalised in the manifest's load order, each as soon as it is
    ready, so the warehouse load of one file overlaps the parsing of the next."""
    objects = list(manifest.load_order())
    bucket = bucket_of(manifest)
    args = [(ctx, batch_id, bucket, obj) for obj in objects]
    for done, normalised in enumerate(steps.map(STEPS["normalise"], normalize_one, args), start=1):
        entry = localised(ctx, normalised)  # normalised elsewhere: read from staging
        heartbeat.check()
        failpoints.hit("after_normalized_file")
        ctx.progress(
            f"normalised {entry.obj.name}: {entry.file.row_count:,} rows, "
            f"{entry.file.reject_count:,} rejects{' (cached)' if entry.cache_hit else ''}",
            done / len(objects),
        )
        yield entry
