"""The operational store's rules, one at a time, against a real PostgreSQL."""

from __future__ import annotations

import time
import uuid

import psycopg
import pytest

from fleet_import.errors import InvalidInput, LeaseLost, OperationalStoreError
from fleet_import.scope import Tenant, source_scope
from fleet_import.store.details import FailureKind
from fleet_import.store.models import (
    BatchNotRunning,
    BatchStatus,
    ContinueExisting,
    LeaseAcquired,
    LeaseHeld,
    NotResumable,
    Reserved,
    Resumed,
    ScopeBusy,
    SourceType,
)
from fleet_import.store.repository import BatchRepository, InvalidTransition

SCOPE = source_scope("s3://fleet-landing/acme/fleet/2026-07-22/")
OTHER_SCOPE = source_scope("s3://fleet-landing/acme/fleet/2026-07-23/")


def reserve_new(repo: BatchRepository, tenant: Tenant, scope: str = SCOPE, key: str = "d1"):
    outcome = repo.reserve(tenant, scope, key)
    assert isinstance(outcome, Reserved), outcome
    return outcome.batch


def committed_then_failed(
    repo: BatchRepository, tenant: Tenant, scope: str = SCOPE, key: str = "d1"
):
    """A batch whose slice committed but whose publication failed: resumable."""
    batch = reserve_new(repo, tenant, scope, key)
    assert isinstance(repo.acquire_lease(batch.id, "w1", 60), LeaseAcquired)
    repo.mark_committed(batch.id, "w1", row_counts={"trips": 3}, publication_steps=["notify"])
    repo.mark_failed(batch.id, "w1", FailureKind.FAILED_PUBLICATION, "notify timed out")
    return batch


def test_reservation_writes_a_fleet_batch(repo: BatchRepository, acme: Tenant) -> None:
    batch = reserve_new(repo, acme)
    assert batch.status == BatchStatus.RUNNING
    assert batch.source_type == SourceType.FLEET_S3
    assert batch.mode == "file_upload"
    assert batch.pipeline_stage == "fleet_s3_direct_to_curated"
    assert batch.business_date is None and batch.is_current is False
    assert batch.source_scope == SCOPE and batch.delivery_key == "d1"
    assert batch.record.phase == "reserved" and batch.details["version"] == 1
    assert repo.get(batch.id) == batch


def test_second_delivery_of_a_running_scope_is_busy(repo: BatchRepository, acme: Tenant) -> None:
    first = reserve_new(repo, acme)
    outcome = repo.reserve(acme, SCOPE, "d2")
    assert outcome == ScopeBusy(first.id, "d1")
    assert len(repo.list()) == 1


def test_same_delivery_continues_the_running_batch(repo: BatchRepository, acme: Tenant) -> None:
    first = reserve_new(repo, acme)
    outcome = repo.reserve(acme, SCOPE, "d1")
    assert isinstance(outcome, ContinueExisting) and outcome.batch.id == first.id


def test_a_succeeded_delivery_is_not_reloaded(repo: BatchRepository, acme: Tenant) -> None:
    first = reserve_new(repo, acme)
    repo.acquire_lease(first.id, "w1", 60)
    repo.mark_committed(first.id, "w1", row_counts={})
    repo.mark_succeeded(first.id, "w1")
    again = repo.reserve(acme, SCOPE, "d1")
    assert isinstance(again, ContinueExisting) and again.batch.id == first.id
    assert repo.acquire_lease(first.id, "w2", 60) == BatchNotRunning(BatchStatus.SUCCEEDED)
    assert len(repo.list()) == 1


def test_a_failed_delivery_rerun_starts_a_fresh_batch(repo: BatchRepository, acme: Tenant) -> None:
    first = reserve_new(repo, acme)
    repo.acquire_lease(first.id, "w1", 60)
    repo.mark_failed(first.id, "w1", FailureKind.FAILED_PRE_COMMIT, "bad header")
    again = repo.reserve(acme, SCOPE, "d1")
    assert isinstance(again, Reserved) and again.batch.id != first.id
    assert repo.get(first.id).status == BatchStatus.FAILED


