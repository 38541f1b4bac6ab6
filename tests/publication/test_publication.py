"""Publication from the outbox against a real PostgreSQL: order, retries, claims, expiry,
retirement. Handlers record every call in a real table, so double runs are counted, not
guessed; the slice registry is a real table read by a stand-in implementing `slice_owner`."""

from __future__ import annotations

import multiprocessing
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import psycopg
import pytest

from fleet_import.errors import LeaseLost
from fleet_import.publication.outcomes import (
    PublicationDeferred,
    PublicationExpired,
    PublicationFailed,
    Published,
)
from fleet_import.publication.publisher import (
    DEFAULT_PUBLICATION_STEPS,
    Publisher,
    StepContext,
    StepHandler,
    published_event_id,
)
from fleet_import.retry import Backoff
from fleet_import.s3.staging import StagingArea
from fleet_import.scope import Tenant, source_scope
from fleet_import.store.details import FailureKind
from fleet_import.store.models import (
    Batch,
    BatchStatus,
    CachedFile,
    LeaseAcquired,
    NotResumable,
    Reserved,
    Resumed,
    SourceType,
)
from fleet_import.store.outbox import ClaimLost, OutboxRepository, StepStatus
from fleet_import.store.repository import BatchRepository
from tests.processes import results_of

FOLDER = "s3://fleet-landing/acme/fleet/2026-07-22/"
SCOPE = source_scope(FOLDER)
NO_BACKOFF = Backoff((0.0,))
RACE_DEADLINE_SECONDS = 20.0
HANDLER_SECONDS = 0.01  # long enough for racing drains to overlap inside a step

# forkserver: children start from a clean, single-threaded server, each with its own
# connections; the preload keeps the starts cheap.
_FORK = multiprocessing.get_context("forkserver")
_FORK.set_forkserver_preload(
    ["fleet_import.publication.publisher", "tests.publication.test_publication"]
)

_TEST_TABLES = """
CREATE TABLE IF NOT EXISTS test_slices (
    tenant_id text NOT NULL, source_scope text NOT NULL, batch_id uuid NOT NULL,
    PRIMARY KEY (tenant_id, source_scope)
);
CREATE TABLE IF NOT EXISTS test_executions (
    id bigserial PRIMARY KEY, batch_id uuid NOT NULL, step text NOT NULL, worker text NOT NULL,
    ok boolean NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp()
);
"""


# -- stand-ins backed by real tables ----------------------------------------------------------


class SliceTable:
    """The slice registry part of the Warehouse protocol, on a table of the test database."""

    def __init__(self, url: str) -> None:
        self._url = url

    def slice_owner(self, tenant_id: str, source_scope: str) -> uuid.UUID | None:
        with psycopg.connect(self._url) as conn:
            row = conn.execute(
                "SELECT batch_id FROM test_slices WHERE tenant_id = %s AND source_scope = %s",
                (tenant_id, source_scope),
            ).fetchone()
        return None if row is None else row[0]

    def stamp(self, tenant_id: str, source_scope: str, batch_id: uuid.UUID) -> None:
        with psycopg.connect(self._url) as conn:
            conn.execute(
                "INSERT INTO test_slices VALUES (%s, %s, %s) ON CONFLICT (tenant_id, source_scope)"
                " DO UPDATE SET batch_id = EXCLUDED.batch_id",
                (tenant_id, source_scope, batch_id),
            )


class Recorder:
    """Wraps step handlers: every call is a row of test_executions; `fail` makes a step raise
    for its first N calls (or forever with -1)."""

    def __init__(self, url: str, *, delay: float = 0.0) -> None:
        self._url, self._delay = url, delay
        self.fail: dict[str, int] = {}
        self._lock = threading.Lock()

    def wrap(self, publisher: Publisher) -> Publisher:
        for name, handler in list(publisher.steps.items()):
            publisher.steps[name] = self._recording(name, handler)
        return publisher

    def _recording(self, name: str, handler: StepHandler) -> StepHandler:
        def run(ctx: StepContext) -> None:
            with self._lock:
                remaining = self.fail.get(name, 0)
                if remaining > 0:
                    self.fail[name] = remaining - 1
            failing = remaining != 0
            self._record(ctx, ok=not failing)
            if failing:
                raise RuntimeError(f"{name} is down")
            time.sleep(self._delay)
            handler(ctx)

        return run

    def _record(self, ctx: StepContext, *, ok: bool) -> None:
        with psycopg.connect(self._url) as conn:
            conn.execute(
                "INSERT INTO test_executions (batch_id, step, worker, ok) VALUES (%s, %s, %s, %s)",
                (ctx.batch.id, ctx.step.step, ctx.worker, ok),
            )


def calls(url: str, batch_id: uuid.UUID | None = None) -> list[tuple[str, bool]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT step, ok FROM test_executions WHERE %(b)s::uuid IS NULL OR batch_id = %(b)s"
            " ORDER BY at, id",
            {"b": batch_id},
        ).fetchall()
    return [(step, ok) for step, ok in rows]


# -- fixtures and helpers -------------------------------------------------------------------


@pytest.fixture
def tables(database_url: str) -> str:
    with psycopg.connect(database_url) as conn:
        conn.execute(_TEST_TABLES)
    return database_url


@pytest.fixture
def outbox(database_url: str) -> OutboxRepository:
    return OutboxRepository(database_url)


