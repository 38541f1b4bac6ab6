"""Races between real processes, each with its own connection: PostgreSQL is the arbiter."""

from __future__ import annotations

import multiprocessing
import time
import uuid
from collections import Counter

import pytest

from fleet_import.scope import Tenant, source_scope
from fleet_import.store.models import LeaseAcquired, LeaseHeld, Reserved, ScopeBusy
from fleet_import.store.repository import BatchRepository
from tests.processes import results_of

# forkserver: children start from a clean, single-threaded server process (the test process
# runs server threads), and the preload keeps 32 starts cheap.
_FORK = multiprocessing.get_context("forkserver")
_FORK.set_forkserver_preload(["fleet_import.store", "tests.store.test_batches_concurrency"])


def _reserve(url: str, barrier, tenant_id: str, folder: str, key: str, out) -> None:
    repo = BatchRepository(url)
    barrier.wait()
    outcome = repo.reserve(Tenant.named(tenant_id), source_scope(folder), key)
    if isinstance(outcome, Reserved):
        out.put(("reserved", key, str(outcome.batch.id)))
    elif isinstance(outcome, ScopeBusy):
        out.put(("busy", key, str(outcome.holder_batch_id)))
    else:
        out.put((type(outcome).__name__, key, ""))


def _acquire(url: str, barrier, batch_id: str, owner: str, ttl: float, out) -> None:
    repo = BatchRepository(url)
    barrier.wait()
    outcome = repo.acquire_lease(uuid.UUID(batch_id), owner, ttl)
    out.put((type(outcome).__name__, owner))


def _run_all(target, args_list: list[tuple], parties: int) -> list[tuple]:
    barrier = _FORK.Barrier(parties)
    out = _FORK.Queue()
    processes = [
        _FORK.Process(target=target, args=(*args[:1], barrier, *args[1:], out))
        for args in args_list
    ]
    return results_of(processes, out)


@pytest.mark.slow
def test_32_processes_race_one_scope(database_url: str) -> None:
    folder = "s3://fleet-landing/acme/fleet/2026-07-22/"
    results = _run_all(
        _reserve, [(database_url, "acme", folder, f"delivery-{i}") for i in range(32)], 32
    )
    kinds = Counter(kind for kind, _, _ in results)
    assert kinds == {"reserved": 1, "busy": 31}
    (winner,) = [batch_id for kind, _, batch_id in results if kind == "reserved"]
    assert {batch_id for kind, _, batch_id in results if kind == "busy"} == {winner}
    running = BatchRepository(database_url).list(status="running")
    assert [str(b.id) for b in running] == [winner]


@pytest.mark.slow
def test_different_folders_and_tenants_never_conflict(database_url: str) -> None:
    contenders = [
        (
            database_url,
            tenant,
            f"s3://fleet-landing/{tenant}/fleet/2026-07-{day:02d}/",
            f"{tenant}-{day}",
        )
        for tenant in ("acme", "globex", "initech", "umbrella")
        for day in range(1, 9)
    ]
    results = _run_all(_reserve, contenders, len(contenders))
    assert Counter(kind for kind, _, _ in results) == {"reserved": 32}


@pytest.mark.slow
def test_16_processes_race_one_lease_then_one_takes_over(database_url: str) -> None:
    repo = BatchRepository(database_url)
    outcome = repo.reserve(Tenant.named("acme"), source_scope("s3://fleet-landing/acme/x/"), "d1")
    assert isinstance(outcome, Reserved)
    batch_id = str(outcome.batch.id)

    results = _run_all(_acquire, [(database_url, batch_id, f"w{i}", 1.0) for i in range(16)], 16)
    holders = [owner for kind, owner in results if kind == "LeaseAcquired"]
    assert len(holders) == 1
    assert Counter(kind for kind, _ in results)["LeaseHeld"] == 15
    assert repo.get(outcome.batch.id).execution_lease_id == holders[0]

    time.sleep(1.2)  # the holder stops renewing: its lease expires by the database clock
    results = _run_all(_acquire, [(database_url, batch_id, f"t{i}", 60.0) for i in range(16)], 16)
    takers = [owner for kind, owner in results if kind == "LeaseAcquired"]
    assert len(takers) == 1
    assert repo.get(outcome.batch.id).execution_lease_id == takers[0]


def _renew_for(url: str, barrier, batch_id: str, seconds: float, out) -> None:
    repo = BatchRepository(url)
    barrier.wait()
    deadline = time.monotonic() + seconds
    renewals = 0
    while time.monotonic() < deadline:
        repo.renew_lease(uuid.UUID(batch_id), "owner", 1.2)
        renewals += 1
        time.sleep(0.3)  # a quarter of the TTL
    out.put(("renewed", renewals))


def _contend_for(url: str, barrier, batch_id: str, owner: str, seconds: float, out) -> None:
    repo = BatchRepository(url)
    barrier.wait()
    deadline = time.monotonic() + seconds
    outcomes = Counter()
    while time.monotonic() < deadline:
        outcome = repo.acquire_lease(uuid.UUID(batch_id), owner, 60)
        outcomes[type(outcome).__name__] += 1
        time.sleep(0.05)
    out.put(("contended", dict(outcomes)))


@pytest.mark.slow
def test_live_renewed_lease_is_never_taken(database_url: str) -> None:
    repo = BatchRepository(database_url)
    outcome = repo.reserve(Tenant.named("acme"), source_scope("s3://fleet-landing/acme/x/"), "d1")
    batch_id = str(outcome.batch.id)
    # Held long enough for the nine processes to start (seconds on a loaded machine); the
    # renewer's first renewal shortens it to its TTL.
    assert isinstance(repo.acquire_lease(outcome.batch.id, "owner", 60), LeaseAcquired)

    barrier = _FORK.Barrier(9)
    out = _FORK.Queue()
    processes = [_FORK.Process(target=_renew_for, args=(database_url, barrier, batch_id, 2.5, out))]
    processes += [
        _FORK.Process(
            target=_contend_for, args=(database_url, barrier, batch_id, f"c{i}", 2.0, out)
        )
        for i in range(8)
    ]
    reports = results_of(processes, out)
    contended = Counter()
    for kind, value in reports:
        if kind == "contended":
            contended.update(value)
    assert contended["LeaseHeld"] > 50
    assert contended["LeaseAcquired"] == 0
    assert repo.get(outcome.batch.id).execution_lease_id == "owner"
    assert isinstance(repo.acquire_lease(outcome.batch.id, "late", 60), LeaseHeld)