def test_other_folders_and_tenants_never_conflict(
    repo: BatchRepository, acme: Tenant, globex: Tenant
) -> None:
    reserve_new(repo, acme)
    reserve_new(repo, acme, OTHER_SCOPE)
    reserve_new(repo, globex)
    assert len(repo.list(status="running")) == 3


@pytest.mark.parametrize("end", ["failed", "succeeded"])
def test_finished_batches_free_the_scope(repo: BatchRepository, acme: Tenant, end: str) -> None:
    batch = reserve_new(repo, acme)
    repo.acquire_lease(batch.id, "w1", 60)
    if end == "failed":
        repo.mark_failed(batch.id, "w1", FailureKind.FAILED_PRE_COMMIT, "no trips file")
    else:
        repo.mark_committed(batch.id, "w1", row_counts={})
        repo.mark_succeeded(batch.id, "w1")
    assert repo.get(batch.id).status == end
    second = reserve_new(repo, acme, key="d2")
    assert second.id != batch.id


def test_enqueue_failure_frees_the_scope_without_a_lease(
    repo: BatchRepository, acme: Tenant
) -> None:
    batch = reserve_new(repo, acme)
    failed = repo.mark_failed(batch.id, None, FailureKind.ENQUEUE_FAILED, "deployment not found")
    assert failed.status == BatchStatus.FAILED
    assert failed.details["failure"]["kind"] == "enqueue_failed"
    assert failed.details["failure"]["error"] == "deployment not found"
    assert failed.details["failure"]["at"].endswith("Z")
    reserve_new(repo, acme, key="d2")


def test_enqueue_failure_cannot_fail_a_leased_batch(repo: BatchRepository, acme: Tenant) -> None:
    batch = reserve_new(repo, acme)
    repo.acquire_lease(batch.id, "w1", 60)
    with pytest.raises(LeaseLost):
        repo.mark_failed(batch.id, None, FailureKind.ENQUEUE_FAILED, "late")
    assert repo.get(batch.id).status == BatchStatus.RUNNING


def test_lease_is_exclusive_and_reentrant(repo: BatchRepository, acme: Tenant) -> None:
    batch = reserve_new(repo, acme)
    acquired = repo.acquire_lease(batch.id, "w1", 60)
    assert isinstance(acquired, LeaseAcquired)
    held = repo.acquire_lease(batch.id, "w2", 60)
    assert isinstance(held, LeaseHeld) and held.owner == "w1"
    assert held.expires_at == acquired.expires_at
    assert isinstance(repo.acquire_lease(batch.id, "w1", 60), LeaseAcquired)


def test_lease_times_come_from_the_database_clock(
    repo: BatchRepository, acme: Tenant, database_url: str
) -> None:
    batch = reserve_new(repo, acme)
    acquired = repo.acquire_lease(batch.id, "w1", 30)
    with psycopg.connect(database_url) as conn:
        db_now = conn.execute("SELECT now()").fetchone()[0]
    assert 25 < (acquired.expires_at - db_now).total_seconds() <= 30


def test_expired_lease_is_taken_over_and_the_old_owner_is_fenced(
    repo: BatchRepository, acme: Tenant
) -> None:
    batch = reserve_new(repo, acme)
    repo.acquire_lease(batch.id, "old", 0.2)
    time.sleep(0.3)
    assert isinstance(repo.acquire_lease(batch.id, "new", 60), LeaseAcquired)
    with pytest.raises(LeaseLost, match="'new'"):
        repo.renew_lease(batch.id, "old", 60)
    assert repo.release_lease(batch.id, "old") is False
    for transition in (
        lambda: repo.update_details(batch.id, "old", {"phase": "discovered"}),
        lambda: repo.mark_committed(batch.id, "old", row_counts={"trips": 1}),
        lambda: repo.mark_failed(batch.id, "old", FailureKind.FAILED_PRE_COMMIT, "x"),
        lambda: repo.mark_succeeded(batch.id, "old"),
    ):
        with pytest.raises(LeaseLost):
            transition()
    after = repo.get(batch.id)
    assert after.status == BatchStatus.RUNNING and after.execution_lease_id == "new"
    assert after.record.phase == "reserved"