@pytest.fixture
def slices(tables: str) -> SliceTable:
    return SliceTable(tables)


@pytest.fixture
def events() -> list[tuple[str, dict[str, Any]]]:
    return []


@pytest.fixture
def staging(tmp_path: Path) -> StagingArea:
    return StagingArea(str(tmp_path / "staging"))


def make_publisher(
    url: str,
    *,
    events: list[tuple[str, dict[str, Any]]] | None = None,
    recorder: Recorder | None = None,
    **options: Any,
) -> Publisher:
    sink = events if events is not None else []

    def emit(name: str, payload: Mapping[str, Any]) -> None:
        sink.append((name, dict(payload)))

    publisher = Publisher(
        BatchRepository(url),
        OutboxRepository(url),
        SliceTable(url),
        events=emit,
        **{"backoff": NO_BACKOFF, **options},
    )
    return recorder.wrap(publisher) if recorder is not None else publisher


def committed(
    repo: BatchRepository,
    slices: SliceTable,
    *,
    tenant: Tenant | None = None,
    folder: str = FOLDER,
    key: str = "d1",
    owner: str | None = "importer",
    steps: tuple[str, ...] = DEFAULT_PUBLICATION_STEPS,
    manifest_keys: tuple[str, ...] = (),
    manifest_objects: tuple[dict[str, str], ...] = (),
    contract_versions: dict[str, str] | None = None,
    cache: Callable[[Batch], None] | None = None,
    stamp: bool = True,
) -> Batch:
    """A batch as the importer leaves it after step 6: committed, outbox enqueued, slice
    stamped. owner=None: the importer released its lease (a drain may take the batch)."""
    tenant = tenant or Tenant.named("acme")
    outcome = repo.reserve(tenant, source_scope(folder), key)
    assert isinstance(outcome, Reserved), outcome
    batch = outcome.batch
    assert isinstance(repo.acquire_lease(batch.id, "importer", 60), LeaseAcquired)
    if cache is not None:
        cache(batch)
    objects = [{"key": k} for k in manifest_keys] + list(manifest_objects)
    patch: dict[str, Any] = {"manifest": {"folder": folder, "objects": objects}}
    if contract_versions is not None:
        patch["contract_versions"] = contract_versions
    repo.mark_committed(
        batch.id,
        "importer",
        row_counts={"trips": 3, "vehicles": 2},
        publication_steps=steps,
        patch=patch,
    )
    if stamp:
        slices.stamp(tenant.tenant_id, source_scope(folder), batch.id)
    if owner is None:
        repo.release_lease(batch.id, "importer")
    got = repo.get(batch.id)
    assert got is not None
    return got


def statuses(outbox: OutboxRepository, batch_id: uuid.UUID) -> dict[str, str]:
    return {s.step: str(s.status) for s in outbox.steps(batch_id)}


# -- the happy path ---------------------------------------------------------------------------


def test_steps_run_in_order_and_the_batch_succeeds(
    repo: BatchRepository, slices: SliceTable, tables: str, events: list
) -> None:
    with psycopg.connect(tables) as conn:
        conn.execute("CREATE TABLE test_trips (id int)")
        conn.execute(
            "CREATE MATERIALIZED VIEW test_trip_counts AS SELECT count(*) AS n FROM test_trips"
        )
        conn.execute("INSERT INTO test_trips SELECT generate_series(1, 3)")

    def run_sql(statement: str) -> None:
        with psycopg.connect(tables, autocommit=True) as conn:
            conn.execute(statement)  # type: ignore[arg-type]

    publisher = make_publisher(
        tables,
        events=events,
        recorder=Recorder(tables),
        refresh_sql=["REFRESH MATERIALIZED VIEW test_trip_counts"],
        run_warehouse_sql=run_sql,
    )
    batch = committed(repo, slices)

    outcome = publisher.publish_batch(batch.id, "importer", "importer")

    assert outcome == Published(batch.id, DEFAULT_PUBLICATION_STEPS)
    assert calls(tables) == [(step, True) for step in DEFAULT_PUBLICATION_STEPS]
    with psycopg.connect(tables) as conn:
        assert conn.execute("SELECT n FROM test_trip_counts").fetchone() == (3,)
    done = repo.get(batch.id)
    assert done is not None and done.status == BatchStatus.SUCCEEDED
    assert done.details["phase"] == "published"
    assert done.details["publication"]["notify"] == {"status": "done", "attempts": 0}
    assert set(statuses(OutboxRepository(tables), batch.id).values()) == {"done"}
    payload = {
        "tenant_id": "acme",
        "source_scope": SCOPE,
        "batch_id": str(batch.id),
        "row_counts": {"trips": 3, "vehicles": 2},
    }
    event_id = str(published_event_id(batch.id))
    assert events == [
        ("fleet.slice.published", {**payload, "event_id": event_id}),
        ("fleet.batch.published", payload),
    ]
    # A notify step that runs again (its completion lost) repeats the same event id.
    step = OutboxRepository(tables).steps(batch.id)[1]
    publisher.notify(StepContext(done, step, "importer"))
    assert events[-1] == ("fleet.slice.published", {**payload, "event_id": event_id})
    assert published_event_id(batch.id) != published_event_id(uuid.uuid4())


def test_a_batch_without_steps_succeeds(
    repo: BatchRepository, slices: SliceTable, tables: str
) -> None:
    batch = committed(repo, slices, steps=())
    assert make_publisher(tables).publish_batch(batch.id, "importer", "importer") == Published(
        batch.id, ()
    )


