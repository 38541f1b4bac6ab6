"""The review side of the operational store, asserted against ReviewRepository on PostgreSQL
and against the in-memory fake alike: a held batch decided once (and by an approval's
commit), the held list, what later deliveries say of a held batch, what the retention keeps
and what a default rollback may load."""

from __future__ import annotations

import uuid

from fleet_import.store.batch_state import HeldSince
from fleet_import.store.details import FailureKind
from fleet_import.store.models import BatchStatus
from tests.contract.batches import OTHER_SCOPE, StoreUnderTest, leased

CONTENT = {"fingerprint": "f1", "contract_versions": {"trips": "v1"}}


def _held(store: StoreUnderTest, key: str, content=CONTENT, scope: str | None = None):
    batch = leased(store, "w-" + key, key, *(() if scope is None else (scope,)))
    facts = {"held": {"content": content, "reasons": ["trips shrank"]}}
    return store.repo.mark_failed(batch.id, "w-" + key, FailureKind.HELD, "held", facts).id


def _succeeded(
    store: StoreUnderTest, key: str, fingerprint: str = "f1", extra: dict | None = None
) -> uuid.UUID:
    """A success that listed the folder (its manifest's fingerprint) with CONTENT's
    contract versions, and `extra` details (what a rollback or approval records)."""
    owner = "w-" + key
    batch = leased(store, owner, key)
    details = {
        "manifest": {"fingerprint": fingerprint},
        "contract_versions": CONTENT["contract_versions"],
        **(extra or {}),
    }
    store.repo.update_details(batch.id, owner, details)
    store.repo.mark_committed(batch.id, owner, row_counts={"trips": 3})
    store.repo.mark_succeeded(batch.id, owner)
    return batch.id


def test_a_held_batch_is_decided_once(store: StoreUnderTest) -> None:
    held = _held(store, "d1")
    rejected = store.reviews.record_review(held, "rejected", facts={"note": "resent Monday"})
    assert rejected is not None and rejected.status == BatchStatus.FAILED
    review = rejected.details["review"]
    assert review["decision"] == "rejected" and review["note"] == "resent Monday"
    assert review["batch_id"] is None and review["at"].endswith("Z")
    assert store.reviews.record_review(held, "approved", uuid.uuid4()) is None
    # The same decision again is no new decision, only recorded anew.
    again = store.reviews.record_review(held, "rejected")
    assert again is not None and again.details["review"]["decision"] == "rejected"
    assert store.reviews.record_review(uuid.uuid4(), "rejected") is None
    running = leased(store, "w2", "d2", OTHER_SCOPE)
    assert store.reviews.record_review(running.id, "rejected") is None
    assert store.repo.get(running.id).details.get("review") is None


def test_an_approval_is_recorded_by_its_batch_and_by_no_other(store: StoreUnderTest) -> None:
    held = _held(store, "d1")
    approval = leased(store, "w2", f"approve:{held}")
    store.repo.update_details(approval.id, "w2", {"approves": str(held)})
    assert store.reviews.record_review(held, "approved", uuid.uuid4()) is not None
    # Decided meanwhile by another approval: this batch's commit leaves the decision alone.
    store.repo.mark_committed(approval.id, "w2", row_counts={"trips": 3})
    assert store.repo.get(held).details["review"]["batch_id"] != str(approval.id)
    store.repo.mark_succeeded(approval.id, "w2")

    second = _held(store, "d3")
    approval = leased(store, "w4", f"approve:{second}")
    store.repo.update_details(approval.id, "w4", {"approves": str(second)})
    store.repo.mark_committed(approval.id, "w4", row_counts={"trips": 3})
    review = store.repo.get(second).details["review"]
    assert review["decision"] == "approved" and review["batch_id"] == str(approval.id)
    # The commit recorded again (recovered from the stamp) is the same decision.
    store.repo.mark_committed(approval.id, "w4", row_counts={"trips": 3})
    assert store.reviews.record_review(second, "approved", approval.id) is not None
    assert store.reviews.record_review(second, "rejected") is None


def test_the_held_list_is_what_waits_for_review_newest_first(store: StoreUnderTest) -> None:
    first = _held(store, "d1")
    decided = _held(store, "d2")
    store.reviews.record_review(decided, "rejected")
    other_scope = _held(store, "d3", scope=OTHER_SCOPE)
    last = _held(store, "d4")
    assert [b.id for b in store.reviews.held_batches()] == [last, other_scope, first]
    assert [b.id for b in store.reviews.held_batches("acme", limit=2)] == [last, other_scope]
    assert store.reviews.held_batches("globex") == []


