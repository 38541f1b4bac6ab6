"""Approve and rollback (issue #24) under real process deaths: a child worker approving a
held batch, or rolling a slice back (the core's calls, or the approve-held-batch /
rollback-slice flow), is killed with SIGKILL at a failpoint; the slice stays whole (the old
one or the new one, never a mix), and once its lease expired the same command from a
second worker finishes the job: one slice, published, nothing running. Killed after the
warehouse commit, the drain or `fleet-import resume` finishes it just as well: the held
batch is approved, the rollback told once, by the batch's own commit and publication."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from fleet_import.importing.context import Committed, Failed
from fleet_import.importing.driver import import_folder
from fleet_import.importing.guards import GuardOverride
from fleet_import.publication.decisions import APPROVED_EVENT, ROLLED_BACK_EVENT
from fleet_import.publication.retention import Retention, files_in_use
from fleet_import.scope import Tenant
from fleet_import.store.details import FailureKind
from fleet_import.store.models import BatchStatus
from fleet_import.store.repository import BatchRepository
from fleet_import.store.review_repository import ReviewRepository
from tests.reliability import soak_worker
from tests.reliability.conftest import (
    REPO,
    Source,
    connect,
    invariant_violations,
    loaded_then_replaced,
    on_path,
    outcome_of,
    read_events,
    run_once,
    running_batches,
    slice_differences,
    worker_env,
)

pytestmark = pytest.mark.crash  # `make test-crash`, in CI; not in `make test`
ACME = Tenant.named("acme")
_TTL = 1.5
_EXPIRY_MARGIN = 0.3
FAILPOINTS = [
    "after_lease",
    "after_normalized_file",
    "before_warehouse_commit",
    "after_warehouse_commit",
    "after_operational_commit",
    "before_mark_succeeded",
]


def held_or_replaced(
    ctx, s3, landing_bucket: str, action: str
) -> tuple[Source, Source, Source, uuid.UUID]:
    """Acme's folder loaded (d0), then a truncated redelivery (same names, far fewer rows):
    held (to approve), or loaded with its guard waived (to roll back). The old source, the
    slice's source before the action, the one after it, and the batch the action names."""
    old, short, first = loaded_then_replaced(ctx, s3, landing_bucket, trips=6, fuel=10, vehicles=6)
    if action == "approve":
        second = import_folder(ctx, ACME, short.folder, "d1")
        assert isinstance(second, Failed) and second.kind == FailureKind.HELD, second
        return old, old, short, second.batch_id
    waived = GuardOverride(waived=True, reason="test")
    second = import_folder(ctx, ACME, short.folder, "d1", guard=waived)
    assert isinstance(second, Committed) and second.published, second
    return old, short, old, first.batch_id


@pytest.mark.slow
@pytest.mark.parametrize("path", ["core", "flow"])
@pytest.mark.parametrize("action", ["approve", "rollback"])
@pytest.mark.parametrize("failpoint", FAILPOINTS)
def test_death_while_approving_or_rolling_back_then_the_rerun_finishes(
    action: str,
    failpoint: str,
    path: str,
    request: pytest.FixtureRequest,
    child_config: dict,
    database_url: str,
    warehouse,
    s3,
    landing_bucket: str,
) -> None:
    # The child runs the core's approve_held / rollback_slice, or the approve-held-batch /
    # rollback-slice flow (the same calls, each step a task) on the session's Prefect API.
    config = {**child_config, "ttl": _TTL, "tenant": "acme", "retain": True}
    config.update(on_path(path, request))
    repo = BatchRepository(database_url)
    ctx, _ = soak_worker.build({**config, "worker": "parent"})
    old, before, expected, target = held_or_replaced(ctx, s3, landing_bucket, action)
    command = {**config, "folder": old.folder, "key": "-", "action": action, "batch": str(target)}

    dead = run_once({**command, "worker": "a"}, f"{failpoint}=kill")
    assert dead.returncode == -signal.SIGKILL, (dead.returncode, dead.stdout, dead.stderr)
    with connect(database_url) as conn:  # whole: the old slice or the new, never a mix
        whole = [slice_differences(conn, source) for source in (before, expected)]
    assert [] in whole, whole
    assert invariant_violations(database_url) == []

    time.sleep(_TTL + _EXPIRY_MARGIN)
    rerun = outcome_of(run_once({**command, "worker": "b"}))
    assert rerun["outcome"] == "Committed" and rerun["published"], rerun
    owner = ctx.warehouse.slice_owner("acme", old.scope)
    assert str(owner) == rerun["batch_id"]
    with connect(database_url) as conn:
        assert slice_differences(conn, expected, owner) == []
    assert running_batches(database_url) == []
    assert invariant_violations(database_url, final=True) == []
    finished = repo.get(owner)
    assert finished.status == BatchStatus.SUCCEEDED
    if action == "approve":
        assert finished.details["approves"] == str(target)
        assert repo.get(target).details["review"]["batch_id"] == str(owner)
    else:
        assert finished.details["rolled_back_to"] == str(target)


