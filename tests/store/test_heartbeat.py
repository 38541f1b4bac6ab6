from __future__ import annotations

import time

import psycopg
import pytest

from fleet_import.errors import LeaseLost, LeaseUnconfirmed
from fleet_import.scope import Tenant, source_scope
from fleet_import.store.heartbeat import Heartbeat
from fleet_import.store.models import LeaseAcquired, LeaseHeld, Reserved
from fleet_import.store.repository import BatchRepository


def leased_batch(repo: BatchRepository, ttl: float):
    outcome = repo.reserve(Tenant.named("acme"), source_scope("s3://fleet-landing/acme/x/"), "d1")
    assert isinstance(outcome, Reserved)
    assert isinstance(repo.acquire_lease(outcome.batch.id, "w1", ttl), LeaseAcquired)
    return outcome.batch


def test_heartbeat_keeps_the_lease_past_its_ttl(repo: BatchRepository) -> None:
    batch = leased_batch(repo, 0.6)
    with Heartbeat(repo, batch.id, "w1", 0.6) as heartbeat:
        time.sleep(1.5)
        assert isinstance(repo.acquire_lease(batch.id, "w2", 60), LeaseHeld)
        heartbeat.check()
    time.sleep(0.7)  # no more beats: the lease expires
    assert isinstance(repo.acquire_lease(batch.id, "w2", 60), LeaseAcquired)


def test_heartbeat_notices_a_takeover(repo: BatchRepository, database_url: str) -> None:
    batch = leased_batch(repo, 0.6)
    with Heartbeat(repo, batch.id, "w1", 0.6) as heartbeat:
        with psycopg.connect(database_url) as conn:
            conn.execute(
                "UPDATE ingestion_batches SET execution_lease_id = 'w2' WHERE id = %s", (batch.id,)
            )
        time.sleep(0.5)
        with pytest.raises(LeaseLost):
            heartbeat.check()
        with pytest.raises(LeaseLost):
            heartbeat.renew_now()


def test_an_unconfirmed_lease_is_fenced_before_it_can_expire(
    repo: BatchRepository, database_url: str
) -> None:
    """The fence (issue #26): with the operational database unreachable no renewal
    confirms the lease, and four fifths of a TTL after the last confirmation `check()`
    refuses (LeaseUnconfirmed, a LeaseLost naming the database), whether or not the
    database's own clock has expired the lease yet."""
    ttl = 2.0
    batch = leased_batch(repo, ttl)
    unreachable = BatchRepository("postgresql://postgres@127.0.0.1:9/postgres")
    with Heartbeat(unreachable, batch.id, "w1", ttl) as heartbeat:
        heartbeat.check()  # just acquired: confirmed
        time.sleep(ttl * 0.5)
        heartbeat.check()  # a missed beat is survivable
        time.sleep(ttl * 0.45)
        with pytest.raises(LeaseUnconfirmed, match="operational database has not confirmed"):
            heartbeat.check()
        with pytest.raises(LeaseLost):  # what every LeaseLost handler stops on
            heartbeat.check()
        with pytest.raises(LeaseUnconfirmed):
            heartbeat.renew_now()  # fenced before it even asks


def test_a_renewal_confirms_the_lease_again(repo: BatchRepository) -> None:
    ttl = 1.2
    batch = leased_batch(repo, ttl)
    heartbeat = Heartbeat(repo, batch.id, "w1", ttl, confirmed_at=time.monotonic() - ttl)
    with pytest.raises(LeaseUnconfirmed):
        heartbeat.check()  # acquired a TTL ago, never confirmed since
    with heartbeat:  # its first beat is overdue: it renews at once, and confirms the lease
        time.sleep(0.3)
        heartbeat.check()
        assert heartbeat.unconfirmed_for() < ttl / 3
