"""Every failpoint, a real process death there, then the delivery again; the worker
processes run the core's import_folder or the import-s3-folder flow (the same driver).

Each case first loads an older delivery of the folder (batch d0), replaces the files, and
starts delivery d1 in a child worker (a Publisher with the default steps) that dies at the
failpoint. The same delivery is then retried at once (it must not steal a live lease) and,
after the lease expires, from a second worker process. Afterwards: d1 succeeded and owns
the slice, the slice is exactly the new source, d0 is superseded by d1, nothing runs, the
scope is free, and each publication step took effect once -- except a step whose effect
happened but whose completion was lost with the process, which runs exactly once more
(an outbox is at-least-once; its consumers dedupe on the batch id).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from fleet_import.importing.context import NotClaimed, NothingToDo, Skipped
from fleet_import.importing.driver import import_folder
from fleet_import.publication.publisher import BATCH_PUBLISHED_EVENT, DEFAULT_PUBLICATION_STEPS
from fleet_import.scope import Tenant
from fleet_import.store.details import FailureKind
from fleet_import.store.models import (
    BatchStatus,
    Reserved,
)
from fleet_import.store.outbox import OutboxRepository, StepStatus
from fleet_import.store.repository import BatchRepository
from tests.reliability import soak_worker
from tests.reliability.conftest import (
    KILLED,
    REFRESH_SQL,
    connect,
    create_refresh_table,
    invariant_violations,
    loaded_then_replaced,
    on_path,
    outcome_of,
    published_counts,
    read_events,
    refresh_count,
    run_once,
    running_batches,
    slice_differences,
)

pytestmark = pytest.mark.crash  # `make test-crash`, in CI; not in `make test`
ACME = Tenant.named("acme")
_TTL = 1.5
_EXPIRY_MARGIN = 0.3


@dataclass(frozen=True)
class Case:
    failpoint: str
    # What the death leaves: precommit (old slice, batch running), stamped (new slice,
    # commit not recorded), committed (recorded, publication open), succeeded.
    phase: str
    lease_held: bool = True
    # The step whose side effect happened but whose completion died with the process.
    repeated_step: str | None = None


_PRE = [
    "after_reserve",
    "after_lease",
    "mid_discovery",
    "after_normalized_file",
    "after_staging_rows",
    "before_warehouse_commit",
]
CASES = [
    *(Case(name, "precommit", lease_held=name != "after_reserve") for name in _PRE),
    Case("after_warehouse_commit", "stamped"),
    Case("after_operational_commit", "committed"),
    *(Case(f"in_step_{step}", "committed") for step in DEFAULT_PUBLICATION_STEPS),
    *(
        Case(f"after_step_{step}", "committed", repeated_step=step)
        for step in DEFAULT_PUBLICATION_STEPS
    ),
    Case("before_mark_succeeded", "committed"),
    Case("before_lease_release", "succeeded"),
]


def test_every_failpoint_in_the_code_is_in_the_matrix() -> None:
    """A failpoint added to the code without a crash case here fails this test. The matrix
    runs on PostgreSQL: the Redshift writer's own points are exercised through the emulator
    in tests/test_redshift_warehouse.py."""
    import re

    root = Path(__file__).resolve().parents[2] / "fleet_import"
    names: set[str] = set()
    for path in root.rglob("*.py"):
        if root / "warehouse" / "redshift" in path.parents:
            continue
        for match in re.finditer(r"failpoints\.hit\(\"([^\"]+)\"(, [^)]+)?\)", path.read_text()):
            name, detail = match.groups()
            if detail:  # a per-step point: expand it over the default steps
                names.update(name + step for step in DEFAULT_PUBLICATION_STEPS)
            else:
                names.add(name)
    assert names == {case.failpoint for case in CASES}


@pytest.mark.slow
@pytest.mark.parametrize("path", ["core", "flow"])
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.failpoint)
def test_death_at_failpoint_then_rerun_loses_and_repeats_nothing(
    case: Case,
    path: str,
    request: pytest.FixtureRequest,
    child_config: dict,
    database_url: str,
    warehouse,
    s3,
    landing_bucket: str,
) -> None:
    create_refresh_table(database_url)
    config = {
        **child_config,
        "ttl": _TTL,
        "refresh_sql": REFRESH_SQL,
        "tenant": "acme",
        # The worker processes run the import-s3-folder flow, or the core's import_folder:
        # one driver, so every failpoint is on both paths.
        **on_path(path, request),
    }
    events = Path(config["events"])
    repo = BatchRepository(database_url)
    outbox = OutboxRepository(database_url)
    ctx, _ = soak_worker.build({**config, "worker": "parent"})
    # Same names, new contents: a corrected re-delivery.
    old, new, first = loaded_then_replaced(ctx, s3, landing_bucket, trips=60, fuel=15, vehicles=8)

    # 1. The worker dies at the failpoint.
    dead = run_once({**config, "folder": new.folder, "key": "d1", "worker": "a"}, case.failpoint)
    assert dead.returncode == KILLED, (dead.returncode, dead.stdout, dead.stderr)
    (d1,) = [b for b in repo.list() if b.delivery_key == "d1"]
    stamp = ctx.warehouse.slice_owner("acme", new.scope)
    with connect(database_url) as conn:
        if case.phase == "precommit":
            assert d1.status == BatchStatus.RUNNING and not d1.details["warehouse_committed"]
            # Readers still see the whole old slice: nothing of d1 leaked.
            assert stamp == first.batch_id
            assert slice_differences(conn, old, first.batch_id) == []
        elif case.phase == "stamped":
            assert d1.status == BatchStatus.RUNNING and not d1.details["warehouse_committed"]
            assert stamp == d1.id and slice_differences(conn, new, d1.id) == []
        elif case.phase == "committed":
            assert d1.status == BatchStatus.RUNNING and d1.details["warehouse_committed"]
            assert stamp == d1.id and slice_differences(conn, new, d1.id) == []
        else:
            assert d1.status == BatchStatus.SUCCEEDED and stamp == d1.id
    assert invariant_violations(database_url) == []

    # 2. Retried at once: a live lease is never stolen, another delivery never gets in.
    if case.phase == "succeeded":
        assert isinstance(import_folder(ctx, ACME, new.folder, "d1"), NothingToDo)
    else:
        assert isinstance(import_folder(ctx, ACME, new.folder, "other"), Skipped)
    if case.phase != "succeeded" and case.lease_held:
        assert isinstance(import_folder(ctx, ACME, new.folder, "d1"), NotClaimed)

    # 3. After the lease (and any step claim) expired, a second worker process retries.
    time.sleep(_TTL + _EXPIRY_MARGIN)
    second = outcome_of(run_once({**config, "folder": new.folder, "key": "d1", "worker": "b"}))
    if case.phase == "succeeded":
        assert second["outcome"] == "NothingToDo", second
    else:
        assert second["outcome"] == "Committed" and second["published"], second
        assert second["batch_id"] == str(d1.id)  # the same batch continued, never a second
        assert second["recovered"] == (case.phase == "stamped")
    # A duplicate of the finished delivery does no work.
    assert isinstance(import_folder(ctx, ACME, new.folder, "d1"), NothingToDo)

    # 4. The end state.
    batches = {b.delivery_key: b for b in repo.list()}
    assert [b.delivery_key for b in repo.list() if b.delivery_key == "d1"] == ["d1"]
    d1 = repo.get(d1.id)
    assert d1.status == BatchStatus.SUCCEEDED, d1.details
    assert d1.details["phase"] == "published"
    assert batches["d0"].details.get("superseded_by") == str(d1.id)
    assert running_batches(database_url) == []
    assert ctx.warehouse.slice_owner("acme", new.scope) == d1.id
    with connect(database_url) as conn:
        assert slice_differences(conn, new, d1.id) == []
    assert invariant_violations(database_url, final=True) == []

    steps = outbox.steps(d1.id)
    assert [s.step for s in steps] == list(DEFAULT_PUBLICATION_STEPS)
    assert all(s.status == StepStatus.DONE for s in steps)

    # Side effects: d0's run once each, d1's once each except the repeated step.
    refreshes = 1 + (2 if case.repeated_step == "refresh_dependants" else 1)
    assert refresh_count(database_url) == refreshes
    notified = published_counts(events)
    assert notified[str(first.batch_id)] == 1
    assert notified[str(d1.id)] == (2 if case.repeated_step == "notify" else 1)
    batch_published = [
        e
        for e in read_events(events)
        if e["event"] == BATCH_PUBLISHED_EVENT and e["batch_id"] == str(d1.id)
    ]
    assert len(batch_published) == 1

    # 5. The scope is free: a new delivery reserves it at once.
    probe = repo.reserve(ACME, new.scope, "probe")
    assert isinstance(probe, Reserved), probe
    repo.mark_failed(probe.batch.id, None, FailureKind.ENQUEUE_FAILED, "probe")