@pytest.mark.slow
@pytest.mark.parametrize("finisher", ["drain", "resume"])
@pytest.mark.parametrize("action", ["approve", "rollback"])
def test_approve_or_rollback_killed_after_its_commit_is_settled_by_the_drain_or_resume(
    action: str,
    finisher: str,
    flow_env: str,
    child_config: dict,
    database_url: str,
    warehouse,
    s3,
    landing_bucket: str,
    staging_bucket: str,
) -> None:
    # Killed between the warehouse commit and its record: not the approve or rollback
    # command but whoever finishes the batch's publication settles the decision, once.
    config = {**child_config, "ttl": _TTL, "tenant": "acme", "retain": True, "path": "core"}
    repo = BatchRepository(database_url)
    ctx, _ = soak_worker.build({**config, "worker": "parent"})
    old, _, expected, target = held_or_replaced(ctx, s3, landing_bucket, action)
    command = {**config, "folder": old.folder, "key": "-", "action": action, "batch": str(target)}
    dead = run_once({**command, "worker": "a"}, "after_warehouse_commit=kill")
    assert dead.returncode == -signal.SIGKILL, (dead.returncode, dead.stdout, dead.stderr)
    ((killed, _, _),) = running_batches(database_url)
    assert ctx.warehouse.slice_owner("acme", old.scope) == killed
    with connect(database_url) as conn:
        assert slice_differences(conn, expected, killed) == []

    time.sleep(_TTL + _EXPIRY_MARGIN)
    if finisher == "drain":
        drained = outcome_of(run_once({**command, "action": "drain", "worker": "drain"}))
        assert [o["batch_id"] for o in drained["outcomes"]] == [str(killed)], drained
        told = read_events(Path(config["events"]))
    else:
        resumed = _fleet_import(database_url, "resume", str(killed))
        assert resumed.returncode == 0, (resumed.stdout, resumed.stderr)
        told = read_events(Path(config["events"])) + _prefect_events(killed, target, action)

    assert ctx.warehouse.slice_owner("acme", old.scope) == killed
    with connect(database_url) as conn:
        assert slice_differences(conn, expected, killed) == []
    assert running_batches(database_url) == []
    assert invariant_violations(database_url, final=True) == []
    assert repo.get(killed).status == BatchStatus.SUCCEEDED
    if action == "approve":
        review = repo.get(target).details["review"]
        assert (review["decision"], review["batch_id"]) == ("approved", str(killed))
        listed = _fleet_import(database_url, "batches", "list", "--status", "held", "--json")
        assert listed.returncode == 0 and json.loads(listed.stdout) == [], listed
        approvals = [e for e in told if e["event"] == APPROVED_EVENT]
        assert [(e["batch_id"], e["approved_by"]) for e in approvals] == [
            (str(target), str(killed))
        ]
    else:
        rollbacks = [e for e in told if e["event"] == ROLLED_BACK_EVENT]
        assert [(e["batch_id"], e["rolled_back_to"]) for e in rollbacks] == [
            (str(killed), str(target))
        ]
    assert retention_problems(database_url, s3, staging_bucket, killed) == []


def retention_problems(database_url: str, s3, staging_bucket: str, owner: uuid.UUID) -> list[str]:
    """Why the normalized files kept are not exactly those of the slice's owner and of the
    batches the retention keeps beside it (no decided held batch among them), or why a
    kept file's staged output is missing; empty when they are."""
    retention = Retention(ReviewRepository(database_url))
    repo = BatchRepository(database_url)
    kept = [*(files_in_use(repo.get(owner)) or []), *retention.files_kept(owner)]
    problems = [
        f"batch {b.id} is retained while held, though it was reviewed"
        for b in retention.reviews.retained_batches(owner, retention.keep_seconds)
        if b.details.get("review")
    ]
    with connect(database_url) as conn:
        entries = conn.execute(
            "SELECT source_key, etag, contract_version, output_uri FROM normalized_files"
        ).fetchall()
    for key, etag, version, uri in entries:
        if not any(
            f.source_key == key and f.etag in (None, etag) and f.contract_version in (None, version)
            for f in kept
        ):
            problems.append(f"{key} ({etag}) is kept, though no retained batch uses it")
        bucket, _, name = uri.removeprefix("s3://").partition("/")
        if bucket != staging_bucket or "Contents" not in s3.list_objects_v2(
            Bucket=bucket, Prefix=name
        ):
            problems.append(f"{key}: its staged output {uri} is gone")
    keys = {key for key, *_ in entries}
    problems += [
        f"{f.source_key} is retained, its entry is gone" for f in kept if f.source_key not in keys
    ]
    return problems


def _fleet_import(database_url: str, *args: str) -> subprocess.CompletedProcess:
    """The real command in a child process, on this test's services (flow_env)."""
    from prefect.settings import PREFECT_API_URL

    env = {
        **worker_env(),
        "PREFECT_API_URL": PREFECT_API_URL.value(),
        "FLEET_DATABASE_URL": database_url,
        "FLEET_LEASE_TTL_SECONDS": str(_TTL),
        "COLUMNS": "200",
    }
    env.pop("FLEET_FAILPOINTS")
    command = [sys.executable, "-m", "fleet_cli", *args]
    return subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=120)


def _prefect_events(batch_id: uuid.UUID, held: uuid.UUID, action: str) -> list[dict]:
    """The decision event the resumed batch told through Prefect, as the event file has it."""
    from tests.prefect_reads import batch_events

    name = APPROVED_EVENT if action == "approve" else ROLLED_BACK_EVENT
    about = held if action == "approve" else batch_id
    batch_events(batch_id, expected=1, name="fleet.slice.published")  # notify has run
    return [{"event": name, **e.payload} for e in batch_events(about, expected=1, name=name)]