# -- order, retries, dead steps -------------------------------------------------------------


def test_notify_failing_twice_holds_back_retire_across_drains(
    repo: BatchRepository, outbox: OutboxRepository, slices: SliceTable, tables: str
) -> None:
    recorder = Recorder(tables)
    recorder.fail["notify"] = 2
    publisher = make_publisher(tables, recorder=recorder)
    batch = committed(repo, slices)

    first = publisher.publish_batch(batch.id, "importer", "importer")
    repo.release_lease(batch.id, "importer")  # the importer gives up; drains continue
    assert first == PublicationFailed(batch.id, "notify", "RuntimeError: notify is down", 1, False)
    assert statuses(outbox, batch.id) == {
        "refresh_dependants": "done",
        "notify": "pending",
        "retire_superseded": "pending",
    }

    (second,) = publisher.drain("drain-1", lease_ttl=30)
    assert isinstance(second, PublicationFailed) and second.attempts == 2 and not second.dead
    assert "retire_superseded" not in [step for step, _ in calls(tables)]
    running = repo.get(batch.id)
    assert running is not None and running.status == BatchStatus.RUNNING
    assert running.execution_lease_id is None  # released for the next drain

    assert publisher.drain("drain-2", lease_ttl=30) == [
        Published(batch.id, DEFAULT_PUBLICATION_STEPS)
    ]
    assert calls(tables) == [
        ("refresh_dependants", True),
        ("notify", False),
        ("notify", False),
        ("notify", True),
        ("retire_superseded", True),
    ]
    assert [s.attempts for s in outbox.steps(batch.id)] == [0, 2, 0]


