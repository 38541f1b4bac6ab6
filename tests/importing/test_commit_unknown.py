"""An unknown commit outcome (issue 26) on the fakes: a slice COMMIT that got no answer is
settled from the stamp, read back across the outage; when it still cannot be read the batch
stays running, lease released, and whoever touches it next settles it. Never failed while
its stamp owns the slice."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from fleet_import.errors import ErrorKind, WarehouseError
from fleet_import.importing.claim import settle_abandoned_batches
from fleet_import.importing.context import AlreadyLoaded, Committed, CommitUnknown, Failed
from fleet_import.importing.driver import import_folder
from fleet_import.importing.resume import resume_batch
from fleet_import.importing.settle import COMMIT_UNKNOWN_EVENT
from fleet_import.retry import Backoff
from fleet_import.scope import Tenant, source_scope
from fleet_import.store.details import FailureKind
from fleet_import.store.models import BatchStatus
from fleet_import.warehouse.base import CommitOutcomeUnknown
from tests.fakes.world import LEASE_TTL, World, memory_world

ACME = Tenant.named("acme")
LOST = "connection lost during COMMIT"


@pytest.fixture
def world(tmp_path: Path) -> World:
    world = memory_world(tmp_path)
    world.ctx.commit_readback = Backoff((0.0, 0.0, 0.0), jitter=0.0)
    return world


class Outage:
    """The warehouse's slice registry unreadable for the next `reads` reads (None: until
    `end()`)."""

    def __init__(self, world: World, reads: int | None = None) -> None:
        self.reads = reads
        self.failed = 0
        self._owner = world.warehouse.slice_owner
        world.warehouse.slice_owner = self._slice_owner  # type: ignore[method-assign]

    def _slice_owner(self, tenant_id: str, source_scope: str) -> uuid.UUID | None:
        if self.reads is None or self.failed < self.reads:
            self.failed += 1
            raise WarehouseError("could not reach the warehouse", kind=ErrorKind.TRANSIENT)
        return self._owner(tenant_id, source_scope)

    def end(self) -> None:
        self.reads = 0


def _lose_the_answer(world: World) -> None:
    world.warehouse.faults["commit_ack"] = CommitOutcomeUnknown(LOST, kind=ErrorKind.TRANSIENT)


def test_a_stamp_read_back_across_a_short_outage_settles_the_commit(world: World) -> None:
    folder = world.deliver()
    _lose_the_answer(world)
    Outage(world, reads=2)
    outcome = import_folder(world.ctx, ACME, folder, "d1")
    assert isinstance(outcome, Committed) and outcome.recovered and outcome.published
    assert world.warehouse.copies == 4  # loaded once
    assert world.event_names().count("fleet.slice.published") == 1


def _left_unknown(world: World, folder: str) -> uuid.UUID:
    _lose_the_answer(world)
    outage = Outage(world)
    outcome = import_folder(world.ctx, ACME, folder, "d1")
    assert isinstance(outcome, CommitUnknown), outcome
    batch = world.repo.get(outcome.batch_id)
    assert batch is not None and batch.status == BatchStatus.RUNNING
    assert batch.execution_lease_id is None  # released: nobody holds it
    assert LOST in batch.details["commit_unknown"]["error"]
    assert COMMIT_UNKNOWN_EVENT in world.event_names()
    outage.end()
    return outcome.batch_id


def test_a_rerun_of_the_delivery_settles_an_unknown_commit(world: World) -> None:
    folder = world.deliver()
    batch_id = _left_unknown(world, folder)
    outcome = import_folder(world.ctx, ACME, folder, "d1")
    assert isinstance(outcome, Committed) and outcome.batch_id == batch_id
    assert outcome.recovered and outcome.published
    assert world.warehouse.copies == 4
    assert world.event_names().count("fleet.slice.published") == 1


def test_another_delivery_settles_it_after_a_lease_ttl_and_loads_nothing(world: World) -> None:
    folder = world.deliver()
    batch_id = _left_unknown(world, folder)
    world.store.clock.advance(LEASE_TTL + 1)
    outcome = import_folder(world.ctx, ACME, folder, "d2")
    assert isinstance(outcome, AlreadyLoaded) and outcome.owner_batch_id == batch_id
    assert outcome.finished_abandoned  # what made the slice hold it: this takeover
    batch = world.repo.get(batch_id)
    assert batch is not None and batch.status == BatchStatus.SUCCEEDED
    assert world.warehouse.copies == 4


def test_the_drain_settles_it(world: World) -> None:
    folder = world.deliver()
    batch_id = _left_unknown(world, folder)
    world.store.clock.advance(LEASE_TTL + 1)
    settle_abandoned_batches(world.ctx, "drain-1", limit=10)
    batch = world.repo.get(batch_id)
    assert batch is not None and batch.status == BatchStatus.SUCCEEDED


def test_resume_settles_it(world: World) -> None:
    folder = world.deliver()
    batch_id = _left_unknown(world, folder)
    outcome = resume_batch(world.ctx, world.outbox, batch_id)  # type: ignore[arg-type]
    assert isinstance(outcome, Committed) and outcome.published


def test_a_drain_during_the_outage_leaves_it_running(world: World) -> None:
    folder = world.deliver()
    batch_id = _left_unknown(world, folder)
    Outage(world)  # the warehouse is gone again
    world.store.clock.advance(LEASE_TTL + 1)
    settle_abandoned_batches(world.ctx, "drain-1", limit=10)
    batch = world.repo.get(batch_id)
    assert batch is not None and batch.status == BatchStatus.RUNNING
    assert batch.execution_lease_id is None


def test_a_commit_that_did_not_go_through_is_loaded_again_in_the_same_batch(
    world: World,
) -> None:
    """The COMMIT got no answer and the stamp, read back, is not this batch's: it did not
    commit, and the load is tried again like any transient failure."""
    folder = world.deliver()
    world.warehouse.faults["commit"] = CommitOutcomeUnknown(LOST, kind=ErrorKind.TRANSIENT)
    outcome = import_folder(world.ctx, ACME, folder, "d1")
    assert isinstance(outcome, Committed) and not outcome.recovered and outcome.published


def test_resume_fails_an_unknown_commit_that_did_not_go_through(world: World) -> None:
    """Not stamped once the warehouse answers: failed before commit (the delivery may start
    a new batch)."""
    folder = world.deliver()
    batch_id = _left_unknown(world, folder)
    scope = source_scope(folder)
    world.warehouse.install((ACME.tenant_id, scope), uuid.uuid4(), {})  # another owns it now
    outcome = resume_batch(world.ctx, world.outbox, batch_id)  # type: ignore[arg-type]
    assert isinstance(outcome, Failed) and outcome.kind == FailureKind.FAILED_PRE_COMMIT
