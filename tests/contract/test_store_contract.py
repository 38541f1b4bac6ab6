"""The operational store's rules, asserted against BatchRepository on PostgreSQL and against
the in-memory fake alike (tests/contract/conftest.py): reservation, leases and takeover,
fenced transitions, the commit with its outbox, resume."""

from __future__ import annotations

import uuid

import pytest

from fleet_import.errors import InvalidInput, LeaseLost
from fleet_import.store.details import FailureKind
from fleet_import.store.models import (
    BatchNotRunning,
    BatchStatus,
    CachedFile,
    ContinueExisting,
    LeaseAcquired,
    LeaseHeld,
    NotResumable,
    Reserved,
    Resumed,
    ScopeBusy,
    SourceType,
)
from fleet_import.store.repository import InvalidTransition
from tests.contract.batches import (
    ACME,
    OTHER_SCOPE,
    PAST_SHORT_TTL,
    SCOPE,
    SHORT_TTL,
    TTL,
    StoreUnderTest,
    committed,
    leased,
    reserved,
)

# -- reservation ------------------------------------------------------------------------------


def test_reserve_makes_one_running_batch_per_scope(store: StoreUnderTest) -> None:
    batch = reserved(store)
    assert batch.status == BatchStatus.RUNNING and batch.source_scope == SCOPE
    assert batch.details["version"] == 1 and batch.details["phase"] == "reserved"
    assert batch.execution_lease_id is None and batch.delivery_key == "d1"
    assert (batch.tenant_id, batch.company_id, batch.tenant_database) == (
        "acme",
        "company-acme",
        "tenant_acme",
    )
    again = store.repo.reserve(ACME, SCOPE, "d1")
    assert isinstance(again, ContinueExisting) and again.batch.id == batch.id
    busy = store.repo.reserve(ACME, SCOPE, "d2")
    assert busy == ScopeBusy(batch.id, "d1")
    elsewhere = reserved(store, "d2", OTHER_SCOPE)
    assert elsewhere.id != batch.id
    assert store.repo.get(batch.id).status == BatchStatus.RUNNING  # ScopeBusy touched nothing


def test_batch_ids_count_up_and_find_by_prefix(store: StoreUnderTest) -> None:
    first, second = reserved(store), reserved(store, "d2", OTHER_SCOPE)
    assert int(first.id.hex[:8], 16) + 1 == int(second.id.hex[:8], 16)
    assert store.repo.ids_with_prefix(first.id.hex[:8]) == [first.id]
    assert store.repo.ids_with_prefix(str(second.id)[:13]) == [second.id]
    with pytest.raises(InvalidInput):
        store.repo.ids_with_prefix("xyz")
    listed = store.repo.list(tenant="acme")
    assert [b.id for b in listed] == [second.id, first.id]  # newest first
    assert store.repo.list(status="failed") == []
    assert [b.id for b in store.repo.list(tenant="acme", scope=SCOPE)] == [first.id]
    assert [b.id for b in store.repo.list(tenant="acme", scope=OTHER_SCOPE, limit=1)] == [second.id]


def test_a_delivery_continues_its_batch_unless_it_failed(store: StoreUnderTest) -> None:
    batch = leased(store)
    store.repo.mark_failed(batch.id, "w1", FailureKind.FAILED_PRE_COMMIT, "bad file")
    assert store.repo.delivery_batch("acme", SCOPE, "d1") is None
    fresh = store.repo.reserve(ACME, SCOPE, "d1")  # recovery from a failure is a new batch
    assert isinstance(fresh, Reserved) and fresh.batch.id != batch.id
    owner = "w2"
    store.repo.acquire_lease(fresh.batch.id, owner, TTL)
    store.repo.mark_committed(fresh.batch.id, owner, row_counts={})
    store.repo.mark_succeeded(fresh.batch.id, owner)
    done = store.repo.reserve(ACME, SCOPE, "d1")  # a duplicate of a success: no work
    assert isinstance(done, ContinueExisting) and done.batch.status == BatchStatus.SUCCEEDED
    assert store.repo.delivery_batch("acme", SCOPE, "d1").id == fresh.batch.id
    assert isinstance(store.repo.reserve(ACME, SCOPE, "d2"), Reserved)  # the scope is free


def test_reserve_refuses_invalid_input(store: StoreUnderTest) -> None:
    with pytest.raises(InvalidInput):
        store.repo.reserve(ACME, SCOPE, "")
    with pytest.raises(InvalidInput):
        store.repo.reserve(ACME, "x" * 201, "d1")


# -- leases -----------------------------------------------------------------------------------


