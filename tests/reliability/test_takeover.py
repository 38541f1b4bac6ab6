"""Dead and frozen holders never block a scope: real processes, real kills, SIGSTOP.

A worker dies (a failpoint's os._exit, or SIGKILL) or freezes (SIGSTOP, inside its open
slice transaction, holding the scope's lock) before its batch finished. Once its lease
expired, the next delivery of the scope -- with another delivery key, or its own -- or the
drain takes the batch over: its warehouse session is ended, and the batch is failed as
abandoned (recorded with the old owner), continued (same content), or its publication is
finished (committed). A claim on a publication step ends with the lease it was made under.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from fleet_import.importing.claim import settle_abandoned_batches
from fleet_import.importing.context import Committed, Failed
from fleet_import.importing.driver import import_folder
from fleet_import.intake.completion import Marker
from fleet_import.intake.sweep import find_ready_folders, plan_sweep
from fleet_import.publication.outcomes import Published
from fleet_import.publication.publisher import DEFAULT_CLAIM_TTL_SECONDS
from fleet_import.scope import Tenant, split_folder
from fleet_import.store.details import FailureKind
from fleet_import.store.models import BatchStatus
from fleet_import.store.outbox import OutboxRepository, StepStatus
from fleet_import.store.repository import BatchRepository
from fleet_import.store.sweep_repository import SweepRepository
from tests.reliability import soak_worker
from tests.reliability.conftest import (
    KILLED,
    REFRESH_SQL,
    connect,
    create_refresh_table,
    invariant_violations,
    make_source,
    outcome_of,
    run_once,
    slice_differences,
    upload_sources,
    worker_command,
    worker_env,
)
from tests.s3fixtures import put_objects

# Real kills and freezes, each waiting out a lease TTL: `make test-crash`, with the crash matrix.
pytestmark = [pytest.mark.slow, pytest.mark.crash]

ACME = Tenant.named("acme")
_TTL = 2.0
_EXPIRY_MARGIN = 0.5
_FROZEN_WAIT_SECONDS = 60
# Datasets load in name order: this COPY is the slice's last before its failpoint.
_LAST_COPY = 'COPY "curated"."fleet_vehicles"'


@pytest.fixture
def config(child_config: dict[str, Any], database_url: str) -> dict[str, Any]:
    create_refresh_table(database_url)
    return {**child_config, "ttl": _TTL, "refresh_sql": REFRESH_SQL, "tenant": "acme"}


def _sources(landing_bucket: str):
    old = make_source(landing_bucket, "acme", "2026-07-22", seed=1, trips=40, fuel=10, vehicles=6)
    new = make_source(landing_bucket, "acme", "2026-07-22", seed=2, trips=60, fuel=15, vehicles=8)
    return old, new


def _batch(repo: BatchRepository, key: str):
    (batch,) = [b for b in repo.list() if b.delivery_key == key]
    return batch


def _die_at(config: dict[str, Any], folder: str, key: str, failpoint: str):
    """Delivery `key` of `folder` in a child process that dies at `failpoint`; its batch."""
    dead = run_once({**config, "folder": folder, "key": key, "worker": "a"}, failpoint)
    assert dead.returncode == KILLED, dead.stderr
    return _batch(BatchRepository(config["database_url"]), key)


def _deliver(config: dict[str, Any], folder: str, key: str) -> dict[str, Any]:
    """Delivery `key` of `folder` in a child process that must publish; its outcome."""
    result = outcome_of(run_once({**config, "folder": folder, "key": key, "worker": "b"}))
    assert result["outcome"] == "Committed" and result["published"], result
    return result


def _assert_abandoned(repo: BatchRepository, batch_id: uuid.UUID) -> None:
    dead = repo.get(batch_id)
    assert dead.status == BatchStatus.FAILED, dead.details
    failure = dead.details["failure"]
    assert failure["kind"] == FailureKind.ABANDONED
    assert failure["previous_owner"], failure  # the old owner is on record
    assert "abandoned before commit" in failure["error"]


# -- a death before commit ------------------------------------------------------------------


@pytest.mark.parametrize("successor", ["other_key_new_content", "other_key_same_content", "drain"])
def test_a_dead_holder_blocks_its_scope_one_lease_ttl_at_most(
    successor: str, config, s3, landing_bucket: str
) -> None:
    repo = BatchRepository(config["database_url"])
    ctx, _ = soak_worker.build({**config, "worker": "parent"})
    old, new = _sources(landing_bucket)
    upload_sources(s3, [old])
    d1 = _die_at(config, old.folder, "d1", "after_normalized_file")
    assert d1.status == BatchStatus.RUNNING

    time.sleep(_TTL + _EXPIRY_MARGIN)
    if successor == "drain":
        (outcome,) = settle_abandoned_batches(ctx, "drain-1", limit=10)
        assert isinstance(outcome, Failed) and outcome.kind == FailureKind.ABANDONED
        _assert_abandoned(repo, d1.id)
        source = old
        result = _deliver(config, old.folder, "d2")
    else:
        source = new if successor == "other_key_new_content" else old
        upload_sources(s3, [source])
        result = _deliver(config, old.folder, "d2")
        if source is new:  # other content: the dead batch fails, a new one loads
            _assert_abandoned(repo, d1.id)
            assert result["batch_id"] != str(d1.id)
        else:  # the same content: the new delivery continues the dead batch
            assert result["batch_id"] == str(d1.id)
            assert repo.get(d1.id).status == BatchStatus.SUCCEEDED
    owner = uuid.UUID(result["batch_id"])
    with connect(config["database_url"]) as conn:
        assert slice_differences(conn, source, owner) == []
    assert invariant_violations(config["database_url"], final=True) == []


def test_a_batch_stamped_before_its_holder_died_is_recorded_and_published_by_the_drain(
    config, s3, landing_bucket: str
) -> None:
    repo = BatchRepository(config["database_url"])
    ctx, publisher = soak_worker.build({**config, "worker": "parent"})
    old, _ = _sources(landing_bucket)
    upload_sources(s3, [old])
    d1 = _die_at(config, old.folder, "d1", "after_warehouse_commit")
    time.sleep(_TTL + _EXPIRY_MARGIN)
    (outcome,) = settle_abandoned_batches(ctx, "drain-1", limit=10)
    assert isinstance(outcome, Committed) and outcome.published and outcome.recovered
    assert repo.get(d1.id).status == BatchStatus.SUCCEEDED
    with connect(config["database_url"]) as conn:
        assert slice_differences(conn, old, d1.id) == []
    assert invariant_violations(config["database_url"], final=True) == []


# -- a death during publication -------------------------------------------------------------


@pytest.mark.parametrize("successor", ["same_key", "other_key", "drain"])
def test_a_step_claim_ends_with_its_lease(successor: str, config, s3, landing_bucket) -> None:
    """The claim TTL stays at its 60 s default; the lease is 2 s. The successor runs the
    claimed step as soon as the lease expired, not after the claim's TTL."""
    assert DEFAULT_CLAIM_TTL_SECONDS > 10 * _TTL
    config = {**config, "claim_ttl": DEFAULT_CLAIM_TTL_SECONDS}
    repo, outbox = BatchRepository(config["database_url"]), OutboxRepository(config["database_url"])
    _, publisher = soak_worker.build({**config, "worker": "parent"})
    old, new = _sources(landing_bucket)
    upload_sources(s3, [old])
    d1 = _die_at(config, old.folder, "d1", "in_step_refresh_dependants")
    (head, *_) = outbox.steps(d1.id)
    assert head.status == StepStatus.CLAIMED and head.claimed_until > d1.updated_at

    time.sleep(_TTL + _EXPIRY_MARGIN)
    if successor == "drain":
        outcomes = publisher.drain("drain-1", lease_ttl=_TTL)
        assert [type(o) for o in outcomes] == [Published], outcomes
    else:
        key = "d1" if successor == "same_key" else "d2"
        if successor == "other_key":
            upload_sources(s3, [new])
        _deliver(config, old.folder, key)
    assert repo.get(d1.id).status == BatchStatus.SUCCEEDED
    (head, *_) = outbox.steps(d1.id)
    assert head.status == StepStatus.DONE and head.attempts == 1  # the interrupted attempt
    assert invariant_violations(config["database_url"], final=True) == []


