"""The landing-zone sweep: which delivery folders are complete, and which of them to import.

A folder is complete by a per-deployment rule: a marker object exists (`_SUCCESS` by
default), or nothing in it changed for a while. It is identified as the import identifies
it (`DeliveryIdentity`: manifest fingerprint and contract versions), so new files make a new
delivery, and so does a contract changed since the folder's last success: that folder is
due again, since its slice holds rows read by a contract no longer in force and the import
would not call it already loaded either (only folders of the lookback window reload).

Every path that starts an import for a folder's content uses the same key for it,
`idempotency_key(scope, fingerprint)`: as the Prefect flow-run idempotency key (a unique
index on the server, so overlapping sweeps create one run) and as the batch's delivery key
(so a duplicate run continues the same batch instead of making a second one).

The sweep's cost does not grow with history: with a lookback window of N days it enters
only the folders dated from N days ago through tomorrow (the date in the folder's name, see
fleet_import.intake.landing), and each folder costs one LIST (its listing gives both completion and
the manifest).

This module imports no Prefect (`fleet_import.intake.triggers` mirrors how Prefect's server
matches a trigger, for tests where no server evaluates triggers).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from fleet_import.config import DEFAULT_LEASE_TTL_SECONDS
from fleet_import.contracts.fleet import FLEET_DATASETS
from fleet_import.contracts.model import ContractSet
from fleet_import.errors import InvalidInput, TransientError
from fleet_import.intake.completion import CompletionRule, Marker, folder_completion
from fleet_import.intake.landing import (
    DEFAULT_PATTERN,
    DELIVERY_SKIPPED_EVENT,
    LandingLayout,
    Unimportable,
    lookback_dates,
    skipped_payload,
)
from fleet_import.publication.events import EventSink
from fleet_import.s3.client import Children, S3Client, list_children
from fleet_import.s3.delivery import DeliveryIdentity
from fleet_import.s3.errors import s3_errors
from fleet_import.s3.sources import DiscoveryError, discover
from fleet_import.scope import source_scope
from fleet_import.store.details import FailureKind
from fleet_import.store.sweep_repository import FolderBatches, SweepRepository

IDEMPOTENCY_KEY_PREFIX = "sweep:"
# Prefect stores idempotency keys of any length, but the batch's delivery_key column holds
# 200 characters; the key is a fixed-length hash, far below both.
MAX_KEY_LENGTH = 200


# -- results ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReadyFolder:
    """A complete delivery folder and the fingerprint of what it holds now."""

    tenant_id: str
    folder: str
    fingerprint: str
    completed_at: dt.datetime | None = None  # the marker's, or the newest object's, time
    contract_versions: tuple[tuple[str, str], ...] = ()  # DeliveryIdentity's, with fingerprint

    @property
    def scope(self) -> str:
        return source_scope(self.folder)


class Skip(NamedTuple):
    """A folder the sweep does not start, and why (shown in the sweep's artifact, and
    announced as a fleet.delivery.skipped event unless it is the steady "loaded")."""

    folder: str
    reason: str
    tenant_id: str | None = None
    kind: str = "refused"  # unimportable, incomplete, refused, transient, running, loaded, failed


# Every folder in the window that was loaded is skipped again each sweep: not news.
QUIET_SKIPS = frozenset({"loaded"})


@dataclass(frozen=True)
class Scan:
    """What the landing zone holds: complete folders, and folders left alone with a reason;
    the dates it looked at (None: every folder), its LISTs and how long it took."""

    ready: list[ReadyFolder] = field(default_factory=list)
    skipped: list[Skip] = field(default_factory=list)
    window: tuple[dt.date, dt.date] | None = None
    listings: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class PlannedImport:
    """An import the sweep starts; `idempotency_key` doubles as the batch's delivery key."""

    tenant_id: str
    folder: str
    fingerprint: str
    idempotency_key: str

    @property
    def delivery_key(self) -> str:
        return self.idempotency_key

    @property
    def parameters(self) -> dict[str, str]:
        """The `import-s3-folder` parameters of this delivery."""
        return {
            "tenant_id": self.tenant_id,
            "folder": self.folder,
            "delivery_key": self.delivery_key,
        }


@dataclass(frozen=True)
class SweepPlan:
    start: list[PlannedImport] = field(default_factory=list)
    skip: list[Skip] = field(default_factory=list)


# -- keys ------------------------------------------------------------------------------------