def test_lease_is_exclusive_until_it_expires(store: StoreUnderTest) -> None:
    batch = reserved(store)
    first = store.repo.acquire_lease(batch.id, "w1", TTL)
    assert isinstance(first, LeaseAcquired) and first.previous_owner is None
    held = store.repo.acquire_lease(batch.id, "w2", TTL)
    assert isinstance(held, LeaseHeld) and held.owner == "w1" and held.expires_at is not None
    again = store.repo.acquire_lease(batch.id, "w1", SHORT_TTL)  # ours: renewed, shorter
    assert isinstance(again, LeaseAcquired) and again.previous_owner is None
    store.wait(PAST_SHORT_TTL)
    taken = store.repo.acquire_lease(batch.id, "w2", TTL)
    assert isinstance(taken, LeaseAcquired) and taken.previous_owner == "w1"
    assert store.repo.get(batch.id).execution_lease_id == "w2"


def test_lease_of_missing_or_finished_batch(store: StoreUnderTest) -> None:
    assert store.repo.acquire_lease(uuid.uuid4(), "w1", TTL) == BatchNotRunning(None)
    batch = leased(store)
    store.repo.mark_failed(batch.id, "w1", FailureKind.FAILED_PRE_COMMIT, "x")
    assert store.repo.acquire_lease(batch.id, "w1", TTL) == BatchNotRunning(BatchStatus.FAILED)
    assert store.repo.take_over(batch.id, "w2", TTL) == BatchNotRunning(BatchStatus.FAILED)


def test_take_over_only_an_abandoned_batch(store: StoreUnderTest) -> None:
    live = leased(store, "w1")
    assert isinstance(store.repo.take_over(live.id, "w2", TTL), LeaseHeld)
    unleased = reserved(store, "d2", OTHER_SCOPE)
    # Its reserver may be about to lease it: not abandoned within one TTL.
    assert isinstance(store.repo.take_over(unleased.id, "w2", TTL), LeaseHeld)
    store.repo.acquire_lease(live.id, "w1", SHORT_TTL)
    store.wait(PAST_SHORT_TTL)
    abandoned = store.repo.abandoned_uncommitted(SHORT_TTL, 10)
    assert set(abandoned) == {live.id, unleased.id}
    taken = store.repo.take_over(live.id, "w2", TTL)
    assert isinstance(taken, LeaseAcquired) and taken.previous_owner == "w1"
    orphan = store.repo.take_over(unleased.id, "w3", SHORT_TTL)
    assert isinstance(orphan, LeaseAcquired) and orphan.previous_owner is None
    assert store.repo.abandoned_uncommitted(SHORT_TTL, 10) == []


def test_abandoned_uncommitted_leaves_committed_batches_to_the_outbox(
    store: StoreUnderTest,
) -> None:
    batch = reserved(store)
    store.repo.acquire_lease(batch.id, "w1", SHORT_TTL)
    store.repo.mark_committed(batch.id, "w1", row_counts={}, publication_steps=["notify"])
    store.wait(PAST_SHORT_TTL)
    assert store.repo.abandoned_uncommitted(SHORT_TTL, 10) == []
    assert store.outbox.batches_with_open_steps(10) == [batch.id]


def test_renew_and_release_only_for_the_owner(store: StoreUnderTest) -> None:
    batch = leased(store, "w1")
    renewed = store.repo.renew_lease(batch.id, "w1", TTL)
    assert renewed.owner == "w1"
    with pytest.raises(LeaseLost):
        store.repo.renew_lease(batch.id, "w2", TTL)
    assert store.repo.release_lease(batch.id, "w2") is False
    assert store.repo.get(batch.id).execution_lease_id == "w1"
    assert store.repo.release_lease(batch.id, "w1") is True
    after = store.repo.get(batch.id)
    assert after.execution_lease_id is None and after.execution_lease_expires_at is None
    with pytest.raises(LeaseLost):
        store.repo.renew_lease(batch.id, "w1", TTL)
    free = store.repo.acquire_lease(batch.id, "w2", TTL)
    assert isinstance(free, LeaseAcquired) and free.previous_owner is None


def test_only_a_fresh_batch_is_withdrawn_and_only_by_its_lease_holder(
    store: StoreUnderTest,
) -> None:
    batch = reserved(store)
    assert store.repo.withdraw(batch.id, "w1") is False  # nobody leased it
    assert isinstance(store.repo.acquire_lease(batch.id, "w1", TTL), LeaseAcquired)
    assert store.repo.withdraw(batch.id, "w2") is False
    assert store.repo.withdraw(batch.id, "w1") is True
    assert store.repo.get(batch.id) is None
    assert store.repo.delivery_batch("acme", SCOPE, "d1") is None
    again = reserved(store)  # the scope is free: the same delivery may reserve again
    assert again.id != batch.id
    store.repo.acquire_lease(again.id, "w1", TTL)
    store.repo.update_details(again.id, "w1", {"phase": "discovered"})
    assert store.repo.withdraw(again.id, "w1") is False  # work recorded: it stays
    assert store.repo.get(again.id).status == BatchStatus.RUNNING


