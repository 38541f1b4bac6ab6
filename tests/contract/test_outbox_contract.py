"""The publication outbox's rules, asserted against OutboxRepository on PostgreSQL and against
the in-memory fake alike: head-first claims fenced by worker and lease, backoff, dead steps
and their reopening, the drain's pick, supersession."""

from __future__ import annotations

import pytest

from fleet_import.retry import Backoff
from fleet_import.store.details import FailureKind
from fleet_import.store.models import BatchStatus, Reserved
from fleet_import.store.outbox import ClaimLost, StepStatus
from tests.contract.batches import (
    ACME,
    PAST_SHORT_TTL,
    SCOPE,
    SHORT_TTL,
    TTL,
    StoreUnderTest,
    committed,
)

CLAIM_TTL = 30.0


_no_backoff = Backoff((0.0,))
_long_backoff = Backoff((3600.0,), jitter=0.0)


def test_steps_are_claimed_head_first_by_one_worker(store: StoreUnderTest) -> None:
    batch = committed(store)
    first = store.outbox.claim_next(batch.id, "p1", CLAIM_TTL, lease_owner="w1")
    assert first.step == "refresh" and first.status == StepStatus.CLAIMED
    assert first.claimed_by == "p1"
    assert store.outbox.claim_next(batch.id, "p2", CLAIM_TTL) is None  # head is taken
    with pytest.raises(ClaimLost):
        store.outbox.complete(first.id, "p2")
    done = store.outbox.complete(first.id, "p1")
    assert done.status == StepStatus.DONE
    second = store.outbox.claim_next(batch.id, "p1", CLAIM_TTL, lease_owner="w1")
    assert second.step == "notify"
    assert store.outbox.release(second.id, "p2") is False
    assert store.outbox.release(second.id, "p1") is True
    assert store.outbox.steps(batch.id)[1].status == StepStatus.PENDING


def test_claims_need_the_batch_lease(store: StoreUnderTest) -> None:
    batch = committed(store)
    assert store.outbox.claim_next(batch.id, "p1", CLAIM_TTL, lease_owner="other") is None
    assert store.outbox.claim_next(batch.id, "p1", CLAIM_TTL, lease_owner="w1") is not None


def test_a_new_lease_ends_the_old_holders_claims(store: StoreUnderTest) -> None:
    batch = committed(store)
    store.repo.acquire_lease(batch.id, "w1", SHORT_TTL)
    claimed = store.outbox.claim_next(batch.id, "w1", CLAIM_TTL, lease_owner="w1")
    store.wait(PAST_SHORT_TTL)
    store.repo.acquire_lease(batch.id, "w2", TTL)
    again = store.outbox.claim_next(batch.id, "w2", CLAIM_TTL, lease_owner="w2")
    assert again.id == claimed.id and again.claimed_by == "w2"
    assert again.attempts == 1 and "w1" in again.last_error  # the interrupted attempt counts
    with pytest.raises(ClaimLost):
        store.outbox.complete(claimed.id, "w1")


def test_failed_attempts_back_off_then_die(store: StoreUnderTest) -> None:
    batch = committed(store)
    step = store.outbox.claim_next(batch.id, "p1", CLAIM_TTL)
    waiting = store.outbox.fail(step.id, "p1", "boom", 3, _long_backoff)
    assert waiting.status == StepStatus.PENDING and waiting.attempts == 1
    assert waiting.last_error == "boom" and waiting.claimed_by is None
    assert store.outbox.claim_next(batch.id, "p1", CLAIM_TTL) is None  # backing off
    store.repo.release_lease(batch.id, "w1")
    assert store.outbox.batches_with_open_steps(10) == []  # nothing a drain can do now
    assert store.outbox.reopen_dead_steps(batch.id) == 1  # an explicit resume: no waiting
    step = store.outbox.claim_next(batch.id, "p1", CLAIM_TTL)
    assert step.attempts == 0
    store.outbox.fail(step.id, "p1", "again", 2, _no_backoff)
    step = store.outbox.claim_next(batch.id, "p1", CLAIM_TTL)
    dead = store.outbox.fail(step.id, "p1", "dead now", 2, _no_backoff)
    assert dead.status == StepStatus.DEAD and dead.attempts == 2
    assert store.outbox.claim_next(batch.id, "p1", CLAIM_TTL) is None
    with pytest.raises(ClaimLost):
        store.outbox.fail(step.id, "p1", "late", 2, _no_backoff)
    assert store.outbox.reopen_dead_steps(batch.id) == 1
    assert store.outbox.steps(batch.id)[0].status == StepStatus.PENDING


def test_drain_picks_committed_batches_nobody_executes(store: StoreUnderTest) -> None:
    batch = committed(store)
    assert store.outbox.batches_with_open_steps(10) == []  # its lease is alive
    store.repo.release_lease(batch.id, "w1")
    assert store.outbox.batches_with_open_steps(10) == [batch.id]
    store.repo.acquire_lease(batch.id, "w2", TTL)
    for _ in range(2):
        step = store.outbox.claim_next(batch.id, "w2", CLAIM_TTL, lease_owner="w2")
        store.outbox.complete(step.id, "w2")
    assert store.outbox.claim_next(batch.id, "w2", CLAIM_TTL) is None
    store.repo.mark_succeeded(batch.id, "w2")
    assert store.outbox.batches_with_open_steps(10) == []


def test_publication_expired_is_fenced_by_the_lease(store: StoreUnderTest) -> None:
    from fleet_import.errors import LeaseLost

    batch = committed(store)
    with pytest.raises(LeaseLost):
        store.outbox.mark_publication_expired(batch.id, "w2", "x")
    expired = store.outbox.mark_publication_expired(batch.id, "w1", "owned by another")
    assert expired.status == BatchStatus.FAILED and expired.details["publication_expired"]


def _succeed_next(store: StoreUnderTest, key: str, owner: str):
    reserved = store.repo.reserve(ACME, SCOPE, key)
    assert isinstance(reserved, Reserved)
    batch = reserved.batch
    store.repo.acquire_lease(batch.id, owner, TTL)
    store.repo.mark_committed(batch.id, owner, row_counts={}, publication_steps=["notify"])
    return batch


def test_a_later_batch_supersedes_what_it_replaced(store: StoreUnderTest) -> None:
    first = committed(store, "w1", steps=["notify"])
    step = store.outbox.claim_next(first.id, "w1", CLAIM_TTL)
    store.outbox.complete(step.id, "w1")
    store.repo.mark_succeeded(first.id, "w1")
    failed = _succeed_next(store, "d2", "w2")
    store.repo.mark_failed(failed.id, "w2", FailureKind.FAILED_PUBLICATION, "notify down")
    latest = _succeed_next(store, "d3", "w3")
    assert store.outbox.previous_batch(latest.id).id == first.id
    assert store.outbox.supersede_failed_publications(latest.id) == [failed.id]
    assert store.outbox.supersede_failed_publications(latest.id) == [failed.id]  # idempotent
    assert store.repo.get(failed.id).details["superseded_by"] == str(latest.id)
    assert [s.status for s in store.outbox.steps(failed.id)] == [StepStatus.RETIRED]
    assert store.outbox.mark_superseded(first.id, latest.id) is True
    assert store.outbox.mark_superseded(first.id, latest.id) is True  # same successor
    assert store.outbox.mark_superseded(first.id, failed.id) is False  # set once
    assert store.outbox.mark_superseded(latest.id, first.id) is False  # only by a later one
    assert store.repo.get(first.id).details["superseded_by"] == str(latest.id)
    assert store.outbox.previous_batch(latest.id).id == first.id  # still found on a retry