def idempotency_key(
    scope: str,
    fingerprint: str,
    replaces: uuid.UUID | None = None,
    *,
    after: uuid.UUID | None = None,
) -> str:
    """The one key of a delivery of `fingerprint` into `scope`: stable across processes and
    sweeps, at most MAX_KEY_LENGTH characters.

    `replaces` is the batch whose slice is current when the delivery is planned. It only
    matters when a folder returns to content loaded before (A, then B, then A again): that
    is a new delivery, and must not be deduplicated into the first load of A.
    `after` is an abandoned batch of this content: the import that takes it over is a new
    run (the one that abandoned it keeps its own key, and Prefect would return that run).
    """
    parts = [scope, fingerprint, str(replaces) if replaces else None]
    payload = json.dumps(parts + [str(after)] if after else parts)
    key = IDEMPOTENCY_KEY_PREFIX + hashlib.sha256(payload.encode("utf-8")).hexdigest()
    assert len(key) <= MAX_KEY_LENGTH
    return key


# -- finding complete folders ----------------------------------------------------------------


class _Lister:
    """list_children with discovery's error sorting, counting what it asked S3."""

    def __init__(self, s3: S3Client, bucket: str) -> None:
        self.s3, self.bucket, self.calls = s3, bucket, 0

    def __call__(self, key_prefix: str) -> Children:
        self.calls += 1
        with s3_errors(f"cannot list s3://{self.bucket}/{key_prefix}", DiscoveryError):
            return list_children(self.s3, self.bucket, key_prefix)


def find_ready_folders(
    s3: S3Client,
    bucket: str,
    prefix: str = "",
    *,
    layout: str = DEFAULT_PATTERN,
    completion: CompletionRule | None = None,
    contracts: ContractSet = FLEET_DATASETS,
    now: dt.datetime | None = None,
    lookback_days: int = 0,
    contracts_of: Callable[[str], ContractSet] | None = None,
) -> Scan:
    """List the tenant delivery folders of a landing bucket (with Delimiter, every page) and
    keep the complete ones with their current fingerprint.

    With `lookback_days` (and a layout whose folder names carry a date), only the folders
    dated within the window are entered; older ones are never listed. A folder holding
    nothing (a date in the window without a delivery) is no folder and not reported.
    Folders the layout names but that cannot be imported (an invalid tenant id or date, a
    folder that does not canonicalise, a delivery discovery refuses) are skipped with the
    reason. Listing the landing zone itself raises (TransientError when S3 is struggling);
    a transient failure on one folder only skips that folder until the next sweep.
    `contracts_of(tenant_id)`, when given, is a tenant's contracts as its imports read them
    (with the columns drift added to its tables: importing.drift), asked once per tenant.
    """
    of_tenant: dict[str, ContractSet] = {}

    def tenant_contracts(tenant_id: str) -> ContractSet:
        if contracts_of is None:
            return contracts
        if tenant_id not in of_tenant:
            of_tenant[tenant_id] = contracts_of(tenant_id)
        return of_tenant[tenant_id]

    started = time.monotonic()
    rule = completion if completion is not None else Marker()
    now = now if now is not None else dt.datetime.now(dt.UTC)
    landing = LandingLayout(prefix, layout)
    dates = lookback_dates(lookback_days, now.date()) if landing.dated else None
    lister = _Lister(s3, bucket)
    ready: list[ReadyFolder] = []
    skipped: list[Skip] = []
    for found in landing.folders(bucket, lambda key_prefix: lister(key_prefix).folders, dates):
        if isinstance(found, Unimportable):
            skipped.append(Skip(found.folder, found.reason, found.tenant_id, "unimportable"))
            continue
        tenant_id, folder, key_prefix = found
        try:
            source_scope(folder)
            listing = lister(key_prefix)
            if not listing.objects and not listing.folders:
                continue
            completed_at, waiting = folder_completion(
                s3, bucket, listing.objects, key_prefix, rule, now
            )
            if waiting is not None:
                skipped.append(Skip(folder, f"not complete: {waiting}", tenant_id, "incomplete"))
                continue
            manifest = discover(s3, folder, tenant_contracts(tenant_id), listing)
        except TransientError as exc:  # first: a transient DiscoveryError is one too
            reason = f"transient, retried next sweep: {exc}"
            skipped.append(Skip(folder, reason, tenant_id, "transient"))
            continue
        except (InvalidInput, DiscoveryError) as exc:
            skipped.append(Skip(folder, str(exc), tenant_id, "refused"))
            continue
        identity = DeliveryIdentity.of(manifest, tenant_contracts(tenant_id))
        ready.append(
            ReadyFolder(
                tenant_id,
                folder,
                identity.fingerprint,
                completed_at,
                identity.contract_versions,
            )
        )
    return Scan(
        ready,
        skipped,
        (dates[0], dates[-1]) if dates else None,
        lister.calls,
        time.monotonic() - started,
    )