# -- transitions --------------------------------------------------------------------------------


def test_transitions_are_fenced_by_the_lease(store: StoreUnderTest) -> None:
    batch = leased(store, "w1")
    with pytest.raises(LeaseLost):
        store.repo.update_details(batch.id, "w2", {"phase": "discovered"})
    with pytest.raises(LeaseLost):
        store.repo.mark_committed(batch.id, "w2", row_counts={"trips": 1})
    with pytest.raises(LeaseLost):
        store.repo.mark_failed(batch.id, "w2", FailureKind.FAILED_PRE_COMMIT, "x")
    with pytest.raises(LeaseLost):
        store.repo.mark_failed(batch.id, None, FailureKind.ENQUEUE_FAILED, "x")
    with pytest.raises(InvalidTransition):  # ours, but nothing committed yet
        store.repo.mark_succeeded(batch.id, "w1")
    with pytest.raises(LeaseLost):
        store.repo.mark_succeeded(batch.id, "w2")
    updated = store.repo.update_details(batch.id, "w1", {"phase": "discovered", "x": {"a": 1}})
    assert updated.details["phase"] == "discovered" and updated.details["x"] == {"a": 1}
    assert updated.details["version"] == 1  # merged, not replaced


def test_never_leased_batch_fails_with_no_owner(store: StoreUnderTest) -> None:
    batch = reserved(store)
    failed = store.repo.mark_failed(batch.id, None, FailureKind.ENQUEUE_FAILED, "no queue")
    assert failed.status == BatchStatus.FAILED
    assert failed.details["failure"]["kind"] == "enqueue_failed"


def test_failure_is_recorded_with_kind_error_time_and_facts(store: StoreUnderTest) -> None:
    batch = leased(store)
    failed = store.repo.mark_failed(
        batch.id, "w1", FailureKind.ABANDONED, "bad\x00byte", {"previous_owner": "w0"}
    )
    failure = failed.details["failure"]
    assert failure["kind"] == "abandoned" and failure["error"] == "bad\\x00byte"
    assert failure["previous_owner"] == "w0"
    assert failure["at"].endswith("Z") and failure["at"][:4].isdigit()
    assert failed.record.failure.kind == FailureKind.ABANDONED
    assert isinstance(store.repo.reserve(ACME, SCOPE, "d2"), Reserved)  # scope freed


def test_terminal_rows_are_never_rewritten(store: StoreUnderTest) -> None:
    batch = committed(store)
    succeeded = store.repo.mark_succeeded(batch.id, "w1", {"publication": {"notify": "done"}})
    assert succeeded.status == BatchStatus.SUCCEEDED
    assert succeeded.details["phase"] == "published" and succeeded.details["publication"]
    before = store.repo.get(batch.id)
    for attempt in (
        lambda: store.repo.update_details(batch.id, "w1", {"phase": "x"}),
        lambda: store.repo.mark_failed(batch.id, "w1", FailureKind.FAILED_PRE_COMMIT, "x"),
        lambda: store.repo.mark_committed(batch.id, "w1", row_counts={}),
        lambda: store.repo.mark_succeeded(batch.id, "w1"),
        lambda: store.outbox.mark_publication_expired(batch.id, "w1", "x"),
    ):
        with pytest.raises(LeaseLost):
            attempt()
    assert store.repo.get(batch.id) == before


def test_mark_committed_records_the_commit_and_enqueues_publication(
    store: StoreUnderTest,
) -> None:
    batch = leased(store)
    marked = store.repo.mark_committed(
        batch.id,
        "w1",
        row_counts={"trips": 3, "vehicles": 1},
        publication_steps=["refresh", "notify", "retire"],
        patch={"summary": {"files": 2}},
    )
    assert marked.details["warehouse_committed"] is True and marked.details["phase"] == "committed"
    assert marked.details["row_counts"] == {"trips": 3, "vehicles": 1}
    assert marked.details["summary"] == {"files": 2}
    steps = store.outbox.steps(batch.id)
    assert [(s.step, s.seq, str(s.status), s.attempts) for s in steps] == [
        ("refresh", 1, "pending", 0),
        ("notify", 2, "pending", 0),
        ("retire", 3, "pending", 0),
    ]
    # A commit recorded again (recovered from the stamp) enqueues nothing twice.
    store.repo.mark_committed(batch.id, "w1", row_counts={"trips": 3}, publication_steps=["notify"])
    assert len(store.outbox.steps(batch.id)) == 3


