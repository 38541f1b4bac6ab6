"""Approve and rollback (issue #24) under real process deaths: a child worker approving a
held batch, or rolling a slice back (the core's calls, or the approve-held-batch /
rollback-slice flow), is killed with SIGKILL at a failpoint; the slice stays whole (the old
one or the new one, never a mix), and once its lease expired the same command from a
second worker finishes the job: one slice, published, nothing running."""

from __future__ import annotations

import signal
import time

import pytest

from fleet_import.importing.context import Committed, Failed
from fleet_import.importing.driver import import_folder
from fleet_import.importing.guards import GuardOverride
from fleet_import.scope import Tenant
from fleet_import.store.models import BatchStatus, FailureKind
from fleet_import.store.repository import BatchRepository
from tests.reliability import soak_worker
from tests.reliability.conftest import (
    connect,
    invariant_violations,
    loaded_then_replaced,
    on_path,
    outcome_of,
    run_once,
    running_batches,
    slice_differences,
)

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
    # Same names, far fewer rows: a truncated redelivery.
    old, short, first = loaded_then_replaced(ctx, s3, landing_bucket, trips=6, fuel=10, vehicles=6)
    if action == "approve":
        second = import_folder(ctx, ACME, short.folder, "d1")
        assert isinstance(second, Failed) and second.kind == FailureKind.HELD, second
        before, expected, target = old, short, second.batch_id
    else:
        waived = GuardOverride(waived=True, reason="test")
        second = import_folder(ctx, ACME, short.folder, "d1", guard=waived)
        assert isinstance(second, Committed) and second.published, second
        before, expected, target = short, old, first.batch_id
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
