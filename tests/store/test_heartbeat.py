from __future__ import annotations

import time

import psycopg
import pytest

from fleet_import.errors import LeaseLost
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