# -- resume -------------------------------------------------------------------------------------


def test_resume_puts_a_failed_publication_back_to_running(store: StoreUnderTest) -> None:
    batch = committed(store)
    store.repo.mark_failed(batch.id, "w1", FailureKind.FAILED_PUBLICATION, "notify down")
    resumed = store.repo.resume_publication(batch.id, SourceType.FLEET_S3, SCOPE)
    assert isinstance(resumed, Resumed)
    again = resumed.batch
    assert again.status == BatchStatus.RUNNING and again.execution_lease_id is None
    assert again.details["resumes"] == 1
    assert again.details["last_failure"]["error"] == "notify down"
    assert "failure" not in again.details
    assert isinstance(store.repo.acquire_lease(batch.id, "w2", TTL), LeaseAcquired)


def test_resume_refusals(store: StoreUnderTest) -> None:
    missing = uuid.uuid4()
    assert isinstance(store.repo.resume_publication(missing, "fleet_s3", SCOPE), NotResumable)
    pre_commit = leased(store, "w1", "d0", OTHER_SCOPE)
    store.repo.mark_failed(pre_commit.id, "w1", FailureKind.FAILED_PRE_COMMIT, "bad")
    refused = store.repo.resume_publication(pre_commit.id, "fleet_s3", OTHER_SCOPE)
    assert isinstance(refused, NotResumable) and "never committed" in refused.reason
    batch = committed(store)
    running = store.repo.resume_publication(batch.id, "fleet_s3", SCOPE)
    assert isinstance(running, NotResumable) and "still running" in running.reason
    store.repo.mark_failed(batch.id, "w1", FailureKind.FAILED_PUBLICATION, "x")
    wrong = store.repo.resume_publication(batch.id, "fleet_s3", OTHER_SCOPE)
    assert isinstance(wrong, NotResumable)
    assert isinstance(store.repo.resume_publication(batch.id, "kds_cdc", SCOPE), NotResumable)
    holder = reserved(store, "d2")
    busy = store.repo.resume_publication(batch.id, "fleet_s3", SCOPE)
    assert busy == ScopeBusy(holder.id, "d2")
    assert store.repo.get(batch.id).status == BatchStatus.FAILED  # a refusal changes nothing


def test_expired_or_superseded_publication_is_not_resumable(store: StoreUnderTest) -> None:
    batch = committed(store)
    store.outbox.mark_publication_expired(batch.id, "w1", "slice owned by another")
    expired = store.repo.get(batch.id)
    assert expired.status == BatchStatus.FAILED and expired.details["publication_expired"]
    assert expired.details["failure"]["kind"] == "failed_publication"
    refused = store.repo.resume_publication(batch.id, "fleet_s3", SCOPE)
    assert isinstance(refused, NotResumable) and "expired" in refused.reason


# -- the normalized-file cache -----------------------------------------------------------------


def test_cached_files_are_stored_replaced_and_forgotten(store: StoreUnderTest) -> None:
    batch = reserved(store)
    entry = CachedFile("s3://b/k.csv", "e1", "v1", "trips", "file:///o.parquet", 5, 1, {"r": 1})
    assert store.repo.cached_file("s3://b/k.csv", "e1", "v1") is None
    store.repo.store_cached_file(entry, batch.id)
    assert store.repo.cached_file("s3://b/k.csv", "e1", "v1") == entry
    newer = CachedFile("s3://b/k.csv", "e1", "v1", "trips", "file:///p.parquet", 6, 0, {})
    store.repo.store_cached_file(newer, None)
    assert store.repo.cached_file("s3://b/k.csv", "e1", "v1") == newer
    store.repo.forget_cached_file("s3://b/k.csv", "e1", "v1")
    assert store.repo.cached_file("s3://b/k.csv", "e1", "v1") is None


def test_a_cached_file_stored_again_keeps_its_dataset(store: StoreUnderTest) -> None:
    """The cache's key (source key, etag, contract version) names one file read one way: a
    second store of it replaces what reading it produced, never which dataset it is (the
    SQL's ON CONFLICT updates every column but `dataset`)."""
    entry = CachedFile("s3://b/k.csv", "e1", "v1", "trips", "file:///o.parquet", 5, 1, {"r": 1})
    store.repo.store_cached_file(entry, None)
    other = CachedFile("s3://b/k.csv", "e1", "v1", "vehicles", "file:///p.parquet", 6, 0, {})
    store.repo.store_cached_file(other, None)
    assert store.repo.cached_file("s3://b/k.csv", "e1", "v1") == CachedFile(
        "s3://b/k.csv", "e1", "v1", "trips", "file:///p.parquet", 6, 0, {}
    )
