"""The normalized-file cache entries a publication forgets (publisher's retire step),
asserted against OutboxRepository on PostgreSQL and against the in-memory fake alike: only
entries that finished, earlier batches of the same scope created, and none the new slice
was loaded from; an entry another batch re-stored meanwhile stays."""

from __future__ import annotations

import uuid

from fleet_import.store.details import FailureKind
from fleet_import.store.models import (
    CachedFile,
    FileInUse,
)
from tests.contract.batches import OTHER_SCOPE, StoreUnderTest, leased

LANDING = "s3://fleet-landing/acme/fleet/2026-07-22/"


def _entry(name: str, etag: str = "e1", version: str = "v1") -> CachedFile:
    return CachedFile(
        source_key=LANDING + name,
        etag=etag,
        contract_version=version,
        dataset="trips",
        output_uri=f"s3://stage/{name}-{etag}-{version}.parquet",
        row_count=3,
        reject_count=0,
        details={"columns": ["trip_id"]},
    )


def _succeeded(store: StoreUnderTest, key: str, owner: str) -> uuid.UUID:
    batch = leased(store, owner, key)
    store.repo.mark_committed(batch.id, owner, row_counts={"trips": 3}, publication_steps=[])
    store.repo.mark_succeeded(batch.id, owner)
    return batch.id


def test_only_entries_the_replaced_slices_alone_used_are_candidates(
    store: StoreUnderTest,
) -> None:
    first = _succeeded(store, "d1", "w1")
    old_a, old_b, old_b2, old_c = _entry("a"), _entry("b"), _entry("b", "e2"), _entry("c")
    for entry in (old_a, old_b, old_b2, old_c):
        store.repo.store_cached_file(entry, first)
    other = leased(store, "w2", "o1", OTHER_SCOPE)  # another scope's: never a candidate
    store.repo.store_cached_file(_entry("o"), other.id)
    store.repo.mark_failed(other.id, "w2", FailureKind.FAILED_PRE_COMMIT, "x")
    store.repo.store_cached_file(_entry("n"), None)  # no creator: never a candidate

    latest = leased(store, "w3", "d2")
    store.repo.store_cached_file(_entry("l"), latest.id)  # its own: never a candidate
    in_use = [
        FileInUse(old_b.source_key, "e1", None),  # b as it is now, under any version
        FileInUse(old_c.source_key, None, None),  # c, whatever its content
    ]
    # Sorted by key, etag and version; b's other content is no longer used.
    assert store.outbox.cache_entries_only_used_by(latest.id, in_use) == [old_a, old_b2]
    assert store.outbox.cache_entries_only_used_by(latest.id, []) == [
        old_a, old_b, old_b2, old_c
    ]
    assert store.outbox.cache_entries_only_used_by(first, []) == []  # nothing before it
    assert store.outbox.cache_entries_only_used_by(uuid.uuid4(), []) == []


def test_forgetting_spares_an_entry_another_batch_stored_again(store: StoreUnderTest) -> None:
    first = _succeeded(store, "d1", "w1")
    old_a, old_b = _entry("a"), _entry("b")
    store.repo.store_cached_file(old_a, first)
    store.repo.store_cached_file(old_b, first)
    latest = leased(store, "w2", "d2")
    candidates = store.outbox.cache_entries_only_used_by(latest.id, [])
    assert candidates == [old_a, old_b]
    store.repo.store_cached_file(old_a, latest.id)  # re-stored meanwhile: its creator moved
    assert store.outbox.forget_cache_entries(latest.id, candidates) == [old_b]
    assert store.repo.cached_file(old_a.source_key, "e1", "v1") == old_a
    assert store.repo.cached_file(old_b.source_key, "e1", "v1") is None
    assert store.outbox.forget_cache_entries(latest.id, candidates) == []  # once
    assert store.outbox.forget_cache_entries(latest.id, []) == []
    # An earlier batch forgets nothing a later one created.
    assert store.outbox.forget_cache_entries(first, [old_a]) == []
    assert store.repo.cached_file(old_a.source_key, "e1", "v1") == old_a
