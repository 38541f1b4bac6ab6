"""A batch whose slice COMMIT got no answer and whose stamp could not be read back (the run
exits 7, CommitUnknown) is settled by the sweep, with no rerun of the folder: the sweep sees
its lease released and expired, starts an import of the folder (a deployment run, executed
as a process worker executes it), and that import settles the batch from the stamp.
Committed: the same batch succeeds, published once, nothing loaded again. Not committed (the
COMMIT never reached the warehouse): the sweep's import, the same delivery, takes the batch
over and loads the slice once."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from typing import Any

import pytest

from fleet_import.store.models import BatchStatus
from flows.reporting import ExitCode
from tests.faults.conftest import (
    AFTER_STAMP,
    LEASE_TTL_SECONDS,
    REPO,
    SLICE_COMMIT,
    batch_rows,
    recovered_invariants,
    run_cli,
)
from tests.faults.proxy import FaultProxy
from tests.reliability.conftest import Source, refresh_count

pytestmark = [pytest.mark.faults, pytest.mark.slow]

ENGINE_TIMEOUT_SECONDS = 150
QUICK_BOUNDS = {"FLEET_COMMIT_READBACK_SECONDS": "3", "FLEET_WAREHOUSE_REPLY_TIMEOUT_SECONDS": "3"}


def _sweep_and_run_its_import(
    env: dict[str, str], landing_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> Any:
    """One sweep of the landing bucket; the import run it started, executed; its final run."""
    from prefect.client.orchestration import get_client

    from flows.import_s3_folder import import_s3_folder
    from flows.sweep_landing_zone import sweep_landing_zone

    for name in ("FLEET_WAREHOUSE_URL", "FLEET_LEASE_TTL_SECONDS", "FLEET_REFRESH_SQL"):
        monkeypatch.setenv(name, env[name])
    name = f"import-{uuid.uuid4().hex[:8]}"
    import_s3_folder.to_deployment(name=name).apply()
    state = sweep_landing_zone(
        bucket=landing_bucket,
        deployment=f"import-s3-folder/{name}",
        lookback_days=0,
        return_state=True,
    )
    assert state.is_completed(), state.message
    assert state.result()["started"] == 1, state.result()
    with get_client(sync_client=True) as client:
        [scheduled] = [
            run
            for run in client.read_flow_runs()
            if run.deployment_id is not None and run.state is not None and run.state.is_scheduled()
        ]
    done = subprocess.run(
        [sys.executable, "-m", "prefect.engine", str(scheduled.id)],
        env={**os.environ, **env},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=ENGINE_TIMEOUT_SECONDS,
    )
    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(scheduled.id)
    assert flow_run.state is not None and flow_run.state.is_final(), done.stderr[-3000:]
    assert "Traceback" not in done.stdout + done.stderr, done.stderr[-3000:]
    return flow_run


@pytest.mark.parametrize("committed", [True, False], ids=["committed", "not-committed"])
def test_the_sweep_settles_a_commit_left_unknown(
    cli_env: dict[str, str],
    warehouse_proxy: FaultProxy,
    source: Source,
    s3: Any,
    landing_bucket: str,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    committed: bool,
) -> None:
    s3.put_object(Bucket=landing_bucket, Key=source.folder.split("/", 3)[3] + "_SUCCESS", Body=b"")
    if committed:  # the COMMIT went through; its answer is lost and the warehouse stays away
        warehouse_proxy.lose_reply(SLICE_COMMIT, after=AFTER_STAMP, then_refuse=600)
    else:  # the COMMIT never reaches the warehouse, nothing answers
        warehouse_proxy.black_hole_on(SLICE_COMMIT, after=AFTER_STAMP)
    run = run_cli({**cli_env, **QUICK_BOUNDS}, "run", "--tenant", "acme", source.folder)
    assert run.returncode == ExitCode.COMMIT_UNKNOWN, run.out
    assert not run.traceback, run.out
    [(batch_id, status, lease, details)] = batch_rows(database_url)
    assert status == BatchStatus.RUNNING and lease is None and "commit_unknown" in details
    warehouse_proxy.pass_through()  # the warehouse is back
    time.sleep(LEASE_TTL_SECONDS + 1)  # a released lease is abandoned after one TTL

    flow_run = _sweep_and_run_its_import(cli_env, landing_bucket, monkeypatch)

    rows = batch_rows(database_url)
    assert recovered_invariants(database_url, source) == []
    assert refresh_count(database_url) == 1  # published once
    if committed:
        [(settled_id, status, _lease, details)] = rows  # nothing loaded again
        assert settled_id == batch_id and status == BatchStatus.SUCCEEDED
        assert details["summary"]["recovered_from_stamp"] is True
        assert flow_run.state.name == "AlreadyLoaded", flow_run.state  # the sweep's delivery
    else:
        # Not stamped, so the sweep's import (the same delivery: the CLI keys a delivery by
        # its content, as the sweep does) takes the batch over and loads it, once.
        [(settled_id, status, _lease, details)] = rows
        assert settled_id == batch_id and status == BatchStatus.SUCCEEDED, details
        assert not details["summary"].get("recovered_from_stamp"), details
        assert flow_run.state.is_completed(), flow_run.state
