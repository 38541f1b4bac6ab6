"""The driver's branches on the fakes, in seconds and with no server: claim, ScopeBusy,
duplicates, already loaded, pre-commit failure, a lost COMMIT acknowledgement, recovery
from the stamp, takeover of abandoned batches (continued or failed), publication failure
and resume, expiry, a lost lease. Only the public entry points are called (`import_folder`,
`resume_batch`, `settle_abandoned_batches`); the fakes are held to the real store and
warehouse by tests/contract."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from fleet_import.errors import ErrorKind, LeaseLost, OperationalStoreError, WarehouseError
from fleet_import.importing.claim import settle_abandoned_batches
from fleet_import.importing.context import (
    AlreadyLoaded,
    Committed,
    Failed,
    NotClaimed,
    NothingToDo,
    Skipped,
)
from fleet_import.importing.driver import CoreSteps, import_folder
from fleet_import.importing.resume import resume_batch
from fleet_import.retry import Backoff
from fleet_import.s3.delivery import DeliveryIdentity
from fleet_import.s3.sources import discover
from fleet_import.scope import Tenant, source_scope
from fleet_import.store.details import FailureKind
from fleet_import.store.models import (
    BatchStatus,
    NotResumable,
    Reserved,
)
from fleet_import.store.outbox import StepStatus
from fleet_import.warehouse.base import CommitOutcomeUnknown
from tests.fakes.s3 import client_error
from tests.fakes.world import LEASE_TTL, World, memory_world

ACME = Tenant.named("acme")
COUNTS = {"vehicles": 4, "trips": 20, "fuel_transactions": 8}
NO_WAIT = CoreSteps(1, backoff=Backoff((0.0, 0.0)))


class Died(BaseException):
    """The worker's process ends here: nothing after it runs, not even a release."""


@pytest.fixture
def world(tmp_path: Path) -> World:
    return memory_world(tmp_path)


def _abandon(world: World, folder: str, key: str, owner: str = "dead-worker") -> Reserved:
    """A batch whose executor leased it and died: its lease runs out."""
    reserved = world.repo.reserve(ACME, source_scope(folder), key)
    assert isinstance(reserved, Reserved)
    world.repo.acquire_lease(reserved.batch.id, owner, LEASE_TTL)
    world.store.clock.advance(LEASE_TTL + 1)
    return reserved


def test_a_delivery_loads_commits_and_publishes(world: World) -> None:
    folder = world.deliver()
    outcome = import_folder(world.ctx, ACME, folder, "d1")
    assert isinstance(outcome, Committed) and outcome.published, outcome
    assert outcome.row_counts == COUNTS
    scope = source_scope(folder)
    assert world.warehouse.slice_owner("acme", scope) == outcome.batch_id
    assert world.warehouse.slice_counts("acme", scope) == COUNTS
    batch = world.repo.get(outcome.batch_id)
    assert batch.status == BatchStatus.SUCCEEDED and batch.execution_lease_id is None
    assert batch.details["phase"] == "published" and batch.details["manifest"]["folder"] == folder
    steps = world.outbox.steps(outcome.batch_id)
    assert [s.status for s in steps] == [StepStatus.DONE] * 3
    assert world.event_names() == [
        "fleet.batch.reserved",
        "fleet.batch.committed",
        "fleet.slice.published",
        "fleet.batch.published",
    ]


def test_a_scope_held_by_a_live_batch_is_skipped(world: World) -> None:
    folder = world.deliver()
    holder = world.repo.reserve(ACME, source_scope(folder), "other")
    world.repo.acquire_lease(holder.batch.id, "alive", LEASE_TTL)
    before = world.repo.get(holder.batch.id)
    outcome = import_folder(world.ctx, ACME, folder, "d1")
    assert outcome == Skipped(source_scope(folder), holder.batch.id)
    assert world.repo.get(holder.batch.id) == before  # the holder is never touched
    assert world.warehouse.copies == 0 and world.events == []