# -- a frozen holder ------------------------------------------------------------------------


def _wait_until_frozen_in_slice(database_url: str, batch_key: str, child: subprocess.Popen):
    """Until the child sits at its failpoint inside the open slice transaction (its last
    COPY done, its scope lock held), then SIGSTOP it: heartbeat and all."""
    repo = BatchRepository(database_url)
    deadline = time.monotonic() + _FROZEN_WAIT_SECONDS
    while time.monotonic() < deadline:
        assert child.poll() is None, child.communicate()
        batches = [b for b in repo.list() if b.delivery_key == batch_key]
        session = batches[0].details.get("warehouse_session") if batches else None
        if session:
            with connect(database_url) as conn:
                row = conn.execute(
                    "SELECT state, query FROM pg_stat_activity WHERE pid = %s", (session["pid"],)
                ).fetchone()
            if row and row[0] == "idle in transaction" and row[1].startswith(_LAST_COPY):
                os.kill(child.pid, signal.SIGSTOP)
                return batches[0]
        time.sleep(0.05)
    raise AssertionError("the child never reached its failpoint inside the slice")


@pytest.mark.parametrize("successor", ["other_key", "same_key", "drain"])
def test_a_frozen_holder_does_not_block_its_successor(
    successor: str, config, s3, landing_bucket: str, tmp_path: Path
) -> None:
    database_url = config["database_url"]
    repo = BatchRepository(database_url)
    ctx, _ = soak_worker.build({**config, "worker": "parent"})
    old, new = _sources(landing_bucket)
    upload_sources(s3, [old])
    first = import_folder(ctx, ACME, old.folder, "d0")
    assert isinstance(first, Committed) and first.published
    upload_sources(s3, [new])

    release = tmp_path / "never"
    frozen = subprocess.Popen(
        worker_command(
            {**config, "mode": "once", "folder": new.folder, "key": "d1", "worker": "frozen"}
        ),
        env=worker_env(f"after_staging_rows=wait:{release}"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        d1 = _wait_until_frozen_in_slice(database_url, "d1", frozen)
        time.sleep(_TTL + _EXPIRY_MARGIN)
        # The successor runs while the holder is still frozen: a wait on its locks would
        # outlast the child's timeout.
        if successor == "drain":
            (outcome,) = settle_abandoned_batches(ctx, "drain-1", limit=10)
            assert isinstance(outcome, Failed) and outcome.kind == FailureKind.ABANDONED
            _assert_abandoned(repo, d1.id)
            key = "d2"
        else:
            key = "d1" if successor == "same_key" else "d2"
        result = _deliver(config, new.folder, key)
        if successor == "other_key":  # the same content: continued, not failed
            assert result["batch_id"] == str(d1.id)
        owner = uuid.UUID(result["batch_id"])
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
        release.touch()
        _, stderr = frozen.communicate(timeout=120)
    # Fenced: woken, the old holder wrote nothing (its session was ended, its lease gone).
    assert frozen.returncode != 0, stderr
    assert "LeaseLost" in stderr or "terminat" in stderr, stderr[-2000:]
    with connect(database_url) as conn:
        assert slice_differences(conn, new, owner) == []
    assert repo.get(owner).status == BatchStatus.SUCCEEDED
    assert invariant_violations(database_url, final=True) == []


# -- the sweep ------------------------------------------------------------------------------


@pytest.mark.parametrize("settled_by", ["import", "drain"])
def test_the_sweep_restarts_a_folder_whose_import_died(
    settled_by: str, config, s3, landing_bucket: str
) -> None:
    """The sweep skips a folder while its batch runs, and starts it again -- under a new
    key, since Prefect returns the dead run for the old one -- once the batch is abandoned
    (or the drain failed it as abandoned). The new run continues or replaces it."""
    database_url = config["database_url"]
    repo = BatchRepository(database_url)
    ctx, _ = soak_worker.build({**config, "worker": "parent"})
    old, _ = _sources(landing_bucket)
    upload_sources(s3, [old])
    bucket, prefix = split_folder(old.folder)
    put_objects(s3, bucket, {prefix + "_SUCCESS": b""})

    def plan():
        scan = find_ready_folders(s3, landing_bucket, completion=Marker())
        return plan_sweep(scan, SweepRepository(database_url), lease_ttl=_TTL)

    [first] = plan().start
    d1 = _die_at(config, old.folder, first.delivery_key, "after_normalized_file")
    [(_, reason, *_)] = plan().skip
    assert f"batch {d1.id} is running" in reason

    time.sleep(_TTL + _EXPIRY_MARGIN)
    if settled_by == "drain":
        (outcome,) = settle_abandoned_batches(ctx, "drain-1", limit=10)
        assert isinstance(outcome, Failed) and outcome.kind == FailureKind.ABANDONED
    [again] = plan().start
    assert again.delivery_key not in (first.delivery_key, "")
    result = _deliver(config, old.folder, again.delivery_key)
    if settled_by == "import":
        assert result["batch_id"] == str(d1.id)  # the same content: continued
    else:
        _assert_abandoned(repo, d1.id)
    [(_, reason, *_)] = plan().skip
    assert "already loaded" in reason
    assert invariant_violations(database_url, final=True) == []
