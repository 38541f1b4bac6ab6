"""`fleet-import run` (the import flow) SIGKILLed inside its slice transaction: after its
lease expired the next delivery of the folder, without a delivery key of its own, loads."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleet_import.sample_data import fleet_delivery, today_folder
from fleet_import.store.details import FailureKind
from fleet_import.store.models import BatchStatus
from fleet_import.store.repository import BatchRepository
from tests.helpers import upload
from tests.reliability.conftest import REPO, connect, invariant_violations

pytestmark = [pytest.mark.slow, pytest.mark.crash]  # a SIGKILLed run: make test-crash

_TTL = "2"
_WAIT_SECONDS = 120


@pytest.fixture
def api_env(flow_env: str) -> dict[str, str]:
    from prefect.settings import PREFECT_API_URL

    return {
        **os.environ,
        "PREFECT_API_URL": PREFECT_API_URL.value(),
        "FLEET_LEASE_TTL_SECONDS": _TTL,
        "PYTHONPATH": str(REPO),
        "COLUMNS": "200",
    }


def _run(env: dict[str, str], *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "fleet_cli", "run", "--tenant", "acme", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_killed_cli_run_does_not_block_the_next_delivery(
    flow_env: str, api_env: dict[str, str], s3, landing_bucket: str, tmp_path: Path
) -> None:
    repo = BatchRepository(flow_env)
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=400))
    held = _run(
        {**api_env, "FLEET_FAILPOINTS": f"after_staging_rows=wait:{tmp_path / 'x'}"}, folder
    )
    deadline = time.monotonic() + _WAIT_SECONDS
    while time.monotonic() < deadline:  # until it holds the scope inside its slice
        assert held.poll() is None, held.communicate()
        batches = repo.list()
        if batches and batches[0].details.get("warehouse_session"):
            break
        time.sleep(0.05)
    time.sleep(0.5)
    held.send_signal(signal.SIGKILL)
    held.communicate()
    (dead,) = repo.list()
    assert dead.status == BatchStatus.RUNNING

    upload(s3, folder, fleet_delivery(trips=500))  # a corrected delivery, new content
    time.sleep(float(_TTL) + 0.5)
    nxt = _run(api_env, folder)
    out, err = nxt.communicate(timeout=_WAIT_SECONDS)
    assert nxt.returncode == 0, out + err
    dead = repo.get(dead.id)
    assert dead.status == BatchStatus.FAILED
    assert dead.details["failure"]["kind"] == FailureKind.ABANDONED
    assert dead.details["failure"]["previous_owner"].startswith("flow-run:")
    (new,) = [b for b in repo.list() if b.id != dead.id]
    assert new.status == BatchStatus.SUCCEEDED and new.details["row_counts"]["trips"] > 0
    with connect(flow_env) as conn:
        assert conn.execute(
            "SELECT count(*) FROM ingestion_batches WHERE status = 'running'"
        ).fetchone() == (0,)
    assert invariant_violations(flow_env, final=True) == []