def announce_skips(skips: Iterable[Skip], events: EventSink) -> int:
    """Emit a fleet.delivery.skipped event for each skip an operator may look for (all but
    QUIET_SKIPS); the number emitted."""
    emitted = 0
    for skip in skips:
        if skip.kind in QUIET_SKIPS:
            continue
        payload = skipped_payload("sweep", skip.tenant_id, skip.folder, skip.reason, skip.kind)
        events(DELIVERY_SKIPPED_EVENT, payload)
        emitted += 1
    return emitted


# -- planning --------------------------------------------------------------------------------


def plan_sweep(
    found: Scan | Iterable[ReadyFolder],
    repo: SweepRepository,
    lease_ttl: float = DEFAULT_LEASE_TTL_SECONDS,
) -> SweepPlan:
    """Start each complete folder unless the store says its content is loaded or in hand.

    Skipped: a scope with a running batch (whatever it holds: an event-triggered import does
    not know its fingerprint until it has listed the folder; the next sweep looks again)
    unless it is abandoned (its executor is gone: the import started takes it over),
    content equal to the scope's current slice, and content whose newest batch failed
    (pre-commit failures are terminal, failed publications are resumed with
    resume_publication; a manual run or new files make a new delivery). A batch that failed
    before it ran (enqueue_failed) or was abandoned is started again.
    """
    scan = found if isinstance(found, Scan) else Scan(ready=list(found))
    keys = {
        folder: (
            folder.tenant_id,
            folder.scope,
            folder.fingerprint,
            json.dumps(dict(folder.contract_versions), sort_keys=True),
        )
        for folder in scan.ready
    }
    known = repo.folder_batches(keys.values(), lease_ttl)
    plan = SweepPlan(skip=list(scan.skipped))
    for folder, key in keys.items():
        state = known.get(key) or FolderBatches(*key)
        skipped = _skip_reason(state)
        if skipped is not None:
            reason, kind = skipped
            plan.skip.append(Skip(folder.folder, reason, folder.tenant_id, kind))
            continue
        plan.start.append(
            PlannedImport(
                tenant_id=folder.tenant_id,
                folder=folder.folder,
                fingerprint=folder.fingerprint,
                idempotency_key=idempotency_key(
                    folder.scope,
                    folder.fingerprint,
                    state.latest_succeeded_id,
                    after=_abandoned_batch(state),
                ),
            )
        )
    return plan


def _abandoned_batch(state: FolderBatches) -> uuid.UUID | None:
    if state.running_id is not None:
        return state.running_id if state.running_abandoned else None
    if state.same_content_failure_kind == FailureKind.ABANDONED:
        return state.same_content_id
    return None


def _skip_reason(state: FolderBatches) -> tuple[str, str] | None:
    """(reason, kind) when the sweep must not start this content."""
    if state.running_id is not None and not state.running_abandoned:
        return f"batch {state.running_id} is running for this scope", "running"
    if (
        state.latest_succeeded_id is not None
        and state.latest_succeeded_fingerprint == state.fingerprint
        and state.latest_succeeded_contract_versions == json.loads(state.contract_versions)
    ):
        return f"already loaded by batch {state.latest_succeeded_id}", "loaded"
    if state.running_id is None and (
        state.same_content_status == "failed"
        and state.same_content_failure_kind
        not in (FailureKind.ENQUEUE_FAILED, FailureKind.ABANDONED)
    ):
        kind = state.same_content_failure_kind or "failed"
        hint = {
            FailureKind.FAILED_PUBLICATION: "run resume-publication for it",
            FailureKind.HELD: f"review it: fleet-import batches approve {state.same_content_id}",
        }.get(kind, "fix the files (new content is a new delivery) or rerun the import manually")
        return f"batch {state.same_content_id} failed ({kind}) on this content: {hint}", "failed"
    return None
