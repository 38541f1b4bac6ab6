"""Steps 1-2 of the import: reserve the scope and lease the batch, taking over a batch
whose executor died or froze (an abandoned batch).

A running batch whose lease expired (or that nobody leased for a lease TTL) is abandoned.
Whoever meets it next takes it over, fenced like any takeover: the next delivery of its
scope, or the drain. Before anything else the taker ends the warehouse session the old
holder recorded, so a frozen holder neither keeps its locks nor commits later. Then:
committed (recorded, or stamped in the warehouse) -> its publication is finished; not
committed -> continued by a delivery of the same content, else failed as `abandoned`
(recorded with the old owner), and the scope is free for the new delivery.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import time
import uuid

from fleet_import import failpoints
from fleet_import.errors import FleetImportError
from fleet_import.importing.context import (
    AlreadyLoaded,
    Claimed,
    Committed,
    ImportContext,
    ImportOutcome,
    NotClaimed,
    NothingToDo,
    Skipped,
)
from fleet_import.importing.drift import with_effective_contracts
from fleet_import.importing.leased_batch import LeasedBatch, Stamp, read_stamp
from fleet_import.importing.settle import StampUnreadable, leave_unsettled, recover_committed
from fleet_import.publication.events import event_payload
from fleet_import.publication.outcomes import PublicationRefused
from fleet_import.publication.publisher import DRAIN
from fleet_import.publication.refusal import refusal_of, refuse_publication
from fleet_import.s3.delivery import DeliveryIdentity
from fleet_import.s3.sources import discover
from fleet_import.scope import Tenant, folder_of_scope
from fleet_import.store.details import FailureKind
from fleet_import.store.heartbeat import leased
from fleet_import.store.models import (
    Batch,
    BatchNotRunning,
    BatchStatus,
    LeaseAcquired,
    LeaseHeld,
    Reserved,
    ScopeBusy,
)
from fleet_import.tenants.binding import Admission
from fleet_import.warehouse.base import WarehouseSession
from fleet_import.warehouse.shape import TableMigrationNeeded

log = logging.getLogger(__name__)

TAKEN_OVER_EVENT = "fleet.batch.taken_over"
_UNREAD = object()  # the slice registry could not be read (or was not: a forced load)


def new_owner() -> str:
    """A lease owner unique to this acquisition, readable in `batches list`."""
    return f"{socket.gethostname()[:40]}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


def claim(
    ctx: ImportContext,
    tenant: Tenant,
    scope: str,
    delivery_key: str,
    owner: str,
    *,
    force: bool = False,
) -> Claimed | Skipped | NotClaimed | NothingToDo | AlreadyLoaded:
    """Reserve the scope (or continue this delivery's batch), then its lease. A scope held
    by an abandoned batch is taken over first. Content the slice already holds is not
    loaded again unless `force`. First of all, the tenant's curated tables must hold the
    contracts' shapes (else TableMigrationNeeded, naming `fleet-import tables migrate`):
    a batch is never reserved for a load that cannot commit."""
    # Content is read with the tables' evolved columns, as the batch will (importing.drift).
    ctx = with_effective_contracts(ctx, tenant.tenant_id)
    _check_tables(ctx, tenant)
    seen: Batch | None | object = _UNREAD
    if not force:
        seen = slice_owner_batch(ctx, tenant, scope)
        loaded = already_loaded(ctx, tenant, scope, delivery_key, seen)
        if loaded is not None:
            return loaded
    reserved = ctx.repo.reserve(tenant, scope, delivery_key)
    if isinstance(reserved, ScopeBusy):
        continued = _take_over_holder(ctx, reserved.holder_batch_id, owner)
        if isinstance(continued, Claimed):
            return continued
        if continued is None:
            # The holder is alive. Reserving again would succeed only if it ended meanwhile,
            # and then load again the content it may just have committed (seen in
            # tests/workers/test_scale.py: a sweep's import and a rerun raced for one
            # abandoned batch, and the loser reserved a new batch for the winner's content).
            return Skipped(scope, reserved.holder_batch_id)
        if isinstance(continued, Committed) and not force:
            # The holder was just settled from its stamp, perhaps with this very content.
            seen = slice_owner_batch(ctx, tenant, scope)
            loaded = already_loaded(ctx, tenant, scope, delivery_key, seen)
            if loaded is not None:
                finished = loaded.owner_batch_id == continued.batch_id
                return dataclasses.replace(loaded, finished_abandoned=finished)
        reserved = ctx.repo.reserve(tenant, scope, delivery_key)
        if isinstance(reserved, ScopeBusy):
            return Skipped(scope, reserved.holder_batch_id)
    batch = reserved.batch
    failpoints.hit("after_reserve")
    sent = time.monotonic()
    lease = ctx.repo.acquire_lease(batch.id, owner, ctx.lease_ttl)
    if isinstance(lease, LeaseHeld):
        return NotClaimed(batch.id, lease.owner, lease.expires_at)
    if isinstance(lease, BatchNotRunning):
        return NothingToDo(batch.id, str(lease.status))
    if isinstance(reserved, Reserved):
        if not force:
            loaded = _loaded_meanwhile(ctx, tenant, scope, delivery_key, seen, batch.id, owner)
            if loaded is not None:
                return loaded
        ctx.events(
            "fleet.batch.reserved",
            event_payload(tenant.tenant_id, scope, batch.id, delivery_key=delivery_key),
        )
    if lease.previous_owner is not None:  # this delivery's own batch, after its executor died
        _taken_over(ctx, batch.id, owner, lease.previous_owner)
    failpoints.hit("after_lease")
    return Claimed(batch.id, scope, owner, lease_confirmed_at=sent)


def _take_over_holder(
    ctx: ImportContext, holder_id: uuid.UUID, owner: str
) -> Claimed | ImportOutcome | PublicationRefused | None:
    """Settle the scope's holder if it is abandoned. Claimed: a delivery of the same content
    continues it (the lease is ours now, the caller runs it); None: the holder is alive;
    otherwise how it was settled (the scope is free again, unless it stays unsettled)."""
    sent = time.monotonic()
    lease = ctx.repo.take_over(holder_id, owner, ctx.lease_ttl)
    if not isinstance(lease, LeaseAcquired):
        return None
    batch = _taken_over(ctx, holder_id, owner, lease.previous_owner)
    if not _committed(ctx, batch) and _same_content(ctx, batch):
        log.warning("batch %s continues under %s: same content", holder_id, owner)
        assert batch.source_scope is not None
        return Claimed(holder_id, batch.source_scope, owner, lease_confirmed_at=sent)
    with leased(ctx.repo, holder_id, owner, ctx.lease_ttl, confirmed_at=sent) as heartbeat:
        # The delivery taking it over was admitted for this very tenant and scope.
        held = LeasedBatch.of(ctx, batch, owner).holding(heartbeat)
        return _settle_abandoned(held, lease.previous_owner, None)


def _settle_abandoned(
    batch: LeasedBatch, previous_owner: str | None, admission: Admission | None
) -> ImportOutcome | PublicationRefused:
    """A taken-over batch that is not continued: its publication finished if it committed
    (or refused, as the drain refuses it, when its tenant is refused now), else failed as
    abandoned, with the old owner on record. One that may have committed and whose stamp
    cannot be read stays running, for the next taker."""
    try:
        committed = recover_committed(batch)
    except StampUnreadable as exc:
        return leave_unsettled(batch, exc)
    if committed is not None:
        refusal = refusal_of(batch.read(), admission)
        if refusal is not None:
            ctx = batch.ctx
            return refuse_publication(
                ctx.repo, ctx.events, batch.batch_id, batch.owner, refusal, DRAIN
            )
        return batch.publish(committed)
    error = (
        f"abandoned before commit: its executor {previous_owner or '(none)'} stopped "
        f"renewing its lease; taken over by {batch.owner}"
    )
    return batch.fail(FailureKind.ABANDONED, error, {"previous_owner": previous_owner})


def settle_abandoned_batches(
    ctx: ImportContext, owner: str, limit: int, *, admission: Admission | None = None
) -> list[ImportOutcome | PublicationRefused]:
    """The drain's part: take over and settle running batches that never recorded a commit
    and whose executor is gone, so no scope waits for a delivery that may never come.
    `admission`: the tenant rule a recovered commit's publication must pass first."""
    outcomes: list[ImportOutcome | PublicationRefused] = []
    for batch_id in ctx.repo.abandoned_uncommitted(ctx.lease_ttl, limit):
        sent = time.monotonic()  # ending the old session may take a while: fence from here
        lease = ctx.repo.take_over(batch_id, owner, ctx.lease_ttl)
        if not isinstance(lease, LeaseAcquired):
            continue  # renewed, finished or taken by another meanwhile
        try:
            batch = _taken_over(ctx, batch_id, owner, lease.previous_owner)
            with leased(ctx.repo, batch_id, owner, ctx.lease_ttl, confirmed_at=sent) as heartbeat:
                leased_batch = LeasedBatch.of(ctx, batch, owner).holding(heartbeat)
                outcomes.append(_settle_abandoned(leased_batch, lease.previous_owner, admission))
        except FleetImportError as exc:  # the next drain tries again
            log.warning("could not settle abandoned batch %s: %s", batch_id, exc)
    return outcomes


def _taken_over(
    ctx: ImportContext, batch_id: uuid.UUID, owner: str, previous_owner: str | None
) -> Batch:
    """End the warehouse session the old holder recorded (read after our takeover: it can
    record no other now), and say so."""
    batch = ctx.repo.get(batch_id)
    assert batch is not None
    session = WarehouseSession.from_json(batch.record.warehouse_session)
    ended = False
    if session is not None:
        try:
            ended = ctx.warehouse.end_session(session)
        except FleetImportError as exc:  # no right to signal it: its locks outlive it
            log.warning("could not end session %s of batch %s: %s", session, batch_id, exc)
    log.warning(
        "took over batch %s from %s (its lease had expired)%s",
        batch_id,
        previous_owner,
        f"; ended its warehouse session {session.pid}" if ended else "",
    )
    ctx.events(
        TAKEN_OVER_EVENT,
        event_payload(
            batch.tenant_id,
            batch.source_scope,
            batch_id,
            previous_owner=previous_owner,
            owner=owner,
            ended_warehouse_session=ended,
        ),
    )
    return batch


def _committed(ctx: ImportContext, batch: Batch) -> bool:
    """Recorded as committed, or its slice already carries its stamp (died in between)."""
    if batch.record.warehouse_committed:
        return True
    if batch.source_scope is None:
        return False
    stamp = read_stamp(ctx.warehouse, batch.tenant_id, batch.source_scope, batch.id)
    # UNKNOWN: not known to be committed; whoever settles it reads the stamp back
    # (settle.recover_committed) and leaves it running if it still cannot.
    return stamp is Stamp.STAMPED


def _same_content(ctx: ImportContext, batch: Batch) -> bool:
    """Whether the folder still holds what the abandoned batch listed (DeliveryIdentity:
    the same files, read with the same contract versions)."""
    recorded = DeliveryIdentity.recorded(batch.record.manifest, batch.record.contract_versions)
    if recorded is None or batch.source_scope is None:
        return False
    try:
        listing = discover(ctx.s3, folder_of_scope(batch.source_scope), ctx.contracts)
    except FleetImportError:
        return False
    return DeliveryIdentity.of(listing, ctx.contracts) == recorded


def _check_tables(ctx: ImportContext, tenant: Tenant) -> None:
    """A table in another shape stops the delivery here; any other warehouse error is left
    to the load to report, as before (the operational database is asked first)."""
    try:
        ctx.warehouse.check_tables(tenant.tenant_id, ctx.contracts.values())
    except TableMigrationNeeded:
        raise
    except FleetImportError as exc:
        log.debug("curated tables not checked before reserving: %s", exc)


def _slice_owner_id(ctx: ImportContext, tenant: Tenant, scope: str) -> uuid.UUID | None | object:
    """The batch id the slice registry names for the scope, None, or _UNREAD."""
    try:
        return ctx.warehouse.slice_owner(tenant.tenant_id, scope)
    except FleetImportError:
        return _UNREAD  # the load itself will say what is wrong


def slice_owner_batch(ctx: ImportContext, tenant: Tenant, scope: str) -> Batch | None | object:
    """The batch the slice registry names for the scope, as the store has it now."""
    owner_id = _slice_owner_id(ctx, tenant, scope)
    return ctx.repo.get(owner_id) if isinstance(owner_id, uuid.UUID) else owner_id


def already_loaded(
    ctx: ImportContext,
    tenant: Tenant,
    scope: str,
    delivery_key: str,
    owner: Batch | None | object,
    *,
    own_batch: uuid.UUID | None = None,
) -> AlreadyLoaded | None:
    """The slice's `owner`, when it succeeded with exactly the content the folder holds now
    (manifest fingerprint and contract versions): then a new delivery has nothing to do.
    Costs a registry read and one listing, before any row is written. A delivery that made
    a batch already (a duplicate, a rerun; `own_batch` aside) goes its usual way."""
    if not isinstance(owner, Batch):
        return None
    if owner.status != BatchStatus.SUCCEEDED or owner.delivery_key == delivery_key:
        return None
    earlier = ctx.repo.delivery_batch(tenant.tenant_id, scope, delivery_key)
    if earlier is not None and earlier.id != own_batch:
        return None
    try:
        manifest = discover(ctx.s3, folder_of_scope(scope), ctx.contracts)
    except FleetImportError:
        return None
    if DeliveryIdentity.recorded(
        owner.record.manifest, owner.record.contract_versions
    ) != DeliveryIdentity.of(manifest, ctx.contracts):
        return None
    ctx.events(
        "fleet.delivery.already_loaded",
        event_payload(tenant.tenant_id, scope, owner.id, delivery_key=delivery_key),
    )
    return AlreadyLoaded(scope, owner.id)


def _loaded_meanwhile(
    ctx: ImportContext,
    tenant: Tenant,
    scope: str,
    delivery_key: str,
    seen: Batch | None | object,
    batch_id: uuid.UUID,
    owner: str,
) -> AlreadyLoaded | None:
    """Whether a batch that ended between the first look and our reservation loaded this
    very content (two deliveries of one content racing); then our fresh batch, leased and
    untouched, is withdrawn, not run. Costs one registry read when the slice's owner is the
    succeeded batch seen before (a success stays one), or when nothing owns the slice."""
    owner_id = _slice_owner_id(ctx, tenant, scope)
    if not isinstance(owner_id, uuid.UUID):
        return None
    if isinstance(seen, Batch) and seen.id == owner_id and seen.status == BatchStatus.SUCCEEDED:
        return None
    now = ctx.repo.get(owner_id)
    loaded = already_loaded(ctx, tenant, scope, delivery_key, now, own_batch=batch_id)
    if loaded is not None and not ctx.repo.withdraw(batch_id, owner):
        return None  # our lease was lost meanwhile: the run goes on and its lease check stops it
    return loaded