def test_a_step_in_backoff_is_deferred_not_waited_for(
    repo: BatchRepository,
    outbox: OutboxRepository,
    slices: SliceTable,
    tables: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recorder = Recorder(tables)
    recorder.fail["notify"] = 1
    publisher = make_publisher(tables, recorder=recorder, backoff=Backoff((3600.0,), jitter=0.0))
    batch = committed(repo, slices)

    assert isinstance(publisher.publish_batch(batch.id, "importer", "importer"), PublicationFailed)
    slept: list[float] = []
    with monkeypatch.context() as patched:  # a wait for the backoff would be asked of sleep
        patched.setattr(time, "sleep", slept.append)
        deferred = publisher.publish_batch(batch.id, "importer", "importer")
    assert isinstance(deferred, PublicationDeferred) and deferred.step == "notify"
    assert slept == []  # returned at once: nothing waited for the hour of backoff
    assert [step for step, _ in calls(tables)] == ["refresh_dependants", "notify"]
    assert statuses(outbox, batch.id)["retire_superseded"] == "pending"  # never jumps the queue
    repo.release_lease(batch.id, "importer")
    assert outbox.batches_with_open_steps(10) == []  # nothing for a drain until the backoff ends
    assert publisher.drain("drain-1", lease_ttl=30) == []
    assert [step for step, _ in calls(tables)] == ["refresh_dependants", "notify"]

    with psycopg.connect(tables) as conn:  # the hour passes
        conn.execute("UPDATE publication_outbox SET available_at = now() WHERE step = 'notify'")
    assert publisher.drain("drain-2", lease_ttl=30) == [
        Published(batch.id, DEFAULT_PUBLICATION_STEPS)
    ]
    assert [step for step, _ in calls(tables)] == [
        "refresh_dependants",
        "notify",
        "notify",
        "retire_superseded",
    ]


def test_a_step_dies_after_max_attempts_and_waits_for_an_explicit_resume(
    repo: BatchRepository, outbox: OutboxRepository, slices: SliceTable, tables: str, events: list
) -> None:
    recorder = Recorder(tables)
    recorder.fail["notify"] = -1
    publisher = make_publisher(tables, events=events, recorder=recorder, max_attempts=3)
    batch = committed(repo, slices, owner=None)

    outcomes = [publisher.drain(f"drain-{i}", lease_ttl=30) for i in range(3)]
    assert [(o.attempts, o.dead) for (o,) in outcomes] == [(1, False), (2, False), (3, True)]
    failed = repo.get(batch.id)
    assert failed is not None and failed.status == BatchStatus.FAILED
    assert failed.details["failure"]["kind"] == "failed_publication"
    assert "dead after 3 attempts" in failed.details["failure"]["error"]
    assert statuses(outbox, batch.id)["notify"] == "dead"
    assert publisher.drain("drain-4", lease_ttl=30) == []  # no automatic resume
    assert [step for step, _ in calls(tables)].count("notify") == 3
    assert "retire_superseded" not in [step for step, _ in calls(tables)]
    assert events[-1][0] == "fleet.batch.failed"

    assert isinstance(repo.resume_publication(batch.id, SourceType.FLEET_S3, SCOPE), Resumed)
    assert outbox.reopen_dead_steps(batch.id) == 1
    recorder.fail["notify"] = 0
    assert publisher.drain("drain-5", lease_ttl=30) == [
        Published(batch.id, DEFAULT_PUBLICATION_STEPS)
    ]
    assert [step for step, ok in calls(tables) if ok] == list(DEFAULT_PUBLICATION_STEPS)


def test_claims_take_only_the_head_step(
    repo: BatchRepository, outbox: OutboxRepository, slices: SliceTable
) -> None:
    batch = committed(repo, slices)
    first = outbox.claim_next(batch.id, "a", 60)
    assert first is not None and first.step == "refresh_dependants"
    assert first.status == StepStatus.CLAIMED and first.claimed_by == "a"
    assert outbox.claim_next(batch.id, "b", 60) is None  # never step 2 while step 1 is open
    with pytest.raises(ClaimLost):
        outbox.complete(first.id, "b")
    outbox.complete(first.id, "a")

    notify = outbox.claim_next(batch.id, "b", 60)
    assert notify is not None and notify.step == "notify"
    waiting = outbox.fail(notify.id, "b", "smtp down", 5, Backoff((0.4,), jitter=0.0))
    assert waiting.status == StepStatus.PENDING and waiting.attempts == 1
    assert outbox.claim_next(batch.id, "c", 60) is None  # in backoff; retire is not next either
    time.sleep(0.5)

    # A claim that outlives its worker is taken over, and the old worker is fenced out.
    stale = outbox.claim_next(batch.id, "c", 0)
    assert stale is not None and stale.step == "notify"
    taken = outbox.claim_next(batch.id, "d", 60)
    assert taken is not None and taken.id == stale.id and taken.claimed_by == "d"
    assert taken.attempts == 2 and "the claim of c expired" in (taken.last_error or "")
    with pytest.raises(ClaimLost):
        outbox.complete(stale.id, "c")
    with pytest.raises(ClaimLost):
        outbox.fail(stale.id, "c", "late", 5, NO_BACKOFF)
    outbox.complete(taken.id, "d")

    assert outbox.claim_next(batch.id, "e", 60, lease_owner="somebody-else") is None
    retire = outbox.claim_next(batch.id, "e", 60, lease_owner="importer")
    assert retire is not None and retire.step == "retire_superseded"
    dead = outbox.fail(retire.id, "e", "disk full", 1, NO_BACKOFF)
    assert dead.status == StepStatus.DEAD
    assert outbox.claim_next(batch.id, "f", 60) is None
    assert outbox.reopen_dead_steps(batch.id) == 1
    again = outbox.claim_next(batch.id, "f", 60)
    assert again is not None and again.step == "retire_superseded" and again.attempts == 0


def test_drains_see_only_committed_batches_nobody_executes(
    repo: BatchRepository, outbox: OutboxRepository, slices: SliceTable
) -> None:
    leased = committed(repo, slices, key="d1")
    free = committed(repo, slices, folder="s3://fleet-landing/acme/fleet/2026-07-23/", owner=None)
    uncommitted = repo.reserve(
        Tenant.named("acme"), source_scope("s3://fleet-landing/acme/x/"), "d"
    )
    assert isinstance(uncommitted, Reserved)
    assert outbox.batches_with_open_steps(10) == [free.id]
    repo.release_lease(leased.id, "importer")
    assert set(outbox.batches_with_open_steps(10)) == {leased.id, free.id}
    assert len(outbox.batches_with_open_steps(1)) == 1


# -- racing drains ------------------------------------------------------------------------------


def _assert_each_step_ran_once(url: str, batch_ids: list[uuid.UUID]) -> None:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT batch_id, step, count(*), bool_and(ok) FROM test_executions"
            " GROUP BY batch_id, step"
        ).fetchall()
        order = conn.execute(
            "SELECT batch_id, array_agg(step ORDER BY at, id) FROM test_executions"
            " GROUP BY batch_id"
        ).fetchall()
    assert sorted((b, s) for b, s, _, _ in rows) == sorted(
        (b, s) for b in batch_ids for s in DEFAULT_PUBLICATION_STEPS
    )
    assert {count for _, _, count, _ in rows} == {1}
    assert all(ok for *_, ok in rows)
    assert {b: list(steps) for b, steps in order} == {
        b: list(DEFAULT_PUBLICATION_STEPS) for b in batch_ids
    }
    repo = BatchRepository(url)
    assert {repo.get(b).status for b in batch_ids} == {BatchStatus.SUCCEEDED}  # type: ignore[union-attr]


def _many_batches(
    repo: BatchRepository, slices: SliceTable, n: int, owner: str | None
) -> list[uuid.UUID]:
    return [
        committed(
            repo, slices, folder=f"s3://fleet-landing/acme/fleet/2026-08-{i + 1:02d}/", owner=owner
        ).id
        for i in range(n)
    ]


def _drain_until_done(publisher: Publisher, worker: str, repo: BatchRepository) -> int:
    deadline = time.monotonic() + RACE_DEADLINE_SECONDS
    rounds = 0
    while repo.list(status="running") and time.monotonic() < deadline:
        publisher.drain(worker, lease_ttl=30)
        rounds += 1
    return rounds


def _publish_shared_until_done(
    publisher: Publisher, worker: str, repo: BatchRepository, batch_ids: list[uuid.UUID]
) -> Counter[str]:
    """Zombie executors: all believe they hold the lease, so only step claims arbitrate."""
    seen: Counter[str] = Counter()
    deadline = time.monotonic() + RACE_DEADLINE_SECONDS
    while repo.list(status="running") and time.monotonic() < deadline:
        for batch_id in batch_ids:
            try:
                seen[type(publisher.publish_batch(batch_id, "shared", worker)).__name__] += 1
            except LeaseLost:
                seen["LeaseLost"] += 1
    return seen


