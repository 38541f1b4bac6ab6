"""What later deliveries of a folder say of a held batch (`ReviewRepository.held_since`,
read by every view through fleet_import.store.batch_state), and what the retention keeps
of it: a held batch overtaken or made stale by a later delivery is not kept for ever."""

from __future__ import annotations

import uuid

from fleet_import.scope import Tenant, source_scope
from fleet_import.store.batch_state import ReviewState, review_state
from fleet_import.store.details import FailureKind
from fleet_import.store.models import (
    LeaseAcquired,
    Reserved,
)
from fleet_import.store.repository import BatchRepository
from fleet_import.store.review_repository import ReviewRepository

SCOPE = source_scope("s3://fleet-landing/acme/fleet/2026-07-22/")
CONTENT = {"fingerprint": "f-held", "contract_versions": {"trips": "v1"}}


def _batch(repo: BatchRepository, tenant: Tenant, key: str, fingerprint: str | None) -> uuid.UUID:
    reserved = repo.reserve(tenant, SCOPE, key)
    assert isinstance(reserved, Reserved), reserved
    assert isinstance(repo.acquire_lease(reserved.batch.id, key, 60), LeaseAcquired)
    if fingerprint is not None:
        repo.update_details(
            reserved.batch.id,
            key,
            {"manifest": {"fingerprint": fingerprint}, "contract_versions": {"trips": "v1"}},
        )
    return reserved.batch.id


def _held(repo: BatchRepository, tenant: Tenant, key: str) -> uuid.UUID:
    batch_id = _batch(repo, tenant, key, CONTENT["fingerprint"])
    repo.mark_failed(batch_id, key, FailureKind.HELD, "held", {"held": {"content": CONTENT}})
    return batch_id


def test_a_held_batch_awaits_review_until_a_later_delivery_lists_its_folder(
    repo: BatchRepository, acme: Tenant, database_url: str
) -> None:
    reviews = ReviewRepository(database_url)
    held = _held(repo, acme, "d1")
    assert reviews.held_since([held]) == {}
    assert review_state(repo.get(held), None) is ReviewState.AWAITING

    # A later delivery that never listed the folder (no fingerprint yet) says nothing.
    early = _batch(repo, acme, "d2", None)
    repo.mark_failed(early, "d2", FailureKind.FAILED_PRE_COMMIT, "boom")
    assert reviews.held_since([held]) == {}

    # Other files: stale.
    other = _batch(repo, acme, "d3", "f-other")
    repo.mark_failed(other, "d3", FailureKind.FAILED_PRE_COMMIT, "bad row")
    since = reviews.held_since([held])[held]
    assert (since.later_id, since.same_content, since.succeeded) == (other, False, False)
    assert review_state(repo.get(held), since) is ReviewState.STALE


def test_the_same_content_loaded_later_overtakes_it_and_its_approval_does_not(
    repo: BatchRepository, acme: Tenant, database_url: str
) -> None:
    reviews = ReviewRepository(database_url)
    held = _held(repo, acme, "d1")
    approval = _batch(repo, acme, f"approve:{held}", CONTENT["fingerprint"])
    repo.mark_failed(approval, f"approve:{held}", FailureKind.FAILED_PRE_COMMIT, "x")
    assert reviews.held_since([held]) == {}  # its own approval is no later delivery

    loader = _batch(repo, acme, "d2", CONTENT["fingerprint"])
    repo.mark_committed(loader, "d2", row_counts={"trips": 10})
    repo.mark_succeeded(loader, "d2")
    since = reviews.held_since([held])[held]
    assert (since.later_id, since.same_content, since.succeeded) == (loader, True, True)
    assert review_state(repo.get(held), since) is ReviewState.OVERTAKEN


def test_the_retention_keeps_a_held_batch_only_against_earlier_deliveries(
    repo: BatchRepository, acme: Tenant, database_url: str
) -> None:
    """While an earlier batch publishes (a resume), a held batch made after it still waits
    and its files are kept; once a later delivery publishes, the held one is overtaken or
    stale, and keeping its files would keep them for ever."""
    reviews = ReviewRepository(database_url)
    earlier = _batch(repo, acme, "d0", "f-earlier")
    repo.mark_committed(earlier, "d0", row_counts={"trips": 400}, publication_steps=["notify"])
    repo.mark_failed(earlier, "d0", FailureKind.FAILED_PUBLICATION, "notify timed out")
    held = _held(repo, acme, "d1")
    later = _batch(repo, acme, "d2", "f-later")

    kept_for_earlier = {b.id for b in reviews.retained_batches(earlier, keep_seconds=3600)}
    assert held in kept_for_earlier
    kept_for_later = {b.id for b in reviews.retained_batches(later, keep_seconds=3600)}
    assert held not in kept_for_later
