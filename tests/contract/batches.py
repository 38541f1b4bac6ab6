"""Batches in the states the contract tests start from, made through the repository under
test (either implementation), so that no test module imports another."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fleet_import.scope import Tenant
from fleet_import.store.models import LeaseAcquired, Reserved

ACME = Tenant("acme", "company-acme", "tenant_acme")
SCOPE = "fleet_s3:s3://fleet-landing/acme/fleet/2026-07-22/"
OTHER_SCOPE = "fleet_s3:s3://fleet-landing/acme/fleet/2026-07-23/"
TTL = 30.0
SHORT_TTL = 1.0  # a lease a test lets expire: a real sleep on PostgreSQL
PAST_SHORT_TTL = 1.5


@dataclass
class StoreUnderTest:
    kind: str
    repo: Any
    outbox: Any
    wait: Callable[[float], None]
    reviews: Any


def reserved(store: StoreUnderTest, key: str = "d1", scope: str = SCOPE):
    outcome = store.repo.reserve(ACME, scope, key)
    assert isinstance(outcome, Reserved), outcome
    return outcome.batch


def leased(store: StoreUnderTest, owner: str = "w1", key: str = "d1", scope: str = SCOPE):
    batch = reserved(store, key, scope)
    assert isinstance(store.repo.acquire_lease(batch.id, owner, TTL), LeaseAcquired)
    return batch


def committed(store: StoreUnderTest, owner: str = "w1", steps=("refresh", "notify")):
    batch = leased(store, owner)
    store.repo.mark_committed(batch.id, owner, row_counts={"trips": 3}, publication_steps=steps)
    return batch
