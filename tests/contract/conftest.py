"""The implementations the contract suite holds to one set of assertions: each test runs
once against PostgreSQL (the real repositories and warehouse, on the test's own database)
and once against the in-memory fakes (tests/fakes), so the fakes cannot drift.

`wait(seconds)` lets leases expire: a real sleep on PostgreSQL (its clock is `now()`), the
fake clock advanced in memory."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.contract.batches import StoreUnderTest
from tests.fakes.outbox import MemoryOutboxRepository
from tests.fakes.review import MemoryReviewRepository
from tests.fakes.state import MemoryStore
from tests.fakes.store import MemoryBatchRepository
from tests.fakes.warehouse import MemoryWarehouse

IMPLEMENTATIONS = [pytest.param("postgres", marks=pytest.mark.server), "memory"]


@pytest.fixture(params=IMPLEMENTATIONS)
def store(request: pytest.FixtureRequest) -> StoreUnderTest:
    if request.param == "postgres":
        from fleet_import.store.outbox import OutboxRepository
        from fleet_import.store.repository import BatchRepository
        from fleet_import.store.review_repository import ReviewRepository

        url = request.getfixturevalue("database_url")
        return StoreUnderTest(
            "postgres",
            BatchRepository(url),
            OutboxRepository(url),
            time.sleep,
            ReviewRepository(url),
        )
    memory = MemoryStore()
    return StoreUnderTest(
        "memory",
        MemoryBatchRepository(memory),
        MemoryOutboxRepository(memory),
        memory.clock.advance,
        MemoryReviewRepository(memory),
    )


@pytest.fixture(params=IMPLEMENTATIONS)
def any_warehouse(request: pytest.FixtureRequest) -> Any:
    if request.param == "postgres":
        return request.getfixturevalue("warehouse")
    return MemoryWarehouse()