def test_renewed_lease_is_not_taken(repo: BatchRepository, acme: Tenant) -> None:
    batch = reserve_new(repo, acme)
    repo.acquire_lease(batch.id, "w1", 0.5)
    for _ in range(4):
        time.sleep(0.25)
        repo.renew_lease(batch.id, "w1", 0.5)
        assert isinstance(repo.acquire_lease(batch.id, "w2", 60), LeaseHeld)


def test_release_frees_the_lease_for_the_next_worker(repo: BatchRepository, acme: Tenant) -> None:
    batch = reserve_new(repo, acme)
    repo.acquire_lease(batch.id, "w1", 60)
    assert repo.release_lease(batch.id, "w1") is True
    assert isinstance(repo.acquire_lease(batch.id, "w2", 60), LeaseAcquired)


@pytest.mark.parametrize("end", ["failed", "succeeded"])
def test_terminal_batches_cannot_be_leased(repo: BatchRepository, acme: Tenant, end: str) -> None:
    batch = reserve_new(repo, acme)
    repo.acquire_lease(batch.id, "w1", 60)
    repo.mark_committed(batch.id, "w1", row_counts={})
    if end == "failed":
        repo.mark_failed(batch.id, "w1", FailureKind.FAILED_PUBLICATION, "x")
    else:
        repo.mark_succeeded(batch.id, "w1")
    assert repo.acquire_lease(batch.id, "w2", 60) == BatchNotRunning(BatchStatus(end))
    with pytest.raises(LeaseLost):
        repo.renew_lease(batch.id, "w1", 60)


def test_unknown_batch(repo: BatchRepository) -> None:
    missing = uuid.uuid4()
    assert repo.get(missing) is None
    assert repo.acquire_lease(missing, "w1", 60) == BatchNotRunning(None)
    assert isinstance(repo.resume_publication(missing, SourceType.FLEET_S3, SCOPE), NotResumable)


def test_commit_records_details_and_enqueues_publication_together(
    repo: BatchRepository, acme: Tenant, database_url: str
) -> None:
    batch = reserve_new(repo, acme)
    repo.acquire_lease(batch.id, "w1", 60)
    committed = repo.mark_committed(
        batch.id, "w1", row_counts={"trips": 10}, publication_steps=["refresh", "notify", "retire"]
    )
    details = committed.record
    assert details.warehouse_committed and details.phase == "committed"
    assert details.row_counts == {"trips": 10}
    with psycopg.connect(database_url) as conn:
        steps = conn.execute(
            "SELECT step, seq, status FROM publication_outbox WHERE batch_id = %s ORDER BY seq",
            (batch.id,),
        ).fetchall()
    assert steps == [("refresh", 1, "pending"), ("notify", 2, "pending"), ("retire", 3, "pending")]


def test_cannot_succeed_before_commit(repo: BatchRepository, acme: Tenant) -> None:
    batch = reserve_new(repo, acme)
    repo.acquire_lease(batch.id, "w1", 60)
    with pytest.raises(InvalidTransition, match="never recorded"):
        repo.mark_succeeded(batch.id, "w1")
    succeeded = repo.mark_committed(batch.id, "w1", row_counts={})
    succeeded = repo.mark_succeeded(batch.id, "w1")
    assert succeeded.status == BatchStatus.SUCCEEDED
    assert succeeded.record.phase == "published"


def test_terminal_rows_are_never_rewritten(repo: BatchRepository, acme: Tenant) -> None:
    batch = reserve_new(repo, acme)
    repo.acquire_lease(batch.id, "w1", 60)
    repo.mark_failed(batch.id, "w1", FailureKind.FAILED_PRE_COMMIT, "bad header")
    before = repo.get(batch.id)
    with pytest.raises(LeaseLost):
        repo.mark_failed(batch.id, "w1", FailureKind.FAILED_PUBLICATION, "again")
    with pytest.raises(LeaseLost):
        repo.update_details(batch.id, "w1", {"phase": "committed"})
    assert repo.get(batch.id) == before