def _run_threads(target: Callable[[int], object], n: int) -> list[object]:
    barrier = threading.Barrier(n)
    results: list[object] = [None] * n
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait()
            results[i] = target(i)
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=RACE_DEADLINE_SECONDS + 10)
    assert not errors, errors
    return results


def test_threads_racing_drains_never_double_run_a_step(
    repo: BatchRepository, slices: SliceTable, tables: str
) -> None:
    batch_ids = _many_batches(repo, slices, 6, owner=None)
    publisher = make_publisher(tables, recorder=Recorder(tables, delay=HANDLER_SECONDS))
    _run_threads(lambda i: _drain_until_done(publisher, f"drain-{i}", repo), 8)
    _assert_each_step_ran_once(tables, batch_ids)


def test_threads_sharing_a_lease_never_double_run_a_step(
    repo: BatchRepository, slices: SliceTable, tables: str
) -> None:
    batch_ids = _many_batches(repo, slices, 3, owner="importer")
    for batch_id in batch_ids:
        repo.release_lease(batch_id, "importer")
        assert isinstance(repo.acquire_lease(batch_id, "shared", 60), LeaseAcquired)
    publisher = make_publisher(tables, recorder=Recorder(tables, delay=HANDLER_SECONDS))
    seen = _run_threads(
        lambda i: _publish_shared_until_done(publisher, f"w{i}", repo, batch_ids), 8
    )
    _assert_each_step_ran_once(tables, batch_ids)
    assert sum((c for c in seen), Counter())["PublicationBusy"] > 0  # they did collide


def _process_drain(
    url: str, barrier: Any, worker: str, mode: str, batch_ids: list[str], out: Any
) -> None:
    repo = BatchRepository(url)
    publisher = make_publisher(url, recorder=Recorder(url, delay=HANDLER_SECONDS))
    barrier.wait()
    if mode == "drain":
        out.put((worker, _drain_until_done(publisher, worker, repo)))
    else:
        seen = _publish_shared_until_done(
            publisher, worker, repo, [uuid.UUID(b) for b in batch_ids]
        )
        out.put((worker, dict(seen)))


@pytest.mark.parametrize("mode", ["drain", "shared_lease"])
def test_processes_racing_never_double_run_a_step(
    repo: BatchRepository, slices: SliceTable, tables: str, mode: str
) -> None:
    batch_ids = _many_batches(repo, slices, 4, owner=None if mode == "drain" else "importer")
    if mode == "shared_lease":
        for batch_id in batch_ids:
            repo.release_lease(batch_id, "importer")
            assert isinstance(repo.acquire_lease(batch_id, "shared", 60), LeaseAcquired)
    parties = 6
    barrier = _FORK.Barrier(parties)
    out = _FORK.Queue()
    processes = [
        _FORK.Process(
            target=_process_drain,
            args=(tables, barrier, f"p{i}", mode, [str(b) for b in batch_ids], out),
        )
        for i in range(parties)
    ]
    reports = results_of(processes, out, timeout=RACE_DEADLINE_SECONDS + 30)
    assert len(reports) == parties
    _assert_each_step_ran_once(tables, batch_ids)


# -- expiry -------------------------------------------------------------------------------------


def test_a_newer_stamp_before_a_step_expires_the_publication(
    repo: BatchRepository, outbox: OutboxRepository, slices: SliceTable, tables: str, events: list
) -> None:
    newer = uuid.uuid4()
    publisher = make_publisher(tables, events=events, recorder=Recorder(tables))
    notify = publisher.steps["notify"]

    def notify_then_lose_the_slice(ctx: StepContext) -> None:
        notify(ctx)
        slices.stamp("acme", SCOPE, newer)  # a newer batch commits while we publish

    publisher.steps["notify"] = notify_then_lose_the_slice
    batch = committed(repo, slices)

    outcome = publisher.publish_batch(batch.id, "importer", "importer")

    assert outcome == PublicationExpired(batch.id, "retire_superseded", newer)
    assert [step for step, _ in calls(tables)] == ["refresh_dependants", "notify"]
    expired = repo.get(batch.id)
    assert expired is not None and expired.status == BatchStatus.FAILED
    assert expired.details["publication_expired"] is True
    assert expired.details["failure"]["kind"] == "failed_publication"
    assert str(newer) in expired.details["failure"]["error"]
    retire = outbox.steps(batch.id)[-1]
    assert retire.status == StepStatus.PENDING and retire.claimed_by is None
    assert events[-1][0] == "fleet.batch.failed" and events[-1][1]["publication_expired"] is True
    # Nothing more is done for it: drains skip it and a resume is refused.
    repo.release_lease(batch.id, "importer")
    assert publisher.drain("drain", lease_ttl=30) == []
    assert outbox.claim_next(batch.id, "drain", 60) is None
    assert isinstance(repo.resume_publication(batch.id, SourceType.FLEET_S3, SCOPE), NotResumable)
    assert [step for step, _ in calls(tables)] == ["refresh_dependants", "notify"]