def test_a_holder_that_ends_just_after_it_was_found_alive_still_skips(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen in tests/workers/test_scale.py: a sweep's import and a rerun raced for one
    abandoned batch; the loser found the winner alive, the winner finished, and the loser's
    second reservation made a new batch that loaded the same content again."""
    folder = world.deliver()
    holder = world.repo.reserve(ACME, source_scope(folder), "other")
    world.repo.acquire_lease(holder.batch.id, "alive", LEASE_TTL)
    found_alive = world.repo.take_over

    def take_over_then_the_holder_ends(batch_id, owner, ttl):  # noqa: ANN001, ANN202
        outcome = found_alive(batch_id, owner, ttl)
        world.repo.mark_failed(holder.batch.id, "alive", FailureKind.FAILED_PRE_COMMIT, "ended")
        return outcome

    monkeypatch.setattr(world.repo, "take_over", take_over_then_the_holder_ends)
    outcome = import_folder(world.ctx, ACME, folder, "d1")
    assert outcome == Skipped(source_scope(folder), holder.batch.id)
    assert world.repo.delivery_batch("acme", source_scope(folder), "d1") is None
    assert world.warehouse.copies == 0


def test_content_loaded_by_another_delivery_while_this_one_reserved_is_not_loaded_again(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two deliveries of one content: the second looked at the slice (not loaded yet), then
    the first committed and ended before the second reserved. The second's fresh batch is
    withdrawn, not run."""
    folder = world.deliver()
    reserve = world.repo.reserve
    first: list[Committed] = []
    copies: list[int] = []

    def the_other_delivery_ends_first(tenant, scope, key, *args, **kwargs):  # noqa: ANN001, ANN202
        if key == "d2" and not first:
            first.append(import_folder(world.ctx, ACME, folder, "d1"))
            copies.append(world.warehouse.copies)
        return reserve(tenant, scope, key, *args, **kwargs)

    monkeypatch.setattr(world.repo, "reserve", the_other_delivery_ends_first)
    outcome = import_folder(world.ctx, ACME, folder, "d2")
    assert isinstance(first[0], Committed) and first[0].published
    assert outcome == AlreadyLoaded(source_scope(folder), first[0].batch_id)
    assert [batch.id for batch in world.repo.list()] == [first[0].batch_id]
    assert world.warehouse.copies == copies[0]  # d2 copied nothing
    assert world.event_names().count("fleet.batch.reserved") == 1
    assert world.event_names()[-1] == "fleet.delivery.already_loaded"
    again = import_folder(world.ctx, ACME, folder, "d2")  # its retry: the same answer
    assert again == outcome


def test_a_duplicate_delivery_waits_for_or_skips_its_batch(world: World) -> None:
    folder = world.deliver()
    running = world.repo.reserve(ACME, source_scope(folder), "d1")
    world.repo.acquire_lease(running.batch.id, "alive", LEASE_TTL)
    busy = import_folder(world.ctx, ACME, folder, "d1")
    assert isinstance(busy, NotClaimed) and busy.holder == "alive"
    world.repo.release_lease(running.batch.id, "alive")
    done = import_folder(world.ctx, ACME, folder, "d1")
    assert isinstance(done, Committed) and done.batch_id == running.batch.id
    again = import_folder(world.ctx, ACME, folder, "d1")  # a retry of a success
    assert again == NothingToDo(running.batch.id, "succeeded")


def test_same_content_is_already_loaded_unless_forced(world: World) -> None:
    folder = world.deliver()
    first = import_folder(world.ctx, ACME, folder, "d1")
    copies = world.warehouse.copies
    loaded = import_folder(world.ctx, ACME, folder, "d2")
    assert loaded == AlreadyLoaded(source_scope(folder), first.batch_id)
    assert world.warehouse.copies == copies and len(world.repo.list()) == 1
    forced = import_folder(world.ctx, ACME, folder, "d3", force=True)
    assert isinstance(forced, Committed) and forced.batch_id != first.batch_id
    assert forced.summary["cache_hits"] == len(forced.summary["files"]) == 4
    assert world.repo.get(first.batch_id).details["superseded_by"] == str(forced.batch_id)


def test_an_empty_folder_fails_before_commit_and_frees_the_scope(world: World) -> None:
    folder = world.deliver(files={})
    outcome = import_folder(world.ctx, ACME, folder, "d1")
    assert isinstance(outcome, Failed) and outcome.kind == FailureKind.FAILED_PRE_COMMIT
    assert "is empty" in outcome.error and not outcome.resumable
    batch = world.repo.get(outcome.batch_id)
    assert batch.status == BatchStatus.FAILED and batch.details["failure"]["kind"] == (
        "failed_pre_commit"
    )
    assert world.event_names() == ["fleet.batch.reserved", "fleet.batch.failed"]
    assert world.warehouse.slice_owner("acme", source_scope(folder)) is None
    assert isinstance(world.repo.reserve(ACME, source_scope(folder), "d2"), Reserved)


def test_an_s3_error_botocore_gave_up_on_is_not_retried_again(world: World) -> None:
    """botocore is S3's one retry layer (s3.client): a SlowDown that reaches the driver has
    had its retries, so the step runner fails the batch at once (the throttle botocore
    rides out is tests/faults/test_s3_matrix.py's)."""
    folder = world.deliver()
    world.s3.faults["ListObjectsV2"] = client_error("SlowDown", 503, "ListObjectsV2")
    outcome = import_folder(world.ctx, ACME, folder, "d1", steps=NO_WAIT)
    assert isinstance(outcome, Failed) and outcome.kind == FailureKind.FAILED_PRE_COMMIT
    assert "SlowDown" in outcome.error and "after retries" in outcome.error
    assert "ListObjectsV2" not in world.s3.faults  # raised once, and the listing not tried again
    assert world.warehouse.slice_owner("acme", source_scope(folder)) is None


def test_a_transient_error_of_another_dependency_is_retried_by_the_step(world: World) -> None:
    folder = world.deliver()
    world.store.faults["update_details"] = OperationalStoreError("reset", kind=ErrorKind.TRANSIENT)
    outcome = import_folder(world.ctx, ACME, folder, "d1", steps=NO_WAIT)
    assert isinstance(outcome, Committed) and outcome.published


def test_a_failed_commit_leaves_no_slice(world: World) -> None:
    folder = world.deliver()
    world.warehouse.faults["commit"] = WarehouseError("disk full")
    outcome = import_folder(world.ctx, ACME, folder, "d1")
    assert isinstance(outcome, Failed) and outcome.kind == FailureKind.FAILED_PRE_COMMIT
    assert "disk full" in outcome.error
    assert world.warehouse.slice_owner("acme", source_scope(folder)) is None


def test_a_lost_commit_acknowledgement_is_settled_by_the_stamp(world: World) -> None:
    folder = world.deliver()
    lost = CommitOutcomeUnknown("connection lost during COMMIT", kind=ErrorKind.TRANSIENT)
    world.warehouse.faults["commit_ack"] = lost
    outcome = import_folder(world.ctx, ACME, folder, "d1")
    assert isinstance(outcome, Committed) and outcome.recovered and outcome.published
    assert world.warehouse.copies == 4  # the slice was not loaded again
    assert world.warehouse.slice_owner("acme", source_scope(folder)) == outcome.batch_id


def test_a_failed_operational_commit_is_recovered_from_the_stamp(world: World) -> None:
    folder = world.deliver()
    world.store.faults["mark_committed"] = OperationalStoreError("connection reset")
    outcome = import_folder(world.ctx, ACME, folder, "d1")
    assert isinstance(outcome, Committed) and outcome.recovered and outcome.published
    batch = world.repo.get(outcome.batch_id)
    assert batch.status == BatchStatus.SUCCEEDED
    assert batch.details["summary"]["recovered_from_stamp"] is True
    assert batch.details["row_counts"] == COUNTS


def test_a_rerun_after_a_death_between_the_commits_only_records_and_publishes(
    world: World,
) -> None:
    folder = world.deliver()
    world.store.faults["mark_committed"] = Died()
    world.store.faults["release_lease"] = Died()
    with pytest.raises(Died):
        import_folder(world.ctx, ACME, folder, "d1")
    (batch,) = world.repo.list()
    assert batch.status == BatchStatus.RUNNING and batch.execution_lease_id is not None
    copies = world.warehouse.copies
    held = import_folder(world.ctx, ACME, folder, "d1")  # its lease has not run out yet
    assert isinstance(held, NotClaimed)
    world.store.clock.advance(LEASE_TTL + 1)
    rerun = import_folder(world.ctx, ACME, folder, "d1")
    assert isinstance(rerun, Committed) and rerun.batch_id == batch.id
    assert rerun.recovered and rerun.published and world.warehouse.copies == copies
    assert "fleet.batch.taken_over" in world.event_names()


def test_an_abandoned_batch_of_other_content_is_failed_and_replaced(world: World) -> None:
    folder = world.deliver()
    dead = _abandon(world, folder, "old")
    world.repo.update_details(dead.batch.id, "dead-worker", {"manifest": {"fingerprint": "x"}})
    outcome = import_folder(world.ctx, ACME, folder, "d1", owner="new-worker")
    assert isinstance(outcome, Committed) and outcome.batch_id != dead.batch.id
    failed = world.repo.get(dead.batch.id)
    assert failed.status == BatchStatus.FAILED
    assert failed.details["failure"]["kind"] == "abandoned"
    assert failed.details["failure"]["previous_owner"] == "dead-worker"
    taken = [p for name, p in world.events if name == "fleet.batch.taken_over"]
    assert taken[0]["previous_owner"] == "dead-worker" and taken[0]["owner"] == "new-worker"


def test_an_abandoned_batch_of_the_same_content_is_continued(world: World) -> None:
    folder = world.deliver()
    listing = discover(world.s3, folder, world.ctx.contracts)  # what the dead worker saw
    dead = _abandon(world, folder, "old")
    seen = DeliveryIdentity.of(listing, world.ctx.contracts)  # recorded with the manifest
    world.repo.update_details(
        dead.batch.id,
        "dead-worker",
        {"manifest": listing.to_json(), "contract_versions": seen.versions},
    )
    outcome = import_folder(world.ctx, ACME, folder, "d2")
    assert isinstance(outcome, Committed) and outcome.batch_id == dead.batch.id
    assert world.repo.get(dead.batch.id).status == BatchStatus.SUCCEEDED
    assert len(world.repo.list()) == 1


def test_the_drain_settles_abandoned_batches(world: World) -> None:
    folder = world.deliver()
    dead = _abandon(world, folder, "old")
    outcomes = settle_abandoned_batches(world.ctx, "drain", limit=10)
    assert [(o.batch_id, o.kind) for o in outcomes] == [(dead.batch.id, FailureKind.ABANDONED)]
    assert world.repo.get(dead.batch.id).status == BatchStatus.FAILED
    assert settle_abandoned_batches(world.ctx, "drain", limit=10) == []


def test_a_failed_publication_is_resumed_without_reloading(tmp_path: Path) -> None:
    broken = {"down": True}

    def notify(step_ctx) -> None:
        if broken["down"]:
            raise RuntimeError("downstream is down")

    world = memory_world(tmp_path, max_attempts=1)  # one attempt, then the step is dead
    folder = world.deliver()
    world.publisher.steps["notify"] = notify
    outcome = import_folder(world.ctx, ACME, folder, "d1")
    assert isinstance(outcome, Failed) and outcome.resumable, outcome
    assert outcome.kind == FailureKind.FAILED_PUBLICATION
    copies = world.warehouse.copies
    broken["down"] = False
    resumed = resume_batch(world.ctx, world.outbox, outcome.batch_id)
    assert isinstance(resumed, Committed) and resumed.published
    assert world.warehouse.copies == copies
    batch = world.repo.get(outcome.batch_id)
    assert batch.status == BatchStatus.SUCCEEDED and batch.details["resumes"] == 1


def test_a_superseded_failed_publication_is_not_resumed(tmp_path: Path) -> None:
    world = memory_world(tmp_path, max_attempts=1)
    folder = world.deliver()
    world.publisher.steps["notify"] = _fail
    failed = import_folder(world.ctx, ACME, folder, "d1")
    assert isinstance(failed, Failed) and failed.resumable
    world.publisher.steps["notify"] = lambda step_ctx: None
    newer = import_folder(world.ctx, ACME, folder, "d2", force=True)
    assert isinstance(newer, Committed) and newer.published
    refused = resume_batch(world.ctx, world.outbox, failed.batch_id)
    assert isinstance(refused, NotResumable) and "superseded" in refused.reason


def test_publication_expires_when_the_stamp_changes_between_steps(world: World) -> None:
    folder = world.deliver()
    scope = source_scope(folder)

    def refresh(step_ctx) -> None:  # another batch commits the slice meanwhile
        other = world.warehouse.rows[("acme", scope)]
        tables = {name: (name, table) for name, table in other.items()}
        world.warehouse.install(("acme", scope), uuid.UUID(int=1), tables)

    world.publisher.steps["refresh_dependants"] = refresh
    outcome = import_folder(world.ctx, ACME, folder, "d1")
    assert isinstance(outcome, Failed) and outcome.expired and not outcome.resumable
    batch = world.repo.get(outcome.batch_id)
    assert batch.status == BatchStatus.FAILED and batch.details["publication_expired"] is True


def test_a_worker_whose_lease_was_taken_stops(world: World) -> None:
    folder = world.deliver()

    def refresh(step_ctx) -> None:  # frozen past its lease; another worker takes over
        world.store.clock.advance(LEASE_TTL + 1)
        world.repo.acquire_lease(step_ctx.batch.id, "successor", LEASE_TTL)

    world.publisher.steps["refresh_dependants"] = refresh
    with pytest.raises(LeaseLost):
        import_folder(world.ctx, ACME, folder, "d1")
    (batch,) = world.repo.list()
    assert batch.status == BatchStatus.RUNNING and batch.execution_lease_id == "successor"


def _fail(step_ctx) -> None:
    raise RuntimeError("downstream is down")