def test_valid_resume_reacquires_the_scope(repo: BatchRepository, acme: Tenant) -> None:
    batch = committed_then_failed(repo, acme)
    outcome = repo.resume_publication(batch.id, SourceType.FLEET_S3, SCOPE)
    assert isinstance(outcome, Resumed)
    resumed = outcome.batch
    assert resumed.status == BatchStatus.RUNNING and resumed.execution_lease_id is None
    assert resumed.details["resumes"] == 1
    assert resumed.details["last_failure"]["kind"] == "failed_publication"
    assert "failure" not in resumed.details
    assert isinstance(repo.reserve(acme, SCOPE, "d9"), ScopeBusy)
    assert isinstance(repo.acquire_lease(batch.id, "w2", 60), LeaseAcquired)


def test_resume_conflicts_with_a_newer_running_batch(repo: BatchRepository, acme: Tenant) -> None:
    batch = committed_then_failed(repo, acme)
    newer = reserve_new(repo, acme, key="d2")
    assert repo.resume_publication(batch.id, SourceType.FLEET_S3, SCOPE) == ScopeBusy(
        newer.id, "d2"
    )
    assert repo.get(batch.id).status == BatchStatus.FAILED


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        ("pre_commit", "never committed"),
        ("succeeded", "already succeeded"),
        ("running", "still running"),
        ("superseded", "superseded by"),
        ("expired", "publication expired"),
        ("published", "already finished its publication"),
        ("garbled", "do not parse"),
        ("wrong_scope", "imports"),
        ("wrong_type", "not kds_cdc"),
    ],
)
def test_resume_refusals(
    repo: BatchRepository, acme: Tenant, database_url: str, setup: str, reason: str
) -> None:
    scope, source_type = SCOPE, SourceType.FLEET_S3
    if setup in ("pre_commit", "running", "succeeded"):
        batch = reserve_new(repo, acme)
        repo.acquire_lease(batch.id, "w1", 60)
        if setup == "pre_commit":
            repo.mark_failed(batch.id, "w1", FailureKind.FAILED_PRE_COMMIT, "bad")
        if setup == "succeeded":
            repo.mark_committed(batch.id, "w1", row_counts={})
            repo.mark_succeeded(batch.id, "w1")
    else:
        batch = committed_then_failed(repo, acme)
        patch = {
            "superseded": "jsonb_build_object('superseded_by', gen_random_uuid()::text)",
            "expired": "'{\"publication_expired\": true}'::jsonb",
            "published": '\'{"phase": "published"}\'::jsonb',
            "garbled": "'{\"version\": 7}'::jsonb",
        }.get(setup)
        if patch:
            with psycopg.connect(database_url) as conn:
                conn.execute(
                    f"UPDATE ingestion_batches SET details = details || {patch} WHERE id = %s",
                    (batch.id,),
                )
        scope = OTHER_SCOPE if setup == "wrong_scope" else scope
        source_type = SourceType.KDS_CDC if setup == "wrong_type" else source_type
    before = repo.get(batch.id)
    outcome = repo.resume_publication(batch.id, source_type, scope)
    assert isinstance(outcome, NotResumable) and reason in outcome.reason, outcome
    assert repo.get(batch.id) == before


def test_resume_happens_once(repo: BatchRepository, acme: Tenant) -> None:
    batch = committed_then_failed(repo, acme)
    assert isinstance(repo.resume_publication(batch.id, SourceType.FLEET_S3, SCOPE), Resumed)
    again = repo.resume_publication(batch.id, SourceType.FLEET_S3, SCOPE)
    assert isinstance(again, NotResumable) and "still running" in again.reason


def test_list_filters_and_orders(repo: BatchRepository, acme: Tenant, globex: Tenant) -> None:
    a1 = reserve_new(repo, acme)
    a2 = reserve_new(repo, acme, OTHER_SCOPE)
    g1 = reserve_new(repo, globex)
    repo.acquire_lease(a1.id, "w", 60)
    repo.mark_failed(a1.id, "w", FailureKind.FAILED_PRE_COMMIT, "x")
    assert [b.id for b in repo.list()] == [g1.id, a2.id, a1.id]
    assert [b.id for b in repo.list(tenant="acme")] == [a2.id, a1.id]
    assert [b.id for b in repo.list(tenant="acme", status="failed")] == [a1.id]
    assert [b.id for b in repo.list(limit=1)] == [g1.id]
    with pytest.raises(ValueError):
        repo.list(status="exploded")