@pytest.mark.parametrize("stamped_by_other", [True, False])
def test_a_slice_not_stamped_with_the_batch_publishes_nothing(
    repo: BatchRepository, slices: SliceTable, tables: str, stamped_by_other: bool
) -> None:
    batch = committed(repo, slices, stamp=False)
    other = uuid.uuid4()
    if stamped_by_other:
        slices.stamp("acme", SCOPE, other)
    outcome = make_publisher(tables, recorder=Recorder(tables)).publish_batch(
        batch.id, "importer", "importer"
    )
    assert outcome == PublicationExpired(
        batch.id, "refresh_dependants", other if stamped_by_other else None
    )
    assert calls(tables) == []


def test_publishing_without_the_lease_is_refused(
    repo: BatchRepository, slices: SliceTable, tables: str
) -> None:
    recorder = Recorder(tables)
    recorder.fail["notify"] = 1
    publisher = make_publisher(tables, recorder=recorder)
    batch = committed(repo, slices)
    assert isinstance(publisher.publish_batch(batch.id, "importer", "w1"), PublicationFailed)
    before = calls(tables)
    with pytest.raises(LeaseLost):
        publisher.publish_batch(batch.id, "intruder", "x")
    assert calls(tables) == before
    assert statuses(OutboxRepository(tables), batch.id)["notify"] == "pending"


# -- retire_superseded -------------------------------------------------------------------------


def _digest(source_key: str, etag: str = "etag-1", version: str = "v1") -> str:
    """Staged names depend on key, etag and contract version, as normalizing's do."""
    return uuid.uuid5(uuid.NAMESPACE_URL, f"{source_key}\0{etag}\0{version}").hex


def _cache(
    repo: BatchRepository,
    staging: StagingArea,
    tmp: Path,
    key: str,
    *,
    rejects: bool = False,
    etag: str = "etag-1",
    version: str = "v1",
):
    def store(batch: Batch) -> None:
        source_key = f"s3://fleet-landing/{key}"
        digest = _digest(source_key, etag, version)
        local = tmp / f"{digest}.parquet"
        local.write_bytes(b"PAR1")
        output_uri = staging.put_file(local, f"normalized/trips/{digest}.parquet")
        details: dict[str, Any] = {}
        if rejects:
            local.with_suffix(".csv").write_text("file,line\n")
            details["rejects_uri"] = staging.put_file(
                local.with_suffix(".csv"), f"normalized/trips/{digest}.rejects.csv"
            )
        repo.store_cached_file(
            CachedFile(source_key, etag, version, "trips", output_uri, 3, 0, details), batch.id
        )

    return store


def _staged(staging_root: Path) -> set[str]:
    return {str(p.relative_to(staging_root)) for p in staging_root.rglob("*") if p.is_file()}