def test_what_later_deliveries_say_of_a_held_batch(store: StoreUnderTest) -> None:
    held, other_held, unknown = _held(store, "d1"), _held(store, "d2"), uuid.uuid4()
    assert store.reviews.held_since([held, other_held, unknown]) == {}
    approval = leased(store, "w3", f"approve:{held}")  # its own approval does not count
    store.repo.update_details(approval.id, "w3", {"manifest": {"fingerprint": "f9"}})
    store.repo.mark_failed(approval.id, "w3", FailureKind.FAILED_PRE_COMMIT, "x")
    assert store.reviews.held_since([held, other_held]) == {
        other_held: HeldSince(approval.id, False, False)
    }
    overtaking = _succeeded(store, "d4", "f1")  # the held content, loaded
    assert store.reviews.held_since([held, held, unknown]) == {
        held: HeldSince(overtaking, True, True)
    }
    unlisted = leased(store, "w5", "d5")  # listed nothing yet: says nothing
    store.repo.mark_failed(unlisted.id, "w5", FailureKind.FAILED_PRE_COMMIT, "x")
    later = leased(store, "w6", "d6")  # saw other files, still running
    store.repo.update_details(later.id, "w6", {"manifest": {"fingerprint": "f2"}})
    stale = HeldSince(later.id, False, False)
    assert store.reviews.held_since([held, other_held]) == {held: stale, other_held: stale}
    assert store.reviews.held_since([]) == {}


def test_the_retention_keeps_recent_successes_and_later_held_batches(
    store: StoreUnderTest,
) -> None:
    oldest, previous = _succeeded(store, "d1"), _succeeded(store, "d2")
    _held(store, "d3")  # held before the publishing batch: overtaken or stale by now
    publishing = leased(store, "w4", "d4")
    store.repo.mark_committed(publishing.id, "w4", row_counts={"trips": 3})
    store.repo.mark_succeeded(publishing.id, "w4")
    waiting, decided = _held(store, "d5"), _held(store, "d6")
    store.reviews.record_review(decided, "rejected")
    _held(store, "d7", scope=OTHER_SCOPE)

    def kept(seconds: float, count: int = 1) -> list[uuid.UUID]:
        return [b.id for b in store.reviews.retained_batches(publishing.id, seconds, count)]

    assert kept(3600) == [waiting, previous, oldest]
    assert kept(0) == [waiting, previous]  # the previous success, however old
    assert kept(0, 2) == [waiting, previous, oldest]
    assert kept(0, 0) == [waiting]
    assert store.reviews.retained_batches(uuid.uuid4(), 3600) == []


def test_a_default_rollback_never_goes_back_to_what_a_rollback_removed(
    store: StoreUnderTest,
) -> None:
    first, second = _succeeded(store, "d1"), _succeeded(store, "d2")
    scope = store.repo.get(first).source_scope

    def candidates(owner: uuid.UUID | None, limit: int = 20) -> list[uuid.UUID]:
        return [b.id for b in store.reviews.rollback_candidates("acme", scope, owner, limit)]

    assert candidates(second) == [first]
    assert candidates(None) == [second, first]
    assert candidates(None, limit=1) == [second]
    # A rollback of second's slice to first: second's content is removed, first's shown.
    rollback = _succeeded(
        store, "r1", extra={"rolled_back_to": str(first), "rollback_replaced": str(second)}
    )
    assert candidates(rollback) == []
    third = _succeeded(store, "d3")
    assert candidates(third) == [rollback, first]  # first's content, twice; second's never
    failed = leased(store, "w9", "r2")  # a rollback that did not succeed removed nothing
    store.repo.update_details(
        failed.id, "w9", {"rolled_back_to": str(second), "rollback_replaced": str(third)}
    )
    store.repo.mark_failed(failed.id, "w9", FailureKind.FAILED_PRE_COMMIT, "x")
    assert candidates(None) == [third, rollback, first]
    assert store.reviews.rollback_candidates("globex", scope, None) == []


def test_a_rollback_to_a_rollback_shows_the_content_that_one_loaded(
    store: StoreUnderTest,
) -> None:
    """Content is followed through rollbacks to rollbacks: a slice rolled back to a batch
    that was itself a rollback shows the content that batch loaded, and no batch of that
    content is a candidate (one level only chose `first` again: the same rows, reloaded)."""
    first, second = _succeeded(store, "d1"), _succeeded(store, "d2")
    scope = store.repo.get(first).source_scope

    def candidates(owner: uuid.UUID) -> list[uuid.UUID]:
        return [b.id for b in store.reviews.rollback_candidates("acme", scope, owner)]

    back = _succeeded(
        store, "r1", extra={"rolled_back_to": str(first), "rollback_replaced": str(second)}
    )
    third = _succeeded(store, "d3")
    again = _succeeded(
        store, "r2", extra={"rolled_back_to": str(back), "rollback_replaced": str(third)}
    )
    assert candidates(again) == []
    fourth = _succeeded(store, "d4")
    assert candidates(fourth) == [again, back, first]