@pytest.mark.parametrize(
    ("scope", "key"), [("", "d1"), ("x" * 201, "d1"), (SCOPE, ""), (SCOPE, "k" * 201)]
)
def test_bad_reservation_input_writes_nothing(
    repo: BatchRepository, acme: Tenant, scope: str, key: str
) -> None:
    with pytest.raises(InvalidInput):
        repo.reserve(acme, scope, key)
    assert repo.list() == []


def test_driver_errors_are_translated(pg_server_url: str) -> None:
    from tests.pgtools import with_dbname

    repo = BatchRepository(with_dbname(pg_server_url, "no_such_database_here"))
    with pytest.raises(OperationalStoreError) as error:
        repo.list()
    assert error.value.transient is True
    assert not isinstance(error.value, psycopg.Error)


def test_details_stored_before_the_rename_read_as_warehouse_committed() -> None:
    from fleet_import.store.details import BatchDetails, warehouse_committed

    assert BatchDetails.parse({"redshift_committed": True}).warehouse_committed
    assert BatchDetails.parse({"warehouse_committed": True}).warehouse_committed
    assert not BatchDetails.parse({}).warehouse_committed
    assert "redshift_committed" not in BatchDetails.parse({}).to_json()
    assert warehouse_committed({"redshift_committed": True})
    assert not warehouse_committed({"warehouse_committed": False})


def test_an_approvals_commit_decides_the_held_batch_in_its_own_transaction(
    repo: BatchRepository, acme: Tenant
) -> None:
    # Whoever records the approval batch's commit (the run, the drain, resume) decides the
    # held batch it approves; a commit refused for a lost lease decides nothing.
    held = reserve_new(repo, acme, key="d1")
    assert isinstance(repo.acquire_lease(held.id, "w1", 60), LeaseAcquired)
    repo.mark_failed(held.id, "w1", FailureKind.HELD, "held for review", {"held": {}})
    approval = reserve_new(repo, acme, key=f"approve:{held.id}")
    assert isinstance(repo.acquire_lease(approval.id, "w2", 60), LeaseAcquired)
    repo.update_details(approval.id, "w2", {"approves": str(held.id)})

    with pytest.raises(LeaseLost):
        repo.mark_committed(approval.id, "intruder", row_counts={"trips": 1})
    assert "review" not in repo.get(held.id).details

    repo.mark_committed(approval.id, "w2", row_counts={"trips": 1}, publication_steps=["notify"])
    review = repo.get(held.id).details["review"]
    assert (review["decision"], review["batch_id"]) == ("approved", str(approval.id))
    repo.mark_committed(approval.id, "w2", row_counts={"trips": 1})  # recorded again: same
    assert repo.get(held.id).details["review"]["batch_id"] == str(approval.id)


def test_a_holder_frozen_inside_its_transaction_does_not_hold_the_scope(
    database_url: str, acme: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A holder whose renewal updated its batch's row and then stopped before its COMMIT (a
    SIGSTOP, a paused VM) kept the row locked: a successor's reservation of the scope, with
    another delivery key, waited on it until its own reply bound failed it. The server now
    ends a store transaction left idle (SqlStore.idle_in_transaction_seconds)."""
    monkeypatch.setattr(BatchRepository, "idle_in_transaction_seconds", 0.5)
    holder, successor = BatchRepository(database_url), BatchRepository(database_url, 20)
    batch = reserve_new(holder, acme)
    assert isinstance(holder.acquire_lease(batch.id, "w1", 60), LeaseAcquired)
    outcome = None
    with pytest.raises(OperationalStoreError), holder._transaction() as frozen:
        frozen.execute("UPDATE ingestion_batches SET updated_at = now() WHERE id = %s", (batch.id,))
        outcome = successor.reserve(acme, SCOPE, "d2")  # waits on the frozen row lock
    # In this order: the server ended the frozen transaction (its COMMIT then failed), which
    # let the successor's reservation through with an answer. Had the successor's own reply
    # bound ended the wait instead, reserve would have raised and left no outcome.
    assert isinstance(outcome, ScopeBusy) and outcome.holder_batch_id == batch.id, outcome