def _cached_keys(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        return {k for (k,) in conn.execute("SELECT source_key FROM normalized_files").fetchall()}


def test_retire_superseded_marks_the_previous_batch_and_deletes_only_what_it_alone_used(
    repo: BatchRepository,
    outbox: OutboxRepository,
    slices: SliceTable,
    tables: str,
    staging: StagingArea,
    tmp_path: Path,
) -> None:
    root = tmp_path / "staging"
    prefix = "acme/fleet/2026-07-22/"

    def cache_first(batch: Batch) -> None:
        _cache(repo, staging, tmp_path, prefix + "kept.csv")(batch)
        _cache(repo, staging, tmp_path, prefix + "gone.csv", rejects=True)(batch)

    publisher = make_publisher(tables, staging=staging)
    first = committed(
        repo,
        slices,
        key="d1",
        cache=cache_first,
        manifest_keys=(prefix + "kept.csv", prefix + "gone.csv"),
    )
    assert isinstance(publisher.publish_batch(first.id, "importer", "importer"), Published)
    # Another scope's batch, whose entry must survive.
    elsewhere = committed(
        repo,
        slices,
        folder="s3://fleet-landing/acme/fleet/2026-07-23/",
        cache=_cache(repo, staging, tmp_path, "acme/fleet/2026-07-23/x.csv"),
    )
    assert isinstance(publisher.publish_batch(elsewhere.id, "importer", "importer"), Published)
    files_before = _staged(root)
    assert len(files_before) == 4

    # The second delivery of the scope reuses kept.csv (a cache hit), drops gone.csv, adds new.csv.
    second = committed(
        repo,
        slices,
        key="d2",
        cache=_cache(repo, staging, tmp_path, prefix + "new.csv"),
        manifest_keys=(prefix + "kept.csv", prefix + "new.csv"),
    )
    assert outbox.previous_batch(second.id) == repo.get(first.id)
    assert isinstance(publisher.publish_batch(second.id, "importer", "importer"), Published)

    retired = repo.get(first.id)
    assert retired is not None and retired.status == BatchStatus.SUCCEEDED
    assert retired.details["superseded_by"] == str(second.id)
    assert "superseded_by" not in repo.get(second.id).details  # type: ignore[union-attr]
    assert "superseded_by" not in repo.get(elsewhere.id).details  # type: ignore[union-attr]
    assert _cached_keys(tables) == {
        f"s3://fleet-landing/{prefix}kept.csv",
        f"s3://fleet-landing/{prefix}new.csv",
        "s3://fleet-landing/acme/fleet/2026-07-23/x.csv",
    }
    gone = {name for name in files_before if name not in _staged(root)}
    digest = _digest(f"s3://fleet-landing/{prefix}gone.csv")
    assert gone == {f"normalized/trips/{digest}.parquet", f"normalized/trips/{digest}.rejects.csv"}

    # The next batch retires the second one, not the already superseded first.
    third = committed(repo, slices, key="d3", manifest_keys=(prefix + "new.csv",))
    assert outbox.previous_batch(third.id) == repo.get(second.id)
    assert isinstance(publisher.publish_batch(third.id, "importer", "importer"), Published)
    assert repo.get(second.id).details["superseded_by"] == str(third.id)  # type: ignore[union-attr]
    assert repo.get(first.id).details["superseded_by"] == str(second.id)  # type: ignore[union-attr]
    assert _cached_keys(tables) == {
        f"s3://fleet-landing/{prefix}new.csv",
        "s3://fleet-landing/acme/fleet/2026-07-23/x.csv",
    }


def test_mark_superseded_writes_only_a_succeeded_batch_of_the_same_scope_once(
    repo: BatchRepository, outbox: OutboxRepository, slices: SliceTable, tables: str
) -> None:
    publisher = make_publisher(tables)
    first = committed(repo, slices, key="d1", steps=())
    assert outbox.mark_superseded(first.id, uuid.uuid4()) is False  # running, and no such batch
    publisher.publish_batch(first.id, "importer", "importer")
    other_scope = committed(repo, slices, folder="s3://fleet-landing/acme/fleet/2026-07-23/")
    assert outbox.mark_superseded(first.id, other_scope.id) is False
    second = committed(repo, slices, key="d2", steps=())
    publisher.publish_batch(second.id, "importer", "importer")
    third = committed(repo, slices, key="d3")
    assert outbox.mark_superseded(second.id, first.id) is False  # an older batch cannot
    assert outbox.mark_superseded(first.id, second.id) is True
    assert outbox.mark_superseded(first.id, second.id) is True  # idempotent for a retry
    assert outbox.mark_superseded(first.id, third.id) is False  # set once
    assert repo.get(first.id).details["superseded_by"] == str(second.id)  # type: ignore[union-attr]
    assert outbox.previous_batch(third.id) == repo.get(second.id)


def test_retire_tolerates_a_retry_after_a_staging_failure(
    repo: BatchRepository,
    outbox: OutboxRepository,
    slices: SliceTable,
    tables: str,
    staging: StagingArea,
    tmp_path: Path,
) -> None:
    prefix = "acme/fleet/2026-07-22/"
    publisher = make_publisher(tables, staging=staging)
    first = committed(
        repo, slices, key="d1", cache=_cache(repo, staging, tmp_path, prefix + "a.csv")
    )
    publisher.publish_batch(first.id, "importer", "importer")
    second = committed(repo, slices, key="d2", manifest_keys=(prefix + "b.csv",))

    broken: list[list[str]] = []

    class FlakyStaging:
        def uri(self, name: str) -> str:
            return staging.uri(name)

        def delete(self, names: list[str]) -> None:
            if not broken:
                broken.append(names)
                raise OSError("staging unavailable")
            staging.delete(names)

    flaky = make_publisher(tables, staging=FlakyStaging())
    failed = flaky.publish_batch(second.id, "importer", "importer")
    assert isinstance(failed, PublicationFailed) and failed.step == "retire_superseded"
    assert "superseded_by" not in repo.get(first.id).details  # type: ignore[union-attr]
    assert _cached_keys(tables) == {f"s3://fleet-landing/{prefix}a.csv"}
    assert isinstance(flaky.publish_batch(second.id, "importer", "importer"), Published)
    assert repo.get(first.id).details["superseded_by"] == str(second.id)  # type: ignore[union-attr]
    assert _cached_keys(tables) == set()
    assert not any((tmp_path / "staging").rglob("*.parquet"))


def _failed_publication(
    repo: BatchRepository, slices: SliceTable, tables: str, **batch: Any
) -> Batch:
    """A committed batch whose notify step died: failed_publication, resumable until a newer
    batch replaces its slice."""
    recorder = Recorder(tables)
    recorder.fail["notify"] = -1
    publisher = make_publisher(tables, recorder=recorder, max_attempts=1)
    committed_batch = committed(repo, slices, **batch)
    outcome = publisher.publish_batch(committed_batch.id, "importer", "importer")
    assert isinstance(outcome, PublicationFailed) and outcome.dead
    publisher.mark_failed_publication(committed_batch.id, "importer", outcome)
    failed = repo.get(committed_batch.id)
    assert failed is not None and failed.status == BatchStatus.FAILED
    return failed


def test_retire_supersedes_every_earlier_failed_publication_and_retires_its_steps(
    repo: BatchRepository, outbox: OutboxRepository, slices: SliceTable, tables: str
) -> None:
    publisher = make_publisher(tables)
    succeeded = committed(repo, slices, key="d1")
    assert isinstance(publisher.publish_batch(succeeded.id, "importer", "importer"), Published)
    # A failed publication, then a UI retry of its run (same delivery key) failing again.
    older = _failed_publication(repo, slices, tables, key="d2")
    newer = _failed_publication(repo, slices, tables, key="d2")
    assert newer.id != older.id
    reserved = repo.reserve(Tenant.named("acme"), SCOPE, "d3")
    assert isinstance(reserved, Reserved)
    pre_commit = repo.mark_failed(reserved.batch.id, None, FailureKind.FAILED_PRE_COMMIT, "bad")
    elsewhere = _failed_publication(
        repo, slices, tables, key="d2", folder="s3://fleet-landing/acme/fleet/2026-07-23/"
    )
    latest = committed(repo, slices, key="d4")

    assert isinstance(publisher.publish_batch(latest.id, "importer", "importer"), Published)

    retired = {"refresh_dependants": "done", "notify": "retired", "retire_superseded": "retired"}
    for failed in (older, newer):
        now = repo.get(failed.id)
        assert now is not None and now.status == BatchStatus.FAILED
        assert now.details["superseded_by"] == str(latest.id)
        assert now.details["failure"] == failed.details["failure"]
        assert statuses(outbox, failed.id) == retired
        assert outbox.claim_next(failed.id, "drain", 60) is None
        assert outbox.reopen_dead_steps(failed.id) == 0
        refusal = repo.resume_publication(failed.id, SourceType.FLEET_S3, SCOPE)
        assert isinstance(refusal, NotResumable) and "superseded" in refusal.reason
    # The existing rule: the previous success is superseded too.
    assert repo.get(succeeded.id).details["superseded_by"] == str(latest.id)  # type: ignore[union-attr]
    # Neither a batch that never committed, another scope's batch, nor the new one itself.
    assert repo.get(pre_commit.id) == pre_commit
    assert repo.get(elsewhere.id) == elsewhere
    assert statuses(outbox, elsewhere.id)["notify"] == "dead"
    assert "superseded_by" not in repo.get(latest.id).details  # type: ignore[union-attr]
    # A retried retire step finds the same batches and changes nothing more.
    before = [repo.get(older.id), repo.get(newer.id)]
    assert sorted(outbox.supersede_failed_publications(latest.id)) == sorted([older.id, newer.id])
    assert statuses(outbox, older.id) == retired
    assert [repo.get(older.id).details, repo.get(newer.id).details] == [  # type: ignore[union-attr]
        b.details for b in before if b is not None
    ]


def test_retire_deletes_the_staged_files_of_superseded_failed_publications(
    repo: BatchRepository, slices: SliceTable, tables: str, staging: StagingArea, tmp_path: Path
) -> None:
    """A failed publication's normalized files go with it, whether or not a success came
    before it: with none before (nothing to mark superseded), and after one (newer than the
    success the new batch marks)."""
    prefix = "acme/fleet/2026-07-22/"
    root = tmp_path / "staging"
    publisher = make_publisher(tables, staging=staging)

    def delivery(key: str, name: str) -> dict[str, Any]:
        cache = _cache(repo, staging, tmp_path, prefix + name, rejects=True)
        return {"key": key, "cache": cache, "manifest_keys": (prefix + name,)}

    _failed_publication(repo, slices, tables, **delivery("d1", "a.csv"))
    second = committed(repo, slices, **delivery("d2", "b.csv"))
    assert isinstance(publisher.publish_batch(second.id, "importer", "importer"), Published)
    assert _cached_keys(tables) == {f"s3://fleet-landing/{prefix}b.csv"}
    assert len(_staged(root)) == 2

    _failed_publication(repo, slices, tables, **delivery("d3", "c.csv"))
    fourth = committed(repo, slices, **delivery("d4", "d.csv"))
    assert isinstance(publisher.publish_batch(fourth.id, "importer", "importer"), Published)
    assert repo.get(second.id).details["superseded_by"] == str(fourth.id)  # type: ignore[union-attr]
    assert _cached_keys(tables) == {f"s3://fleet-landing/{prefix}d.csv"}
    digest = _digest(f"s3://fleet-landing/{prefix}d.csv")
    assert _staged(root) == {
        f"normalized/trips/{digest}.parquet",
        f"normalized/trips/{digest}.rejects.csv",
    }


def test_retire_deletes_the_staged_files_of_content_the_slice_no_longer_holds(
    repo: BatchRepository, slices: SliceTable, tables: str, staging: StagingArea, tmp_path: Path
) -> None:
    """A file delivered again with other content (another etag), then read under another
    contract version: each time the replaced content's entry and files go, the loaded stay."""
    key = "acme/fleet/2026-07-22/trips.csv"
    source_key = f"s3://fleet-landing/{key}"
    publisher = make_publisher(tables, staging=staging)

    def deliver(delivery_key: str, etag: str, version: str) -> None:
        batch = committed(
            repo,
            slices,
            key=delivery_key,
            cache=_cache(repo, staging, tmp_path, key, rejects=True, etag=etag, version=version),
            manifest_objects=({"key": key, "etag": etag, "dataset": "trips"},),
            contract_versions={"trips": version},
        )
        assert isinstance(publisher.publish_batch(batch.id, "importer", "importer"), Published)
        with psycopg.connect(tables) as conn:
            cached = conn.execute("SELECT etag, contract_version FROM normalized_files").fetchall()
        assert cached == [(etag, version)]
        digest = _digest(source_key, etag, version)
        assert _staged(tmp_path / "staging") == {
            f"normalized/trips/{digest}.parquet",
            f"normalized/trips/{digest}.rejects.csv",
        }

    deliver("d1", "etag-1", "v1")
    deliver("d2", "etag-2", "v1")
    deliver("d3", "etag-2", "v2")


@pytest.fixture(autouse=True)
def _no_leftover_threads() -> Iterator[None]:
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        extra = [t for t in threading.enumerate() if t not in before and t.is_alive()]
        if not [t for t in extra if t.name.startswith("heartbeat-")]:
            return
        time.sleep(0.05)
    raise AssertionError("heartbeat threads outlived the drain")
